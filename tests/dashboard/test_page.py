"""The page as a real headless chromium renders it: what an operator sees."""

from __future__ import annotations

from pathlib import Path

import pytest

import mouthguard
from mouthguard.checkpoint.audit import default_actor
from tests.dashboard.helpers import (
    TOKEN,
    Element,
    Served,
    browse,
    by_id,
    find_all,
    parse_dom,
    serving,
)

pytestmark = pytest.mark.slow  # starts a browser


@pytest.fixture(scope="module")
def page(served: Served, tmp_path_factory: pytest.TempPathFactory) -> Element:
    profile = tmp_path_factory.mktemp("chromium")
    dom = parse_dom(browse(served.url + "/", profile, "--dump-dom").stdout)
    (body,) = find_all(dom, "body")
    assert body.attrs["data-loaded"] == "true"  # the script ran to the end
    return dom


def _cells(row: Element) -> list[str]:
    return [cell.text.strip() for cell in find_all(row, "td")]


def test_no_error_is_shown(page: Element) -> None:
    assert "hidden" in by_id(page, "error").attrs


def test_checkpoint_rows(page: Element) -> None:
    rows = find_all(by_id(page, "checkpoints"), "tr", data_run="alpha")
    assert [r.attrs["data-step"] for r in rows] == ["30", "20", "10"]  # newest first
    by_step = {r.attrs["data-step"]: r for r in rows}
    held = _cells(by_step["20"])
    assert held[2] == "milestone" and held[3].startswith("protected held")
    assert held[3].endswith("last: hold by " + default_actor())  # the audit trail's latest act
    copies = find_all(by_step["20"], "span", data_tier="durable")
    assert copies[0].attrs["class"] == "copy verified"
    assert "verified" in copies[0].attrs["title"]
    fresh = _cells(by_step["30"])
    assert fresh[3].startswith("committed") and fresh[4] == "fast"
    # A suspect checkpoint says so, with its reason, in the table itself.
    states = [s.text for s in find_all(by_step["30"], "span") if "state" in s.attrs["class"]]
    assert states == ["committed", "suspect"]
    (reason,) = find_all(by_step["30"], "div", **{"class": "reason"})
    assert reason.text == "the loss is NaN"
    assert fresh[6].endswith("ms") and fresh[8].endswith("/s")  # stall, throughput
    damaged = find_all(by_id(page, "checkpoints"), "tr", data_run="beta", data_step="5")
    (fast,) = find_all(damaged[0], "span", data_tier="fast")
    assert fast.attrs["class"] == "copy damaged" and "damaged:" in fast.attrs["title"]


def test_summary_cards_show_the_api_counts(page: Element, served: Served) -> None:
    cards = {
        c.attrs["data-card"]: c.text
        for c in find_all(by_id(page, "cards"), "div")
        if "data-card" in c.attrs
    }
    counts = served.json("/api/summary")["by_state"]
    assert cards["checkpoints"] == "8checkpoints"
    assert cards["protected"] == f"{counts['protected']}protected"
    assert (
        cards["not yet protected"] == f"{counts['committed'] + counts['verified']}not yet protected"
    )
    assert cards["damaged"] == "0damaged"  # beta 5 keeps an intact copy on durable
    tier = find_all(by_id(page, "cards"), "div", data_card="tier fast")[0]
    assert tier.text.startswith("local-fast (fast)tier fast")
    (health,) = find_all(tier, "div", data_tier_health="ok")
    assert health.text.endswith("free of " + health.text.split(" free of ")[1])
    assert " free of " in health.text and health.text.endswith("; ok")


def test_runs_table(page: Element) -> None:
    (alpha,) = find_all(by_id(page, "runs"), "tr", data_run="alpha")
    cells = _cells(alpha)
    assert cells[:2] == ["alpha", "3"] and cells[3:6] == ["30", "20", "1"]


def test_pending_decisions_with_reasons(page: Element) -> None:
    trash = find_all(by_id(page, "pending"), "tr", data_action="trash")
    shown = {(c[0], c[1]) for c in map(_cells, trash)}
    assert {("beta", "1"), ("beta", "2"), ("alpha", "30")} <= shown
    reasons = {(c[0], c[1]): c[4] for c in map(_cells, trash)}
    assert all("older than the last 3" in reasons[("beta", s)] for s in ("1", "2"))
    assert "suspect: the loss is NaN" in reasons[("alpha", "30")]
    assert not any("failed verification" in r for r in reasons.values())


def test_timeline_draws_every_save_of_the_busiest_run(page: Element) -> None:
    bars = find_all(by_id(page, "timeline"), "rect")
    saves = [b for b in bars if b.attrs.get("class") == "save"]
    stalls = [b for b in bars if b.attrs.get("class") == "stall"]
    # beta has 5 saves, alpha 3: the newest save (alpha 30) does not decide.
    assert by_id(page, "timeline-run").text == "run beta"
    assert [b.attrs["data-step"] for b in saves] == ["1", "2", "3", "4", "5"] and len(stalls) == 5
    # The time axis: two different labels, even when the saves share a second.
    *_, start, end = [t.text for t in find_all(by_id(page, "timeline"), "text")]
    assert start != end and start < end


def test_no_actions_on_a_read_only_page(page: Element) -> None:
    assert "hidden" in by_id(page, "token-box").attrs
    assert find_all(by_id(page, "checkpoints"), "button") == []


def test_actions_appear_with_mutations(tmp_path: Path, ops: mouthguard.Store) -> None:
    with serving(ops, token=TOKEN) as served:
        dom = parse_dom(browse(served.url + "/", tmp_path / "profile", "--dump-dom").stdout)
    assert "hidden" not in by_id(dom, "token-box").attrs
    (row,) = find_all(by_id(dom, "checkpoints"), "tr", data_run="alpha", data_step="30")
    assert [b.text for b in find_all(row, "button")] == ["hold", "release", "critical"]


def test_screenshot(served: Served, tmp_path: Path) -> None:
    png = tmp_path / "page.png"
    browse(served.url + "/", tmp_path / "profile", f"--screenshot={png}", "--window-size=1400,1100")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 10_000
