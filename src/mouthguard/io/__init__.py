"""Moving bytes between a disk, host memory and a device, at the hardware's speed.

Two levels, kept apart by ``tests/test_layers.py``:

* below the tiers (``LocalTier`` and the KV disk tier build on them):
  :mod:`~mouthguard.io.pool` -- the process's one I/O thread pool, sized once;
  :mod:`~mouthguard.io.direct_write` -- the aligned, O_DIRECT, pipelined write of a
  stream, and the bounce buffers; :mod:`~mouthguard.io.direct_read` -- ranged
  O_DIRECT reads through those buffers;
* above the tiers (they read from any :class:`~mouthguard.tiers.base.Tier`; checkpoints
  and weights build on them): :mod:`~mouthguard.io.read_ahead` -- parallel ranged
  reads handed back in file order; :mod:`~mouthguard.io.host_ring` -- the ring of
  (pinned) host buffers between the disk and a device.

Nothing is imported here, so importing one low module never runs a high one
(which would import the tiers while a tier is still importing its I/O).
"""
