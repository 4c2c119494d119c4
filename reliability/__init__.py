"""Reliability harnesses: kill loops, injected faults, fuzzing, tamper checks.

Each harness module ``reliability/<name>.py`` exposes ``run(level) -> HarnessResult``
(``level`` is ``"ci"``, bounded to seconds, or ``"soak"``, the long version).
``python -m reliability.run`` runs them all and writes the table in
``docs/reliability.md``; ``reliability/soak.sh`` runs the long versions.
"""
