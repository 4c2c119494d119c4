"""Create-only PUTs settled after a lost reply: retried when transient, ours when the bytes are."""

from __future__ import annotations

import pytest

from mouthguard.errors import InvalidKeyError, ObjectExistsError, TierError
from mouthguard.tiers.s3.create import create_with_retries

PAYLOAD = memoryview(b"our bytes")


class _Server:
    """Fails the first ``failures`` sends the given way, then behaves like S3."""

    def __init__(self, failures: list[Exception], *, lands: bool) -> None:
        self.failures = failures
        self.lands = lands  # whether a failed send still stored our bytes
        self.stored: bytes | None = None
        self.sends = 0

    def send(self) -> str:
        self.sends += 1
        if self.failures:
            exc = self.failures.pop(0)
            if self.lands and not isinstance(exc, ObjectExistsError):
                self.stored = bytes(PAYLOAD)
            raise exc
        if self.stored is not None:
            raise ObjectExistsError("412 precondition failed")
        self.stored = bytes(PAYLOAD)
        return "etag"


def _create(server: _Server, retries: int = 3) -> str | None:
    return create_with_retries(
        server.send, lambda: server.stored, PAYLOAD, retries=retries, backoff=(0.001, 0.002)
    )


def test_a_transient_failure_before_the_write_is_retried() -> None:
    server = _Server([TierError("connection reset")], lands=False)
    assert _create(server) == "etag"
    assert server.sends == 2 and server.stored == bytes(PAYLOAD)


def test_a_lost_reply_whose_write_landed_is_our_success() -> None:
    server = _Server([TierError("reply lost")], lands=True)
    assert _create(server) is None  # the retry met a 412 over our own bytes
    assert server.sends == 2


def test_a_412_over_somebody_elses_bytes_is_a_refusal() -> None:
    server = _Server([], lands=False)
    server.stored = b"their bytes"
    with pytest.raises(ObjectExistsError):
        _create(server)


def test_a_412_over_a_prefix_of_our_bytes_is_still_a_refusal() -> None:
    server = _Server([], lands=False)
    server.stored = bytes(PAYLOAD)[:-1]
    with pytest.raises(ObjectExistsError):
        _create(server)


def test_retries_run_out_and_the_last_error_is_raised() -> None:
    server = _Server([TierError(f"reset {i}") for i in range(5)], lands=False)
    with pytest.raises(TierError, match="reset 2"):
        _create(server, retries=2)
    assert server.sends == 3


def test_permanent_errors_are_not_retried() -> None:
    server = _Server([InvalidKeyError("bad key")], lands=False)
    with pytest.raises(InvalidKeyError):
        _create(server)
    assert server.sends == 1
