import pytest

from textkit import count_words, initials, is_palindrome, slugify, truncate


@pytest.mark.parametrize(
    "text, slug",
    [("Hello World", "hello-world"), ("  a  b ", "a-b"), ("x[1] y", "x1-y"), ("One", "one")],
)
def test_slugify(text, slug):
    assert slugify(text) == slug


def test_truncate_short():
    assert truncate("abc", 5) == "abc"


def test_truncate_long():
    assert truncate("abcdefghij", 6) == "abc..."


def test_truncate_exact():
    assert truncate("abcdef", 6) == "abcdef"


def test_count_words():
    assert count_words("a b A c") == {"a": 2, "b": 1, "c": 1}


@pytest.mark.parametrize("text", ["racecar", "A man a plan a canal Panama", "x"])
def test_palindrome(text):
    assert is_palindrome(text)


def test_not_palindrome():
    assert not is_palindrome("python")


def test_initials():
    assert initials("ada  lovelace") == "AL"
