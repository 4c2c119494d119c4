"""The peer-memory model: the loss probability, its formulas, and the simulator agreeing."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from mouthguard.plan.comparison import peer_figures
from mouthguard.plan.peers import PeerModel, all_copies_lost_probability
from mouthguard.plan.simulate import Scenario, simulate, simulate_run
from mouthguard.plan.strategies import PEERS


def _enumerated(n: int, r: int, f: int) -> float:
    """Every f-subset of n ring-placed domains; the share containing some rank's R holders."""
    windows = [{(d + i) % n for i in range(r)} for d in range(n)]
    subsets = list(itertools.combinations(range(n), f))
    return sum(any(w <= set(s) for w in windows) for s in subsets) / len(subsets)


@pytest.mark.parametrize("n", range(1, 10))
def test_formula_matches_enumeration(n: int) -> None:
    for r in range(1, n + 1):
        for f in range(n + 1):
            assert all_copies_lost_probability(n, r, f) == pytest.approx(_enumerated(n, r, f))


def test_two_copies_two_failed_domains_is_two_over_n_minus_one() -> None:
    for n in (3, 16, 2048):
        assert all_copies_lost_probability(n, 2, 2) == pytest.approx(2 / (n - 1))
    assert all_copies_lost_probability(2048, 2, 1) == 0.0  # one node never takes both copies
    assert all_copies_lost_probability(2048, 3, 2048) == 1.0  # the whole job takes all


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match=r"replication must be in 1\.\.4"):
        all_copies_lost_probability(4, 5, 1)
    with pytest.raises(ValueError, match="failed domains"):
        all_copies_lost_probability(4, 2, 5)
    with pytest.raises(ValueError, match="replication must be an integer"):
        PeerModel(replication=0)
    with pytest.raises(ValueError, match="durable_every"):
        PeerModel(durable_every=-1)
    with pytest.raises(ValueError, match="link_bytes_per_s"):
        PeerModel(link_bytes_per_s=0)


def _scenario(mode: str, **changes: float) -> Scenario:
    base = Scenario(
        work_seconds=30 * 86400,
        interval_seconds=1200,
        write_seconds=300,
        checkpoint_bytes=256e9,
        gpus=32,  # 4 domains of 8
        gpu_hour_usd=1,
        mtbf_seconds=24 * 3600,
        mode=mode,  # type: ignore[arg-type]
        snapshot_seconds=2,
        restart_seconds=60,
    )
    return dataclasses.replace(base, **changes)


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize(("failed", "every"), [(1, 10), (2, 4), (4, 3)])
def test_simulation_agrees_with_the_closed_form(mode: str, failed: int, every: int) -> None:
    sc = _scenario(mode)
    strategy = dataclasses.replace(
        PEERS, peers=PeerModel(failed_domains=failed, durable_every=every, link_bytes_per_s=1e9)
    )
    figures = peer_figures(sc, strategy)
    assert figures["loss_probability"] == pytest.approx({1: 0.0, 2: 2 / 3, 4: 1.0}[failed])
    r = simulate(sc, [strategy], runs=300)["peers"]
    simulated = r.lost_gpu_hours * 3600 / sc.gpus / r.failures
    expected = figures["expected_lost_seconds_per_failure"]
    assert isinstance(expected, float)
    # First order: failures are a little likelier early in a cycle, and the
    # durable period k(T + S) is not small next to the MTBF; within 4 %.
    assert simulated == pytest.approx(expected, rel=0.04)


def test_a_loss_rewinds_to_the_newest_durable_copy_that_landed() -> None:
    # Saves every 100 s of compute (free: nothing to copy), every 3rd durable
    # 10 s after it; one failure at 750 s. Saves 3 and 6 are durable (300, 610).
    sc = _scenario(
        "sync",
        checkpoint_bytes=0.0,
        interval_seconds=100,
        write_seconds=10,
        restart_seconds=0,
        mtbf_seconds=None,
        failure_times=(750.0,),
        work_seconds=1000,
    )
    kept = dataclasses.replace(PEERS, peers=PeerModel(failed_domains=1, durable_every=3))
    lost = dataclasses.replace(PEERS, peers=PeerModel(failed_domains=4, durable_every=3))
    assert simulate_run(sc, kept).lost_seconds == pytest.approx(50.0)  # from save 7, in peers
    assert simulate_run(sc, lost).lost_seconds == pytest.approx(150.0)  # from save 6, durable
    # Failing 5 s after save 6 finds it not yet durable: back to save 3.
    early = dataclasses.replace(sc, failure_times=(605.0,))
    assert simulate_run(early, lost).lost_seconds == pytest.approx(305.0)


def test_peer_figures_of_the_70b_preset() -> None:
    sc = _scenario(
        "sync", checkpoint_bytes=840e9, gpus=16_384, write_seconds=120, restart_seconds=300
    )
    f = peer_figures(sc, PEERS)
    assert f["domains"] == 2048 and f["loss_probability"] == 0.0
    assert f["save_seconds"] == pytest.approx(840e9 / 2048 / 25e9)  # one copy out per node
    assert f["recovery_from_peers_seconds"] == pytest.approx(300 + 840e9 / 2048 / 25e9)
    assert f["recovery_from_durable_seconds"] == pytest.approx(300 + 8.4)
    with pytest.raises(ValueError, match="no checkpoints in peer memory"):
        peer_figures(sc, dataclasses.replace(PEERS, peers=None))
