"""Chunks sized by time vs a fixed token budget, on the roofline (``--cost-model full``).

Three parts, all on the simulated clock (no GPU):

1. **Long prompt into decoding streams** (explain's scenario: 32 streams decoding at 4,096
   tokens of context, one 32K or 128K prompt arrives): the time budget (``--step-budget-ms``)
   against the fixed chunk that costs the prompt the same TTFT (the smallest fixed chunk whose
   TTFT is no worse), and against the largest fixed chunk whose longest gap stays within the
   target. Gaps are the streams' inter-token times over the window (4 decode steps before
   the arrival, the prompt, 4 steps after its first token); throughput is the window's tokens
   per second (decode tokens + prompt tokens).
2. **Mixed trace** through ``simulate()``: Poisson arrivals, ShareGPT lengths with 3% long
   prompts (16K-64K tokens, uniform), the time budget against the fixed budgets 512..16384
   (vLLM's ``--max-num-batched-tokens``): the one with the same P99 TTFT (the smallest at least
   as good) and the one with the same max ITL.
3. **Figure** ``docs/time-budget-chunks.png``: chunk sizes and step times along a 128K prompt.

    .venv/bin/python benchmarks/scheduling/time_budget.py                   # everything (~2 min on 2 cores)
    .venv/bin/python benchmarks/scheduling/time_budget.py --parts streams   # part 1 only
    .venv/bin/python benchmarks/scheduling/time_budget.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from stallfree.core import DEFAULT_STEP_TOKEN_CAP, ChunkedPolicy, Policy, Request, make_policy
from stallfree.core.serving import ServingConfig
from stallfree.costs.choice import CostChoice
from stallfree.costs.roofline import CostModel, CostModelConfig
from stallfree.explain import PolicyRun, RooflineTimer, Scenario, run_scenario
from stallfree.sim import Deployment, simulate
from stallfree.specs import load_hardware_spec, load_model_spec
from stallfree.workload import TraceLengths, Workload, poisson, sample

DEPLOYMENTS = (  # (model, hardware, tp, step budget in ms)
    ("llama-3.1-8b", "a100-80gb", 1, 30.0),
    ("llama-3.1-8b", "h100-sxm", 1, 20.0),
    ("llama-3.1-70b", "a100-80gb", 4, 50.0),
    ("llama-3.1-70b", "h100-sxm", 4, 30.0),
)
PROMPTS = (32768, 128000)  # 128K-context models: 128,000 prompt tokens + 1 output fit 131,072
DECODERS, CONTEXT = 32, 4096
GRANULE = 16


def _timer(model: str, hardware: str, tp: int) -> RooflineTimer:
    config = CostModelConfig(load_model_spec(model), load_hardware_spec(hardware), tp=tp, kind="full")
    return RooflineTimer(CostModel(config))


def _timed(timer: RooflineTimer, budget_ms: float) -> Policy:
    return ChunkedPolicy(
        token_budget=DEFAULT_STEP_TOKEN_CAP, step_budget_s=budget_ms / 1000, predictor=timer.step_time_s
    )


def _window(run: PolicyRun, scenario: Scenario) -> dict[str, float]:
    gaps = sorted(run.gaps_s)
    span = run.steps[-1].end_s - run.steps[0].start_s
    tokens = sum(s.num_decode_tokens + s.num_prefill_tokens for s in run.steps)
    return {
        "ttft_s": run.ttft_s,
        "max_gap_ms": gaps[-1] * 1000,
        "p99_gap_ms": gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))] * 1000,
        "median_gap_ms": statistics.median(gaps) * 1000,
        "tokens_per_s": tokens / span,
        "num_prompt_steps": len(run.prompt_chunk_steps()),
    }


def _fixed(timer: RooflineTimer, scenario: Scenario, chunk: int) -> tuple[PolicyRun, dict[str, float]]:
    run = run_scenario(scenario, make_policy("chunked", chunk_tokens=chunk), timer)
    return run, _window(run, scenario)


def _search(ok: Any, low: int, high: int) -> int:
    """The smallest multiple of GRANULE in [low, high] with ok(c) (ok monotone: False..True)."""
    lo, hi = low // GRANULE, high // GRANULE
    while lo < hi:
        mid = (lo + hi) // 2
        if ok(mid * GRANULE):
            hi = mid
        else:
            lo = mid + 1
    return lo * GRANULE


def streams_part() -> list[dict[str, Any]]:
    rows = []
    for model, hardware, tp, budget_ms in DEPLOYMENTS:
        timer = _timer(model, hardware, tp)
        for prompt in PROMPTS:
            row = _streams_row(
                timer,
                Scenario(prompt_tokens=prompt, streams=DECODERS, context_tokens=CONTEXT, chunk_tokens=256),
                budget_ms,
            )
            rows.append({"model": model, "hardware": f"{tp} x {hardware}", **row})
    return rows


def _streams_row(timer: RooflineTimer, scenario: Scenario, budget_ms: float) -> dict[str, Any]:
    timed_run = run_scenario(scenario, _timed(timer, budget_ms), timer)
    timed = _window(timed_run, scenario)
    cache: dict[int, dict[str, float]] = {}

    def fixed(chunk: int) -> dict[str, float]:
        if chunk not in cache:
            cache[chunk] = _fixed(timer, scenario, chunk)[1]
        return cache[chunk]

    # Same TTFT: the smallest fixed chunk whose TTFT is no worse than the time budget's.
    same_ttft = _search(lambda c: fixed(c)["ttft_s"] <= timed["ttft_s"], GRANULE, 16384)
    # Same longest gap: the largest fixed chunk whose longest gap stays within the target.
    over = _search(lambda c: fixed(c)["max_gap_ms"] > budget_ms, GRANULE, 16384)
    same_gap = max(GRANULE, over - GRANULE)
    sizes = timed_run.prompt_chunk_tokens()
    return {
        "prompt_tokens": scenario.prompt_tokens,
        "step_budget_ms": budget_ms,
        "decode_step_ms": timer.step_time_s(_decode_plan()) * 1000,
        "prefill_alone_s": timer.cost_model.prefill_time_s(scenario.prompt_tokens),
        "time": {**timed, "first_chunk": sizes[0], "last_full_chunk": sizes[-2]},
        "fixed_same_ttft": {"chunk_tokens": same_ttft, **fixed(same_ttft)},
        "fixed_same_max_gap": {"chunk_tokens": same_gap, **fixed(same_gap)},
    }


def _decode_plan() -> Any:
    from stallfree.core.plan import synthetic_plan

    return synthetic_plan(DECODERS, CONTEXT)


def _mixed_requests(qps: float, num: int, seed: int, long_share: float = 0.03) -> list[Request]:
    arrays = sample(Workload(poisson(qps), TraceLengths("sharegpt")), num, seed)
    rng = np.random.default_rng(seed + 1)
    long = rng.random(num) < long_share
    prompts = np.where(long, rng.integers(16384, 65536, size=num, endpoint=True), arrays.num_prompt_tokens)
    outputs = np.where(long, 256, arrays.max_tokens)
    return [
        Request(str(i), int(p), int(o), float(t))
        for i, (p, o, t) in enumerate(zip(prompts, outputs, arrays.arrival_time_s, strict=True))
    ]


MIXED = (  # (model, hardware, tp, step budget ms, qps)
    ("llama-3.1-8b", "h100-sxm", 1, 25.0, 6.0),
    ("llama-3.1-70b", "h100-sxm", 4, 40.0, 2.0),
)
FIXED_BUDGETS = (512, 1024, 2048, 4096, 8192, 16384)
KEYS = ("p99_itl_ms", "max_itl_ms", "p99_ttft_ms", "mean_ttft_ms", "request_throughput", "output_throughput")


def mixed_part(num_requests: int) -> list[dict[str, Any]]:
    rows = []
    for model, hardware, tp, budget_ms, qps in MIXED:
        requests = _mixed_requests(qps, num_requests, 0)
        costs = CostChoice(kind="full", model=model, hardware=hardware, tp=tp)
        began = time.perf_counter()
        timed = simulate(
            requests, Deployment(costs=costs, serving=ServingConfig(step_budget_ms=budget_ms))
        ).summary
        timed_wall = time.perf_counter() - began
        fixed = {
            b: simulate(
                requests, Deployment(costs=costs, serving=ServingConfig(max_num_batched_tokens=b))
            ).summary
            for b in FIXED_BUDGETS
        }
        same_ttft = next((b for b in FIXED_BUDGETS if fixed[b]["p99_ttft_ms"] <= timed["p99_ttft_ms"]), None)
        same_itl = max(
            (b for b in FIXED_BUDGETS if fixed[b]["max_itl_ms"] <= timed["max_itl_ms"]), default=None
        )
        rows.append(
            {
                "model": model,
                "hardware": f"{tp} x {hardware}",
                "qps": qps,
                "num_requests": num_requests,
                "step_budget_ms": budget_ms,
                "time": {
                    **{k: timed[k] for k in KEYS},
                    "num_steps_over_budget": timed["num_steps_over_budget"],
                    "num_steps": timed["num_steps"],
                    "max_step_ms": timed["max_step_ms"],
                    "sim_wall_s": timed_wall,
                },
                "fixed": {b: {k: fixed[b][k] for k in (*KEYS, "max_step_ms")} for b in FIXED_BUDGETS},
                "fixed_same_p99_ttft": same_ttft,
                "fixed_same_max_itl": same_itl,
            }
        )
    return rows


def figure(path: str) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 7), sharex=True)
    prompt = 128000
    for col, (model, hardware, tp, budget_ms) in enumerate((DEPLOYMENTS[1], DEPLOYMENTS[3])):
        timer = _timer(model, hardware, tp)
        scenario = Scenario(prompt_tokens=prompt, streams=DECODERS, context_tokens=CONTEXT, chunk_tokens=256)
        timed = run_scenario(scenario, _timed(timer, budget_ms), timer)
        first = timed.prompt_chunk_tokens()[0]
        fixed = run_scenario(scenario, make_policy("chunked", chunk_tokens=first), timer)
        for run, label, color in (
            (timed, f"time budget {budget_ms:g} ms", "#d95f02"),
            (fixed, f"fixed {first:,}-token chunks (the time budget's first)", "#1b9e77"),
        ):
            sizes = run.prompt_chunk_tokens()
            done = np.cumsum([0, *sizes[:-1]])
            steps = run.prompt_chunk_steps()
            axes[0][col].step(done / 1000, sizes, where="post", color=color, label=label)
            axes[1][col].step(
                done / 1000, [s.duration_s * 1000 for s in steps], where="post", color=color, label=label
            )
        axes[1][col].axhline(budget_ms, color="black", ls="--", lw=0.8)
        axes[0][col].set_title(
            f"{model} on {tp} x {hardware}: a 128K prompt beside {DECODERS} streams", fontsize=10
        )
        axes[0][col].set_ylabel("prompt tokens in the step")
        axes[1][col].set_ylabel("step time (ms)")
        axes[1][col].set_xlabel("prompt tokens already computed (thousands)")
        axes[0][col].set_ylim(bottom=0)
        axes[1][col].set_ylim(bottom=0)
        axes[0][col].legend(fontsize=8, loc="center right", frameon=False)
    fig.suptitle(
        "Chunks sized by time shrink along the prompt (attention over earlier chunks grows); a fixed chunk's "
        "steps grow instead (roofline, cost model full)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def _print_streams(rows: list[dict[str, Any]]) -> None:
    print(f"\n1. long prompt into {DECODERS} streams decoding at {CONTEXT:,} tokens (roofline, full)")
    head = f"  {'deployment':<28}{'prompt':>8}{'':>2}{'policy':<26}{'TTFT s':>8}{'max gap':>9}{'p99 gap':>9}{'tok/s':>9}"
    print(head)
    for r in rows:
        dep = f"{r['model']} {r['hardware']}"
        t, s, g = r["time"], r["fixed_same_ttft"], r["fixed_same_max_gap"]
        cases = (
            (f"time {r['step_budget_ms']:g} ms ({t['first_chunk']}->{t['last_full_chunk']})", t),
            (f"fixed {s['chunk_tokens']} (same TTFT)", s),
            (f"fixed {g['chunk_tokens']} (same max gap)", g),
        )
        for i, (label, m) in enumerate(cases):
            print(
                f"  {dep if i == 0 else '':<28}{(str(r['prompt_tokens'] // 1000) + 'K') if i == 0 else '':>8}{'':>2}"
                f"{label:<26}{m['ttft_s']:>8.2f}{m['max_gap_ms']:>9.1f}{m['p99_gap_ms']:>9.1f}{m['tokens_per_s']:>9,.0f}"
            )


def _print_mixed(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        print(
            f"\n2. mixed trace: {r['model']} on {r['hardware']}, {r['num_requests']:,} requests at {r['qps']:g} QPS "
            f"(ShareGPT + 3% prompts of 16K-64K); time budget {r['step_budget_ms']:g} ms"
        )
        print(
            f"  {'policy':<22}{'p99 ITL':>9}{'max ITL':>9}{'max step':>9}{'p99 TTFT':>10}{'mean TTFT':>10}{'req/s':>8}{'out tok/s':>10}"
        )
        t = r["time"]
        lines = [(f"time {r['step_budget_ms']:g} ms", t)] + [
            (
                f"fixed {b}"
                + (" (same p99 TTFT)" if b == r["fixed_same_p99_ttft"] else "")
                + (" (same max ITL)" if b == r["fixed_same_max_itl"] else ""),
                m,
            )
            for b, m in r["fixed"].items()
        ]
        for label, m in lines:
            print(
                f"  {label:<22}{m['p99_itl_ms']:>9.1f}{m['max_itl_ms']:>9.1f}{m['max_step_ms']:>9.1f}{m['p99_ttft_ms']:>10.0f}"
                f"{m['mean_ttft_ms']:>10.0f}{m['request_throughput']:>8.3f}{m['output_throughput']:>10,.0f}"
            )
        print(
            f"  time budget: {t['num_steps_over_budget']} of {t['num_steps']:,} steps over it; simulated in {t['sim_wall_s']:.1f} s"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--parts", default="streams,mixed,figure")
    parser.add_argument("--num-requests", type=int, default=2000)
    parser.add_argument("--figure", default="docs/time-budget-chunks.png")
    parser.add_argument("--json", help="write the numbers here")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    out: dict[str, Any] = {}
    began = time.perf_counter()
    if "streams" in parts:
        out["streams"] = streams_part()
        _print_streams(out["streams"])
    if "mixed" in parts:
        out["mixed"] = mixed_part(args.num_requests)
        _print_mixed(out["mixed"])
    if "figure" in parts:
        out["figure"] = figure(args.figure)
        print(f"\nfigure: {out['figure']}")
    print(f"wall: {time.perf_counter() - began:.0f} s")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
