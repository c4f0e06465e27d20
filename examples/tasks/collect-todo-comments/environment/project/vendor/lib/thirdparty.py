# TODO: vendored code, must be ignored
