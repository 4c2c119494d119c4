"""Imported by the fork server of dataset workers before it forks any of them.

Everything a DataLoader worker of an S3 dataset needs before its first sample is
done here once, in the fork server (a clean process that never touches S3), and
inherited by every worker it forks: torch and the reader's modules imported,
and botocore's S3 models loaded (:func:`~mouthguard.tiers.s3.warm_up`),
which a worker's first S3 client would otherwise read from disk, about 0.2 s per
worker per epoch. Importing this module anywhere else is harmless but pointless.
"""

from __future__ import annotations

import mouthguard.data.loading.stream  # noqa: F401 - the reader, torch with it
from mouthguard.tiers.s3 import warm_up

warm_up()
