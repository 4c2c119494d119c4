"""What every command shares (:mod:`mouthguard.cli.common`): error lines and argument types."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from mouthguard.cli import common
from mouthguard.cli.main import main


def test_an_error_is_one_line_of_text_not_markup(capsys: pytest.CaptureFixture[str]) -> None:
    common.print_error("[policy] must be a table, see [/etc]")
    assert capsys.readouterr().err == "error: [policy] must be a table, see [/etc]\n"


def test_a_hint_follows_the_error_line(capsys: pytest.CaptureFixture[str]) -> None:
    common.print_error("no", hint="run 'mouthguard --help' for usage")
    assert capsys.readouterr().err == "error: no\nrun 'mouthguard --help' for usage\n"


def test_a_configuration_error_keeps_its_brackets(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "mouthguard.toml"
    config.write_text("")
    assert main(["--store", str(config), "ls"]) == common.EXIT_USAGE
    err = capsys.readouterr().err
    assert err == f"error: {config}: at least one [[tiers]] entry is required\n"


def test_an_argument_error_exits_2_with_a_pointer_to_help(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = common.Parser(prog="mouthguard demo")
    parser.add_argument("--rounds", type=common.COUNT)
    with pytest.raises(SystemExit) as exc:
        parser.parse_args(["--rounds", "0"])
    assert exc.value.code == common.EXIT_USAGE
    assert capsys.readouterr().err == (
        "error: argument --rounds: must be an integer >= 1: '0'\n"
        "run 'mouthguard demo --help' for usage\n"
    )


@pytest.mark.parametrize(
    ("kind", "text", "message"),
    [
        (common.COUNT, "x", "must be an integer >= 1: 'x'"),
        (common.NON_NEGATIVE_INT, "-1", "must be an integer >= 0: '-1'"),
        (common.POSITIVE, "0", "must be > 0: '0'"),
        (common.PROBABILITY, "1.5", "must be >= 0 and <= 1: '1.5'"),
        (common.BYTES, "nan", "not a number: 'nan'"),
        (common.NON_NEGATIVE, "5G", "not a number: '5G'"),  # units only where asked for
        (common.failure_hours, " , ", "give at least one failure time, e.g. 3,17.5"),
        (common.failure_hours, "3,soon", "not a number: 'soon'"),
    ],
)
def test_argument_types_word_their_errors_for_people(kind: object, text: str, message: str) -> None:
    assert callable(kind)
    with pytest.raises(argparse.ArgumentTypeError, match="^" + message.replace(".", r"\.")):
        kind(text)


def test_argument_types_accept_what_they_promise() -> None:
    assert common.BYTES("30.72TB") == pytest.approx(30.72e12)
    assert common.BYTES("25GB/s") == 25e9
    assert common.failure_hours("17.5, 3") == (3 * 3600.0, 17.5 * 3600.0)
    assert common.checked(int)("7") == 7
    with pytest.raises(argparse.ArgumentTypeError, match="invalid literal"):
        common.checked(int)("seven")


def test_exit_codes_keep_their_numbers() -> None:
    # Scripts depend on these: they are documented in --help and the README.
    assert (common.EXIT_OK, common.EXIT_FAILED, common.EXIT_USAGE) == (0, 1, 2)
    assert (common.EXIT_INTERRUPTED, common.EXIT_BROKEN_PIPE) == (130, 141)
