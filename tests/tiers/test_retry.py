"""The retry policy shared by the tiers' own retries and the dataset's ranged reads."""

from __future__ import annotations

import pytest

from mouthguard.errors import (
    InvalidKeyError,
    ObjectNotFoundError,
    ShardDamagedError,
    TierError,
    UnsupportedOperationError,
)
from mouthguard.tiers.faults import InjectedFaultError
from mouthguard.tiers.retry import RetryPolicy, backoff_delay, is_transient


def test_what_a_retry_may_change() -> None:
    assert is_transient(TierError("connection reset"))
    assert is_transient(InjectedFaultError("injected I/O error"))
    for permanent in (
        ObjectNotFoundError("gone"),
        InvalidKeyError("bad key"),
        UnsupportedOperationError("no such operation"),
        ShardDamagedError("sha256 does not match", shard="s"),
        ValueError("a bug, not the storage"),
    ):
        assert not is_transient(permanent), permanent


@pytest.mark.parametrize("attempt", range(10))
def test_the_backoff_doubles_up_to_the_maximum_with_jitter_down_to_half(attempt: int) -> None:
    full = min(2.0, 0.05 * 2**attempt)
    for _ in range(20):
        assert full / 2 <= backoff_delay(attempt, (0.05, 2.0)) <= full
        assert full / 2 <= RetryPolicy().delay(attempt) <= full


def test_a_policy_out_of_range_is_refused() -> None:
    with pytest.raises(ValueError, match="retries"):
        RetryPolicy(retries=-1)
    with pytest.raises(ValueError, match="backoff"):
        RetryPolicy(backoff_initial=0)
    with pytest.raises(ValueError, match="backoff"):
        RetryPolicy(backoff_initial=3.0, backoff_max=2.0)
