"""``mouthguard simulate`` through its own parser: JSON shape, table, plot, bad input."""

from __future__ import annotations

import argparse
import io
import json
import sys
from pathlib import Path

import pytest
from rich.console import Console

from mouthguard.cli import simulate
from mouthguard.cli.common import EXIT_USAGE
from mouthguard.cli.main import main
from mouthguard.plan.sweep import SWEEP_POINTS


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mouthguard")
    simulate.add_parser(parser.add_subparsers(dest="command"))
    return parser


def _run(*argv: str) -> tuple[int, str]:
    args = _parser().parse_args(["simulate", *argv])
    out = io.StringIO()
    code = simulate.run(args, Console(file=out, width=200))
    return code, out.getvalue()


def test_json_has_the_promised_shape() -> None:
    code, out = _run("--runs", "20", "--json")
    assert code == 0
    data = json.loads(out)
    assert list(data["policies"]) == ["importance", "temperature", "flat", "peers"]
    for figures in data["policies"].values():
        for key in ("cost_usd", "lost_gpu_hours", "goodput"):
            assert isinstance(figures[key], float)
        assert 0 < figures["goodput"] < 1
    assert data["scenario"]["gpus"] == 16_384 and data["scenario"]["checkpoint_bytes"] == 840e9
    assert data["analytic"]["expected_lost_seconds_per_failure"] > 0
    assert data["plot"] is None
    # corruption and demotion cost money: temperature loses the most
    policies = data["policies"]
    assert policies["importance"]["cost_usd"] < policies["temperature"]["cost_usd"]


def test_same_seed_same_answer_and_a_failure_list() -> None:
    argv = ("--runs", "5", "--seed", "3", "--json", "--failure-times-hours", "10,30.5,31")
    first, second = _run(*argv), _run(*argv)
    assert first == second
    flat = json.loads(first[1])["policies"]["flat"]
    assert flat["failures"] == 3.0


def test_table_by_default() -> None:
    code, out = _run("--runs", "5", "--preset", "7b", "--gpus", "512", "--mode", "async")
    assert code == 0
    assert all(name in out for name in ("importance", "temperature", "flat", "goodput"))


def test_plot_is_written_and_reported(tmp_path: Path) -> None:
    png = tmp_path / "cost.png"
    code, out = _run("--runs", "3", "--json", "--plot", str(png))
    assert code == 0 and png.stat().st_size > 20_000
    plot = json.loads(out)["plot"]
    assert plot["path"] == str(png)
    assert set(plot["optimal_interval_seconds"]) == {"importance", "temperature", "flat", "peers"}
    # The storage strategies' SWEEP_POINTS, extended down to peer memory's optimum.
    grid = plot["intervals_seconds"]
    assert len(grid) > SWEEP_POINTS and grid == sorted(grid)
    assert grid[0] <= plot["optimal_interval_seconds"]["peers"] < grid[-1]


@pytest.mark.parametrize(
    "argv",
    [
        ("--preset", "nonsense"),
        ("--preset", "123B"),  # a bare parameter count names no GPU count
        ("--mtbf-hours", "0.01", "--runs", "1"),  # cannot finish: refused, not a hang
    ],
)
def test_bad_input_exits_2(argv: tuple[str, ...], capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _run(*argv)
    assert code == 2 and out == ""
    assert "error:" in capsys.readouterr().err


def test_unwritable_plot_exits_2(tmp_path: Path) -> None:
    code, _ = _run("--runs", "1", "--plot", str(tmp_path / "missing" / "x.png"))
    assert code == 2


@pytest.mark.parametrize(("suffix", "magic"), [(".svg", b"<?xml"), (".pdf", b"%PDF")])
def test_plot_is_written_in_the_format_its_suffix_names(
    tmp_path: Path, suffix: str, magic: bytes
) -> None:
    path = tmp_path / f"cost{suffix}"
    code, _ = _run("--runs", "1", "--json", "--plot", str(path))
    assert code == 0 and path.read_bytes().startswith(magic)


@pytest.mark.parametrize("name", ["cost.txt", "cost"])
def test_a_plot_suffix_that_names_no_image_format_is_refused(
    tmp_path: Path, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out = _run("--runs", "1", "--plot", str(tmp_path / name))
    assert code == 2 and out == ""
    assert f"{name}: name a .png, .svg or .pdf file" in capsys.readouterr().err
    assert not (tmp_path / name).exists()


def test_the_model_may_be_positional_as_in_plan() -> None:
    args = _parser().parse_args(["simulate", "llama3-405b", "--runs", "1"])
    assert args.preset == "llama3-405b"
    assert _parser().parse_args(["simulate"]).preset == simulate.DEFAULT_PRESET


@pytest.mark.parametrize(
    "argv",
    [
        ("--runs", "0"),
        ("--corruption-probability", "1.5"),
        ("--failure-times-hours", "soon"),
        ("--interval-seconds", "-5"),
        ("--mtbf-hours", "10", "--failure-times-hours", "3"),
    ],
)
def test_malformed_arguments_exit_2(argv: tuple[str, ...]) -> None:
    with pytest.raises(SystemExit) as exc:
        _parser().parse_args(["simulate", *argv])
    assert exc.value.code == 2


def test_plot_without_matplotlib_names_the_extra(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """matplotlib is an optional extra: --plot without it is one line and exit 2, at once."""
    # As if it were not installed: None in sys.modules makes every import of it fail,
    # and nothing imported from it before may be found cached.
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.delitem(sys.modules, "mouthguard.plan.plot", raising=False)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    # Without --plot nothing needs it.
    assert main(["simulate", "--runs", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["plot"] is None
    simulated: list[object] = []
    monkeypatch.setattr("mouthguard.cli.simulate.simulate", lambda *a, **k: simulated.append(a))
    png = tmp_path / "cost.png"
    assert main(["simulate", "--runs", "1", "--plot", str(png)]) == EXIT_USAGE
    out, err = capsys.readouterr()
    assert out == "" and not png.exists() and simulated == []  # refused before simulating
    assert err == (
        "error: --plot needs matplotlib, an optional extra: pip install 'mouthguard[plot]'\n"
    )


def test_peer_options_change_the_peers_strategy() -> None:
    code, out = _run("--runs", "5", "--json", "--peer-failed-domains", "2")
    assert code == 0
    peers = json.loads(out)["peers"]
    assert (peers["domains"], peers["replication"], peers["failed_domains"]) == (2048, 2, 2)
    assert peers["loss_probability"] == pytest.approx(2 / 2047)
    code, out = _run("--runs", "5", "--json", "--peer-failed-domains", "2048")
    whole_job = json.loads(out)
    assert whole_job["peers"]["loss_probability"] == 1.0  # every failure goes back to disk
    assert whole_job["policies"]["peers"]["lost_gpu_hours"] > 0
    code, out = _run("--runs", "5", "--peer-durable-every", "5", "--peer-link-bandwidth", "50G")
    assert code == 0
    text = " ".join(out.split())
    assert "peers: 2 copies over 2,048 domains" in text and "(every 5 saves)" in text


def test_too_few_domains_for_the_copies() -> None:
    # 8 GPUs are one node: the default peers strategy is left out, saying why ...
    code, out = _run("--runs", "5", "--preset", "7b", "--gpus", "8", "--json")
    data = json.loads(out)
    assert code == 0 and list(data["policies"]) == ["importance", "temperature", "flat"]
    assert "replication must be in 1..1" in data["peers"]["skipped"]
    # ... and asked for explicitly, it is an error.
    code, _ = _run("--runs", "5", "--gpus", "16", "--peer-replication", "3")
    assert code == EXIT_USAGE
