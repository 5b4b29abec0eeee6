"""Chunks sized by time on the real engine (this CPU), predicted vs measured.

``time_budget.py`` compares a time budget with fixed chunks on the simulated clock. This runs the
same comparison on the real engine with the machine's measured profile: explain's scenario
(``--streams`` streams decoding at ``--context`` tokens, one ``--prompt-tokens`` prompt arrives),

1. predicted: ``stallfree explain --profile P --step-budget-ms T`` and its chunk sweep (the
   measured model), which picks the two fixed chunks to hold against the time budget: the
   smallest whose prompt TTFT is no worse, and the largest whose longest gap stays within T;
2. measured: ``stallfree explain --engine torch --profile P --step-budget-ms T --sweep C1,C2``
   (every step timed on the engine; the time budget's chunks are sized by the same predictor),

and prints, per policy, TTFT and longest gap predicted vs measured, and for the time budget the
chunk sizes along the prompt, each chunk step's predicted vs measured time and the steps over T.
The profile must be of this machine with the engine's settings (dtype, threads).

    .venv/bin/stallfree profile --model random:medium --dtype bfloat16 --out medium.profile.json
    .venv/bin/python benchmarks/scheduling/time_budget_engine.py --profile medium.profile.json   # ~3 min
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def explain(*args: str) -> dict[str, Any]:
    command = [str(Path(sys.executable).parent / "stallfree"), "explain", *args, "--json"]
    print("$ stallfree explain " + " ".join(args), file=sys.stderr, flush=True)
    out = subprocess.run(command, check=True, text=True, capture_output=True).stdout
    return dict(json.loads(out))


def load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", required=True)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--prompt-tokens", type=int, default=3500)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--target-ms", type=float, default=80.0)
    parser.add_argument("--json", type=Path, help="write everything measured here")
    args = parser.parse_args()
    scenario = ["--prompt-tokens", str(args.prompt_tokens), "--streams", str(args.streams),
                "--context-tokens", str(args.context), "--step-budget-ms", f"{args.target_ms:g}"]  # fmt: skip
    sweep = ",".join(str(c) for c in range(16, 513, 16))
    predicted = explain("--profile", args.profile, *scenario, "--sweep", sweep)
    timed = predicted["policies"]["chunked"]
    target_s = args.target_ms / 1000
    points = predicted["sweep"]
    faster = [p for p in points if p["ttft_s"] <= timed["ttft_s"]]
    within = [p for p in points if p["max_gap_s"] <= target_s]
    if not faster or not within:
        sys.exit(
            f"no fixed chunk in {sweep} matches the time budget's TTFT or stays within {args.target_ms:g} ms"
        )
    same_ttft = min(faster, key=lambda p: p["chunk_tokens"])
    same_gap = max(within, key=lambda p: p["chunk_tokens"])
    chunks = sorted({same_ttft["chunk_tokens"], same_gap["chunk_tokens"]})
    before, started = load(), time.perf_counter()
    measured = explain("--engine", "torch", "--profile", args.profile, "--dtype", args.dtype, *scenario,
                       "--sweep", ",".join(map(str, chunks)))  # fmt: skip
    wall_s = time.perf_counter() - started
    after = load()
    rows = [
        f"{args.prompt_tokens}-token prompt into {args.streams} streams at {args.context} tokens; "
        f"target {args.target_ms:g} ms; engine run {wall_s:.0f} s, load {before} -> {after}",
        "| policy | TTFT s (meas / pred) | longest gap ms (meas / pred) | median gap ms (meas / pred) |",
        "|---|---|---|---|",
    ]

    def row(name: str, m: dict[str, Any], p: dict[str, Any]) -> str:
        median = (
            f"{m['median_gap_s'] * 1000:.1f} / {p['median_gap_s'] * 1000:.1f}" if "median_gap_s" in m else "-"
        )
        return (
            f"| {name} | {m['ttft_s']:.2f} / {p['ttft_s']:.2f} | "
            f"{m['max_gap_s'] * 1000:.1f} / {p['max_gap_s'] * 1000:.1f} | {median} |"
        )

    rows.append(row(f"time {args.target_ms:g} ms", measured["policies"]["chunked"], timed))
    by_chunk = {p["chunk_tokens"]: p for p in points}
    for point in measured["sweep"]:
        c = point["chunk_tokens"]
        label = " + ".join(
            what
            for what, pick in (("same TTFT", same_ttft), ("same longest gap", same_gap))
            if pick["chunk_tokens"] == c
        )
        rows.append(row(f"fixed {c} ({label})", point, by_chunk[c]))
    rows.append(
        row("prefill-first", measured["policies"]["prefill-first"], predicted["policies"]["prefill-first"])
    )
    m_chunks, p_chunks = measured["prompt_chunks"], predicted["prompt_chunks"]
    assert m_chunks["chunk_tokens"] == p_chunks["chunk_tokens"], "the same predictor sizes both runs' chunks"
    errors = [p / m - 1 for p, m in zip(p_chunks["step_s"], m_chunks["step_s"], strict=True)]
    sizes = m_chunks["chunk_tokens"]
    over = sum(s > target_s for s in m_chunks["step_s"])
    rows += [
        f"time budget: {len(sizes)} chunk steps, chunks {sizes[0]} -> {sizes[-2] if len(sizes) > 1 else sizes[0]} "
        f"(last {sizes[-1]}); steps over {args.target_ms:g} ms: measured {over}, predicted "
        f"{p_chunks['num_steps_over_budget']}; longest chunk step {max(m_chunks['step_s']) * 1000:.1f} ms measured",
        f"per chunk step, predicted / measured - 1: median {statistics.median(errors):+.1%}, "
        f"median |err| {statistics.median(abs(e) for e in errors):.1%}, "
        f"max |err| {max(abs(e) for e in errors):.1%}",
    ]
    print("\n".join(rows))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        body = {"predicted": predicted, "measured": measured, "load": [before, after], "wall_s": wall_s}
        args.json.write_text(json.dumps(body, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
