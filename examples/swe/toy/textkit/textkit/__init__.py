"""Text helpers."""


def slugify(text):
    """Lower-case words joined by dashes."""
    words = []
    for word in text.split():
        cleaned = "".join(ch for ch in word.lower() if ch.isalnum())
        if cleaned:
            words.append(cleaned)
    return "-".join(words)


def truncate(text, width, suffix="..."):
    if len(text) <= width:
        return text
    return text[: width - len(suffix)] + suffix


def count_words(text):
    counts = {}
    for word in text.lower().split():
        counts[word] = counts.get(word, 0) + 1
    return counts


def is_palindrome(text):
    letters = [ch.lower() for ch in text if ch.isalnum()]
    return letters == letters[::-1]


def initials(name):
    parts = [p for p in name.split() if p]
    return "".join(p[0].upper() for p in parts)
