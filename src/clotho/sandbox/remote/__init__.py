"""Backends on hosted sandboxes with N slots each: Modal and Nomad (extras `modal`, `nomad`).

`slots.py` is the pool logic they share (scale up, warm minimum, scale-down and lifetime
that never end a host under an acquired slot); `slot_sandbox.py` is a slot as a `Sandbox`
over any way of running a script on the host; each vendor lives behind a thin adapter.
"""
