import pytest

from mouthguard.errors import KVCacheError
from mouthguard.kvcache.policy import LRU, S3FIFO, make_policy


def k(i: int) -> bytes:
    return i.to_bytes(16, "little")


def drain(policy, eligible=lambda key: True) -> list[int]:  # type: ignore[no-untyped-def]
    order = []
    while (victim := policy.pop_victim(eligible)) is not None:
        order.append(int.from_bytes(victim, "little"))
    return order


def test_lru_evicts_least_recently_used_and_skips_ineligible() -> None:
    lru = LRU()
    for i in range(4):
        lru.insert(k(i), 1)
    lru.hit(k(0))
    assert lru.pop_victim(lambda key: key != k(1)) == k(2)
    assert drain(lru) == [1, 3, 0]


def test_s3fifo_keeps_hot_keys_through_a_scan() -> None:
    capacity = 100
    hot = [k(i) for i in range(10)]

    def run(policy) -> set[bytes]:  # type: ignore[no-untyped-def]
        resident: set[bytes] = set()

        def access(key: bytes) -> None:
            if key in resident:
                policy.hit(key)
                return
            while len(resident) >= capacity:
                resident.discard(policy.pop_victim(lambda x: True))
            policy.insert(key, 1)
            resident.add(key)

        for _ in range(3):
            for key in hot:
                access(key)
        for i in range(1000, 1000 + 5 * capacity):  # a one-pass scan of cold keys
            access(k(i))
        return resident

    assert set(hot) <= run(S3FIFO(capacity))
    assert not set(hot) & run(LRU())  # the scan flushed every hot key out of LRU


def test_s3fifo_evicts_one_hit_wonders_first_and_respects_eligibility() -> None:
    policy = S3FIFO(10)
    for i in range(5):
        policy.insert(k(i), 1)
    policy.hit(k(0))
    victims = drain(policy, lambda key: key != k(3))
    assert victims[0] == 1
    assert 3 not in victims
    assert len(policy) == 1


def test_unknown_policy_is_refused() -> None:
    assert isinstance(make_policy("lru", 1), LRU)
    with pytest.raises(KVCacheError):
        make_policy("mru", 1)
