"""The launcher a sandbox runs for the browser toolset: Chromium inside, its DevTools pipe to
the host's unix socket.

Standard library only and Python 3.6 syntax: it runs with the image's `python3`, passed
inline (`python3 -c SOURCE SOCKET CHROMIUM ARGS...`), so no file of the harness lands in the
sandbox. It connects to the socket the host listens on (in a folder the sandbox sees), starts
Chromium with `--remote-debugging-pipe` (Chromium reads commands on fd 3 and writes replies
on fd 4), prints one line (`ok PID`), points its output at /dev/null and pumps bytes both
ways. When either side ends, it kills Chromium's process group and exits. Chromium is a
process of the sandbox: it sees the sandbox's network and files only, and dies with it.
"""

import contextlib
import os
import signal
import socket
import sys
import threading


def _pump_in(sock, fd):
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                break
            os.write(fd, data)
    except OSError:
        pass


def _pump_out(fd, sock):
    try:
        while True:
            data = os.read(fd, 65536)
            if not data:
                break
            sock.sendall(data)
    except OSError:
        pass


def main(argv):
    path, binary = argv[1], argv[2]
    with contextlib.suppress(OSError):
        os.setsid()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    to_chrome_r, to_chrome_w = os.pipe()
    from_chrome_r, from_chrome_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.setpgid(0, 0)
        os.dup2(to_chrome_r, 3)
        os.dup2(from_chrome_w, 4)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.closerange(5, 65536)
        try:
            os.execv(binary, [binary, *argv[3:]])
        finally:
            os._exit(127)
    os.close(to_chrome_r)
    os.close(from_chrome_w)
    sys.stdout.write(f"ok {pid}\n")
    sys.stdout.flush()
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    inbound = threading.Thread(target=_pump_in, args=(sock, to_chrome_w))
    inbound.daemon = True
    inbound.start()
    outbound = threading.Thread(target=_pump_out, args=(from_chrome_r, sock))
    outbound.daemon = True
    outbound.start()
    while inbound.is_alive() and outbound.is_alive():
        inbound.join(0.5)
    with contextlib.suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        os.waitpid(pid, 0)
    with contextlib.suppress(OSError):
        sock.close()


if __name__ == "__main__":
    main(sys.argv)
