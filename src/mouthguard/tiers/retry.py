"""When a failed tier call is worth another try, and how long to wait before it.

One policy for every caller that retries tier operations itself: the S3 tier's
create-only PUT (which its client does not retry, :mod:`mouthguard.tiers.s3.create`)
and a dataset's ranged reads (:mod:`mouthguard.data.fetching.ranged`). A failure is
*transient* when it is a :class:`~mouthguard.errors.TierError` that a retry can
change -- an I/O error, a dropped connection, a 5xx, a timeout -- and *permanent*
when it cannot: an invalid key, a missing object, an operation the tier does
not have, or proven damage (:func:`~mouthguard.errors.is_data_damage`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from mouthguard.errors import (
    InvalidKeyError,
    ObjectNotFoundError,
    TierError,
    UnsupportedOperationError,
    is_data_damage,
)

#: Failures that a retry cannot change.
PERMANENT = (InvalidKeyError, ObjectNotFoundError, UnsupportedOperationError)


def is_transient(exc: BaseException) -> bool:
    """Whether another try of the call that raised ``exc`` may succeed."""
    return isinstance(exc, TierError) and not isinstance(exc, PERMANENT) and not is_data_damage(exc)


def backoff_delay(attempt: int, backoff: tuple[float, float]) -> float:
    """Seconds to wait before retry number ``attempt + 1`` (0-based ``attempt``).

    ``backoff`` is ``(initial, maximum)``: the delay doubles per retry up to the
    maximum, and is jittered down to half of it so that callers failing together
    do not retry together.
    """
    delay = min(backoff[1], backoff[0] * 2.0**attempt)
    return delay * random.uniform(0.5, 1.0)  # noqa: S311 - jitter, not crypto


@dataclass(frozen=True)
class RetryPolicy:
    """How often a transient failure is retried, and the backoff between tries.

    The longest a call can spend waiting is the sum of its backoff delays:
    with the defaults (3 retries, 0.05 s doubling) at most 0.35 s over 4 tries.

    Raises:
        ValueError: ``retries`` is negative or a delay is not positive.
    """

    retries: int = 3
    backoff_initial: float = 0.05
    backoff_max: float = 2.0

    def __post_init__(self) -> None:
        if self.retries < 0:
            raise ValueError(f"retries must be >= 0, got {self.retries}")
        if not (0 < self.backoff_initial <= self.backoff_max):
            raise ValueError("backoff delays must be positive, the initial one at most the max")

    def delay(self, attempt: int) -> float:
        """Seconds to wait before retry number ``attempt + 1`` (see :func:`backoff_delay`)."""
        return backoff_delay(attempt, (self.backoff_initial, self.backoff_max))
