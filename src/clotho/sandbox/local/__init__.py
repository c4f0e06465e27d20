"""The local backends: bubblewrap (`bwrap.py`) and unsafe-local (`unsafe_local.py`) on this
host, with their limits, verification in fresh processes and network guard; `backend.py`
holds the backends their configs name."""
