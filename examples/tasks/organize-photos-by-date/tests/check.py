"""Verifier for organize-photos-by-date."""
import os
import sys

ORIGINALS = [
    "IMG_20230514_123000.jpg", "IMG_20230514_090102.jpg", "IMG_20221231_235959.JPG",
    "VID_20230102_101010.mp4", "IMG_20230601_000001.jpeg", "IMG_20230103_081500.png",
    "VID_20221231_120000.MP4", "notes.txt", "IMG_2023_0514.jpg", "DSC_20230514_123000.jpg",
    "IMG_20230514_1230.jpg", "holiday photo.jpg", "IMG_20230514_123000.jpg.bak",
]
EXPECTED = {
    "2023/05/2023-05-14_12-30-00.jpg": "IMG_20230514_123000.jpg",
    "2023/05/2023-05-14_09-01-02.jpg": "IMG_20230514_090102.jpg",
    "2022/12/2022-12-31_23-59-59.jpg": "IMG_20221231_235959.JPG",
    "2023/01/2023-01-02_10-10-10.mp4": "VID_20230102_101010.mp4",
    "2023/06/2023-06-01_00-00-01.jpeg": "IMG_20230601_000001.jpeg",
    "2023/01/2023-01-03_08-15-00.png": "IMG_20230103_081500.png",
    "2022/12/2022-12-31_12-00-00.mp4": "VID_20221231_120000.MP4",
}
for name in ORIGINALS:
    if name not in EXPECTED.values():
        EXPECTED["other/" + name] = name


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


if not os.path.isdir("/app/inbox"):
    fail("/app/inbox must still exist")
left = os.listdir("/app/inbox")
if left:
    fail(f"/app/inbox is not empty: {sorted(left)}")
if not os.path.isdir("/app/sorted"):
    fail("/app/sorted does not exist")

found = set()
for root, dirs, files in os.walk("/app/sorted"):
    for f in files:
        found.add(os.path.relpath(os.path.join(root, f), "/app/sorted"))
missing = sorted(set(EXPECTED) - found)
extra = sorted(found - set(EXPECTED))
if missing:
    fail(f"missing files in /app/sorted: {missing}")
if extra:
    fail(f"unexpected files in /app/sorted: {extra}")
for rel, orig in EXPECTED.items():
    with open(os.path.join("/app/sorted", rel), encoding="utf-8", errors="replace") as fh:
        data = fh.read()
    if data != f"fake media payload for {orig}\n":
        fail(f"content of {rel} does not match original file {orig}")
print("PASS")
