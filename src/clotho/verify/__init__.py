"""Verification below the task formats: what every verifier checks before it trusts the world
its tests run in, whatever the format (a Harbor task's `tasks/verify.py`, a SWE instance's
`swe/verify.py`).

- `integrity.py`: the programs' baseline (`ProgramDigests`), the world the tests run in
  (`verification_world`), the agent stopped and the runner checked (`stop_and_check`,
  `check_programs`, `check_changes`), links landing where the harness writes
  (`check_links`), the agent's bytecode removed, harness commands in fresh processes.
- `runner_rules.py`: what the tests' runner relies on, judged from the backend's list of
  changes.
- `loader_rules.py`: the dynamic loader's choices: no library of the agent's named like one of
  the image's, and the agent's loader cache never used.

It imports only `errors` and the sandbox contract (`sandbox.base`, `sandbox.config`): never a
task format.
"""
