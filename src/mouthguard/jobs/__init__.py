"""Background jobs: replication with read-back, scrubbing, retention through the trash.

Jobs only ever *move copies between tiers*; what to keep where is decided by the
pure functions of :mod:`mouthguard.policy`. They are burst-aware: while a save is
in flight or announced, they yield the disk to it.
"""
