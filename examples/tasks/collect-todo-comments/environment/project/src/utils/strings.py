def clean(s):
    # FIXME:   strip unicode whitespace too   
    return s.strip()


def shout(s):
    return s.upper()
