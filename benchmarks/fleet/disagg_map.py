"""Where disaggregation wins: aggregated replicas vs prefill/decode pools over a grid of TTFT x TPOT
SLOs, on a paper's own model, GPUs and traces.

For each cell (P99 TTFT, P99 TPOT), :func:`stallfree.tune.modes.tune_modes` lays out the same GPUs
both ways (aggregated: replicas of --tp GPUs at each budget; disaggregated: every xPyD of --tp
replicas, prefill replicas at the budgets past the ridge) and finds each layout's capacity (the
highest QPS meeting both SLOs); the cell names the better mode and by how much (best QPS a GPU of
one over the other). The published direction (TaiChi, 2025) says aggregation wins where TTFT is
tight and TPOT relaxed, disaggregation where TPOT is strict and TTFT relaxed, neither where both
bind; the map shows where stallfree agrees.

Default: Splitwise's setting (DGX-H100 machines, TP 8 a replica, its coding and conversation
traces; 4 machines) with Llama-3.1-70B in place of Llama-2-70B (the same size and GQA layout; Llama
2's 4K context would refuse the traces' longer prompts), priced by the full roofline. Besides the
two SLOs every trial meets Sarathi-Serve's P50 scheduling delay <= 2 s (tune's default), and runs
1,500 requests: long enough that a rate past capacity shows as a growing queue, not a burst
drained within the TTFT SLO.

    .venv/bin/python benchmarks/fleet/disagg_map.py --out out/disagg-map
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from stallfree.costs.choice import CostChoice
from stallfree.tune.modes import ModeTuneConfig, tune_modes
from stallfree.tune.pools import make_pool
from stallfree.tune.slo import Slos
from stallfree.tune.trial import TrialSpec, ridge_tokens, run_trial

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: common/
from common.host import loadavg, machine


def cell(config: ModeTuneConfig, workers: int) -> dict:
    pool = make_pool("local", run_trial, workers=workers)
    try:
        out, _ = tune_modes(config, pool)
    finally:
        pool.close()
    best: dict[str, dict] = {}
    for row in out["layouts"]:
        if row["qps_per_gpu"] and row["mode"] not in best:
            best[row["mode"]] = row
    return {"best": best, "trials": len(out["trials"]), "wall_s": out["wall_s"]}


def verdict(best: dict[str, dict]) -> str:
    agg, disagg = best.get("agg"), best.get("disagg")
    if agg is None and disagg is None:
        return "neither"
    if agg is None or disagg is None:
        return "agg only" if disagg is None else "disagg only"
    ratio = disagg["qps_per_gpu"] / agg["qps_per_gpu"]
    if abs(ratio - 1) < 0.05:
        return f"tie ({ratio:.2f})"
    return f"disagg {ratio:.2f}x" if ratio > 1 else f"agg {1 / ratio:.2f}x"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="llama-3.1-70b")
    p.add_argument("--hardware", default="h100-sxm")
    p.add_argument("--tp", type=int, default=8)
    p.add_argument("--gpus", type=int, default=32)
    p.add_argument("--cost-model", default="full")
    p.add_argument("--traces", default="splitwise-code,splitwise-conv")
    p.add_argument("--ttft-ms", default="1000,8000", help="P99 TTFT SLOs (rows)")
    p.add_argument("--tpot-ms", default="12,16,25,50", help="P99 TPOT SLOs (columns)")
    p.add_argument("--budgets", default="512,2048")
    p.add_argument("--num-requests", type=int, default=1500)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("out/disagg-map"))
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    costs = CostChoice(kind=args.cost_model, model=args.model, hardware=args.hardware, tp=args.tp)
    ttfts = [float(v) for v in args.ttft_ms.split(",")]
    tpots = [float(v) for v in args.tpot_ms.split(",")]
    started = time.perf_counter()
    lines = [
        f"{machine()}; load {loadavg()}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"{args.model} on {args.gpus} x {args.hardware}, replicas of TP {args.tp}, cost model {args.cost_model}; "
        f"{args.num_requests} requests a trial; budgets {args.budgets}",
    ]
    results: dict[str, dict] = {}
    for trace in args.traces.split(","):
        base = TrialSpec.of(costs, lengths=trace, num_requests=args.num_requests)
        lines += [
            "",
            f"### {trace}: the better mode's capacity a GPU over the other's (rows P99 TTFT, columns P99 TPOT)",
            "",
        ]
        lines += [
            "| TTFT \\ TPOT | " + " | ".join(f"{t:g} ms" for t in tpots) + " |",
            "|---" * (len(tpots) + 1) + "|",
        ]
        for ttft in ttfts:
            row = []
            for tpot in tpots:
                config = ModeTuneConfig(
                    base=base,
                    gpus=args.gpus,
                    modes=("agg", "disagg"),
                    tp_sizes=(args.tp,),
                    budgets=tuple(int(b) for b in args.budgets.split(",")),
                    ridge_tokens=ridge_tokens(costs),
                    slos=Slos.from_mapping(
                        {"ttft_p99_ms": ttft, "tpot_p99_ms": tpot, "sched_delay_p50_s": 2.0}
                    ),
                    precision=0.1,
                )
                found = cell(config, args.workers)
                results[f"{trace} ttft {ttft:g} tpot {tpot:g}"] = found
                shown = verdict(found["best"])
                for mode in ("agg", "disagg"):
                    if mode in found["best"]:
                        b = found["best"][mode]
                        shown += f"; {mode} {b['layout'].split(' tp')[0]} {b['qps_per_gpu']:.3g}"
                row.append(shown)
                print(f"{trace} TTFT {ttft:g} TPOT {tpot:g}: {shown}", flush=True)
            lines.append(f"| {ttft:g} ms | " + " | ".join(row) + " |")
    lines += ["", f"{time.perf_counter() - started:.0f} s in all; load after {loadavg()}"]
    (args.out / "map.md").write_text("\n".join(lines) + "\n")
    (args.out / "map.json").write_text(json.dumps(results, indent=2))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
