"""Create-only single PUTs that survive a lost reply.

A create-only PUT (``If-None-Match: *``) is not idempotent, so the S3 client
does not retry it after a connection reset or a timeout -- and when a retry is
made after the first request *did* land, the server answers 412 and our own
create looks like someone else's. Both were found with the fault proxy in
``tests/s3/fault_proxy.py``: a save failed, or was reported as lost to "another
writer", although its objects were committed with our bytes.

:func:`create_with_retries` settles it with what the caller still holds -- the
payload: transient failures are retried with backoff, and a 412 counts as our
own success exactly when the stored object holds our bytes, byte for byte.
(Another writer's byte-identical object is, for every reader, the same thing.)
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from mouthguard.errors import (
    InvalidKeyError,
    ObjectExistsError,
    ObjectNotFoundError,
    TierError,
    UnsupportedOperationError,
)

T = TypeVar("T")

#: Failures that a retry cannot change.
_PERMANENT = (InvalidKeyError, ObjectNotFoundError, UnsupportedOperationError)


def create_with_retries(
    send: Callable[[], T],
    stored: Callable[[], bytes | None],
    payload: memoryview,
    *,
    retries: int,
    backoff: tuple[float, float],
) -> T | None:
    """Run the create ``send`` until it succeeds, is refused for good, or retries run out.

    Args:
        send: one create-only PUT of ``payload``; raises TierError subclasses
            (``ObjectExistsError`` for a refused create).
        stored: the object's current bytes, or None if there is none.
        payload: exactly what ``send`` sends.
        retries: how many times a transient failure is retried.
        backoff: ``(initial, maximum)`` delay in seconds, doubled per retry, jittered.

    Returns:
        ``send``'s result, or None when an earlier attempt turned out to have landed.

    Raises:
        ObjectExistsError: the key holds somebody else's bytes.
        TierError: the last failure, once retries are exhausted.
    """
    attempt = 0
    while True:
        try:
            return send()
        except ObjectExistsError:
            if _holds(stored, payload):
                return None  # our own earlier attempt landed; its reply was lost
            raise
        except _PERMANENT:
            raise
        except TierError:
            if attempt >= retries:
                raise
            delay = min(backoff[1], backoff[0] * 2**attempt)
            time.sleep(delay * random.uniform(0.5, 1.0))  # noqa: S311 - jitter, not crypto
            attempt += 1


def _holds(stored: Callable[[], bytes | None], payload: memoryview) -> bool:
    try:
        current = stored()
    except TierError:
        return False  # cannot tell: the refusal stands
    return current is not None and len(current) == payload.nbytes and current == payload
