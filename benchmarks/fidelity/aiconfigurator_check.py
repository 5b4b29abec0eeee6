"""Checks of the aiconfigurator-core cost model (needs the ``gpu`` extra), printed as tables:

1. static batches: stallfree's step-by-step replay of a static batch (B prompts of ISL tokens in
   one step, then OSL - 1 decode steps) vs the package's own ``run_static`` (TTFT, TPOT);
2. the decode rows' one mean context: a batch of decodes of spread contexts priced at their mean
   vs in four groups by context;
3. Vidur's tables vs aiconfigurator's for Llama-3.1-8B under vLLM on A100 and H100, step by step,
   and on 10,000 arXiv requests (medians, and the simulation's wall time);
4. the seed's scenario (16 streams, a 16K prompt) on H100, H200 and B200 for Llama-3.1-70B TP4,
   Qwen3-235B-A22B TP8 and DeepSeek-V3 TP8 (MLA, its fp8 checkpoint);
5. expert parallelism (a MoE model's experts split whole over the TP GPUs): what it does to a step,
   EP over TP, by the package's measured MoE tables and by the roofline's busiest-GPU read;
6. disaggregation: the aiconfigurator package's own xPyD estimate (``make aiconfigurator``: its
   static prefill and decode batches, rate-matched) vs stallfree's replay of the same batches, and
   stallfree's simulation of that xPyD at the rate the estimate says it sustains.

    .venv/bin/python benchmarks/fidelity/aiconfigurator_check.py        # ~2 min on 2 cores
    .venv/bin/python benchmarks/fidelity/aiconfigurator_check.py 1 5    # those sections only
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import time
from pathlib import Path

from stallfree.core import ServingConfig
from stallfree.core.plan import ScheduledChunk, StepPlan, synthetic_plan
from stallfree.costs import CostChoice
from stallfree.costs.aiconfigurator import AicCostModel
from stallfree.costs.choice import pick_cost_model
from stallfree.costs.kv_transfer import PoolShape
from stallfree.explain.backends import run_explain
from stallfree.explain.options import ExplainOptions
from stallfree.sim import Deployment, simulate
from stallfree.sim.disagg import Disaggregation
from stallfree.workload import FixedLengths, TraceLengths, Workload, poisson

STATIC = (  # (model, system, framework, tp, expert parallel, batch, isl, osl)
    ("meta-llama/Meta-Llama-3.1-8B", "h100_sxm", "vllm", 1, False, 8, 1024, 128),
    ("meta-llama/Meta-Llama-3.1-70B", "h200_sxm", "vllm", 4, False, 16, 2048, 256),
    ("Qwen/Qwen3-32B", "b200_sxm", "trtllm", 2, False, 32, 1024, 128),
    ("Qwen/Qwen3-30B-A3B", "h200_sxm", "sglang", 1, False, 16, 2048, 256),
    ("Qwen/Qwen3-30B-A3B", "h200_sxm", "sglang", 4, True, 16, 2048, 256),
    ("Qwen/Qwen3-235B-A22B", "b200_sxm", "trtllm", 8, False, 8, 4096, 128),
    ("Qwen/Qwen3-235B-A22B", "b200_sxm", "trtllm", 8, True, 8, 4096, 128),
    ("deepseek-ai/DeepSeek-V3", "h200_sxm", "vllm", 8, False, 16, 2048, 256),
    ("deepseek-ai/DeepSeek-V3", "h200_sxm", "vllm", 8, True, 16, 2048, 256),
    ("openai/gpt-oss-120b", "h200_sxm", "vllm", 4, False, 16, 2048, 256),
    ("meta-llama/Llama-4-Scout-17B-16E-Instruct", "h200_sxm", "sglang", 4, False, 16, 2048, 256),
)


def static_batches() -> None:
    print("1. static batch: replayed step by step vs aiconfigurator's run_static (stride 1)")
    print(
        f"  {'model':<44}{'system':<10}{'fw':<8}{'tp':>3}{'':<3}{'B':>4}{'ISL':>6}{'OSL':>5}"
        f"{'TTFT ms':>20}{'TPOT ms':>20}"
    )
    for model, system, framework, tp, ep, batch, isl, osl in STATIC:
        cost = AicCostModel(model, system, framework, tp=tp, expert_parallel=ep)
        ttft = static_prefill_s(cost, batch, isl) * 1e3
        tpot = static_tpot_s(cost, batch, isl, osl) * 1e3
        ctx_ms, gen_ms, _ = cost._handle.run_static(batch_size=batch, isl=isl, osl=osl, stride=1)
        ref_tpot = gen_ms / (osl - 1)
        print(
            f"  {model:<44}{system:<10}{framework:<8}{tp:>3}{' EP' if ep else '':<3}{batch:>4}{isl:>6}{osl:>5}"
            f"{ttft:>8.2f} / {ctx_ms:>7.2f}{ttft / ctx_ms:>5.2f}x"
            f"{tpot:>8.3f} / {ref_tpot:>6.3f}{tpot / ref_tpot:>5.2f}x"
        )


def static_prefill_s(cost: AicCostModel, batch: int, isl: int) -> float:
    """One step of ``batch`` prompts of ``isl`` tokens (aiconfigurator's static context phase)."""
    return cost.step_time_s(
        StepPlan(tuple(c for i in range(batch) for c in _named(synthetic_plan(0, 0, isl), i)))
    )


def static_tpot_s(cost: AicCostModel, batch: int, isl: int, osl: int) -> float:
    """The mean of the OSL - 1 decode steps of ``batch`` requests after their prompts."""
    return sum(cost.decode_step_s(batch, isl + i) for i in range(osl - 1)) / (osl - 1)


def _named(plan: StepPlan, i: int) -> tuple[ScheduledChunk, ...]:
    return tuple(
        ScheduledChunk(f"{c.request_id}-{i}", c.num_computed_tokens, c.num_tokens, c.num_known_tokens)
        for c in plan.chunks
    )


def mean_context() -> None:
    print(
        "\n2. decodes of spread contexts: the batch at its mean context vs each row's own (Llama-3.1-8B, H100, vLLM)"
    )
    print(
        "   (each row's own: the batch priced at each row's context, averaged; equal where time is linear in it)"
    )
    cost = AicCostModel("meta-llama/Meta-Llama-3.1-8B", "h100_sxm", "vllm")
    spreads = {
        "even 1K": [1024] * 32,
        "64..8K log-spread": [int(64 * 2 ** (7 * i / 31)) for i in range(32)],
        "half 128, half 8K": [128] * 16 + [8192] * 16,
        "ShareGPT-like 200..3K": [200 + 90 * i for i in range(32)],
    }
    for name, contexts in spreads.items():
        g = len(contexts)
        mean = cost.decode_attention_s(g, sum(contexts) / g)
        rows = sum(cost.decode_attention_s(g, c) for c in contexts) / g
        step = cost.step_time_s(
            StepPlan(tuple(c for i, n in enumerate(contexts) for c in _named(synthetic_plan(1, n), i)))
        )
        print(
            f"  {name:<24} mean {mean * 1e3:6.3f} ms, rows {rows * 1e3:6.3f} ms ({mean / rows - 1:+.1%} of the "
            f"attention, {(mean - rows) / step:+.1%} of the step)"
        )


def vidur_vs_aic() -> None:
    print(
        "\n3. Vidur's tables vs aiconfigurator's (Llama-3.1-8B, vLLM 0.14 on A100 / 0.24 on H100), ms a step"
    )
    plans = {
        "1 decode @1K": synthetic_plan(1, 1024),
        "16 decodes @1K": synthetic_plan(16, 1024),
        "64 decodes @2K": synthetic_plan(64, 2048),
        "256-token chunk": synthetic_plan(0, 0, 256),
        "2048-token prompt": synthetic_plan(0, 0, 2048),
        "16 @1K + 256 chunk": StepPlan(
            (*synthetic_plan(16, 1024).chunks, *synthetic_plan(0, 0, 256, 4096).chunks)
        ),
    }
    for hardware in ("a100-80gb", "h100-sxm"):
        vidur = pick_cost_model(
            CostChoice(model="llama-3.1-8b", hardware=hardware, gpu_tables="vidur")
        ).pricer
        aic = pick_cost_model(CostChoice(model="llama-3.1-8b", hardware=hardware, framework="vllm")).pricer
        for name, plan in plans.items():
            v, a = vidur.step_time_s(plan) * 1e3, aic.step_time_s(plan) * 1e3
            print(f"  {hardware:<10}{name:<22}vidur {v:8.2f}   aiconfigurator {a:8.2f}   ratio {v / a:5.2f}")
    workload = Workload(poisson(2.0), TraceLengths("arxiv"))
    for hardware in ("a100-80gb", "h100-sxm"):
        for tables in ("vidur", "aiconfigurator"):
            choice = CostChoice(model="llama-3.1-8b", hardware=hardware, gpu_tables=tables)
            start = time.process_time()
            s = simulate(workload, Deployment(costs=choice), num_requests=10_000).summary
            wall = time.process_time() - start
            print(
                f"  arXiv 10K, {hardware:<10} {tables:<15} median TTFT {s['median_ttft_ms']:8.1f} ms, "
                f"median TPOT {s['median_tpot_ms']:6.2f} ms, p99 ITL {s['p99_itl_ms']:6.1f} ms, CPU {wall:5.1f} s"
            )


def seed_scenario() -> None:
    print(
        "\n4. the seed's scenario: 16 streams at 1K, a 16,384-token prompt, 256-token chunks, vLLM's tables"
    )
    for model, tp in (("llama-3.1-70b", 4), ("qwen3-235b-a22b", 8), ("deepseek-v3", 8)):
        rows = [
            (
                "a100-40gb, roofline (the seed)" if tp == 4 else "h200-sxm, roofline (full)",
                _roofline(model, tp),
            )
        ]
        rows += [(hw, ExplainOptions(model=model, tp=tp, hardware=hw, framework="vllm")) for hw in GPUS]
        for name, options in rows:
            try:
                out = run_explain(options)
            except ValueError as exc:  # DeepSeek-V3's 673 GB of fp8 weights on 8 x 80 GB
                print(f"  {model} TP{tp} {name:<32} {exc}")
                continue
            pf, ch = out.runs["prefill-first"], out.runs["chunked"]
            print(
                f"  {model} TP{tp} {name:<32} decode {out.decode_step_s * 1e3:5.1f} ms, ridge "
                f"{out.ridge_tokens:5.0f}, prefill-first stall {pf.max_gap_s:5.2f} s, chunked gap "
                f"{ch.max_gap_s * 1e3:5.1f} ms, TTFT x{ch.ttft_s / out.prefill_alone_s:.3f}"
            )


GPUS = ("h100-sxm", "h200-sxm", "b200-sxm")
EP_CASES = (  # (model, hardware, framework, tp)
    ("deepseek-v3", "h200-sxm", "vllm", 8),
    ("qwen3-235b-a22b", "b200-sxm", "trtllm", 8),
    ("Qwen/Qwen3-30B-A3B", "h200-sxm", "sglang", 4),
)


def expert_parallel() -> None:
    print("\n5. expert parallelism: a step with the experts split whole over the TP GPUs / sliced over them")
    plans = {
        "1 decode @1K": synthetic_plan(1, 1024),
        "16 @1K": synthetic_plan(16, 1024),
        "64 @1K": synthetic_plan(64, 1024),
        "256 @1K": synthetic_plan(256, 1024),
        "4096 prompt": synthetic_plan(0, 0, 4096),
    }
    print(f"  {'':<46}" + "".join(f"{name:>14}" for name in plans))
    for model, hardware, framework, tp in EP_CASES:
        for tables in ("aiconfigurator", "roofline"):
            kind = {"kind": "full"} if tables == "roofline" else {"framework": framework}
            picks = [
                pick_cost_model(
                    CostChoice(model=model, hardware=hardware, tp=tp, expert_parallel=ep, **kind)
                ).pricer
                for ep in (False, True)
            ]
            ratios = [picks[1].step_time_s(plan) / picks[0].step_time_s(plan) for plan in plans.values()]
            name = f"{model} TP{tp} {hardware} {framework if tables != 'roofline' else 'roofline'}"
            print(f"  {name:<46}" + "".join(f"{r:>13.2f}x" for r in ratios))


def _roofline(model: str, tp: int) -> ExplainOptions:
    if tp == 4:
        return ExplainOptions(model=model, tp=tp)  # the seed: weights-only on 4 x A100-40GB
    return ExplainOptions(model=model, tp=tp, hardware="h200-sxm", cost_model="full")


DISAGG = (  # (model, system, framework, tp prefill, tp decode, prefill batch, decode batch, isl, osl, x, y)
    ("meta-llama/Meta-Llama-3.1-8B", "h100_sxm", "vllm", 1, 1, 1, 64, 1024, 128, 1, 1),
    ("meta-llama/Meta-Llama-3.1-70B", "h100_sxm", "vllm", 4, 4, 1, 32, 2048, 256, 1, 1),
    ("meta-llama/Meta-Llama-3.1-70B", "h200_sxm", "vllm", 4, 4, 1, 64, 4096, 512, 2, 1),
    ("Qwen/Qwen3-32B", "h200_sxm", "sglang", 2, 2, 2, 64, 2048, 256, 1, 1),
)
AIC_PYTHON = Path(__file__).resolve().parents[2] / ".venv-aic" / "bin" / "python"
# aiconfigurator's own disaggregated estimate (its DisaggInferenceSession.run_disagg), as JSON
AIC_DISAGG = """
import json, logging, sys
logging.disable(logging.WARNING)
from aiconfigurator.sdk.inference_session import DisaggInferenceSession
from aiconfigurator_core.sdk import config
from aiconfigurator_core.sdk.backends.factory import get_backend
from aiconfigurator_core.sdk.perf_database import get_database, get_latest_database_version
model, system, fw, tp_p, tp_d, bp, bd, isl, osl, x, y = sys.argv[1:]
db = get_database(system, fw, get_latest_database_version(system, fw))
session = DisaggInferenceSession(db, get_backend(fw), db, get_backend(fw))
summary = session.run_disagg(model, config.RuntimeConfig(batch_size=1, isl=int(isl), osl=int(osl)),
    config.ModelConfig(tp_size=int(tp_p)), int(bp), int(x), config.ModelConfig(tp_size=int(tp_d)), int(bd), int(y))
row = summary.get_summary_df().iloc[0].to_dict()
print(json.dumps({k: row[k] for k in ("ttft", "tpot", "seq/s", "(p)seq/s/worker", "(d)seq/s/worker")}))
"""
TTFT_QUEUEING, PREFILL_RATE, DECODE_RATE = 1.8, 0.9, 0.92  # aiconfigurator 0.12's rate-matching factors


def disaggregated() -> None:
    """aiconfigurator's disaggregated estimate (static prefill and decode batches, rate-matched, no KV
    transfer) vs stallfree's replay of the same batches on the same tables; then stallfree's
    simulation of that xPyD at the rate aiconfigurator says it sustains (queues, the KV's trip)."""
    print(
        "\n6. disaggregated: aiconfigurator's xPyD estimate vs stallfree's static replay of the same batches"
    )
    if not AIC_PYTHON.exists():
        print(
            f"  needs the aiconfigurator package: make aiconfigurator (a venv at {AIC_PYTHON.parent.parent})"
        )
        return
    print(
        f"  {'model':<32}{'system':<10}{'fw':<7}{'xPyD':<6}{'TTFT ms (ours / aic)':>24}{'TPOT ms':>22}{'seq/s':>22}"
        f"  simulated at that rate: TTFT p50 / p99, TPOT p50 ms"
    )
    for model, system, fw, tp_p, tp_d, bp, bd, isl, osl, x, y in DISAGG:
        argv = [model, system, fw, tp_p, tp_d, bp, bd, isl, osl, x, y]
        done = subprocess.run(
            [str(AIC_PYTHON), "-c", AIC_DISAGG, *map(str, argv)], capture_output=True, text=True, check=True
        )
        ref = json.loads(done.stdout.strip().splitlines()[-1])
        prefill = AicCostModel(model, system, fw, tp=tp_p)
        decode = AicCostModel(model, system, fw, tp=tp_d)
        prefill_s = static_prefill_s(prefill, bp, isl)
        tpot_s = static_tpot_s(decode, bd, isl, osl)
        seq_s = min(x * bp / prefill_s * PREFILL_RATE, y * bd / (tpot_s * (osl - 1)) * DECODE_RATE)
        ttft_ms = prefill_s * 1e3 * TTFT_QUEUEING
        hardware = system.replace("_", "-")
        costs = CostChoice(kind="measured", model=model, hardware=hardware, framework=fw, tp=tp_p)
        sim = simulate(
            Workload(poisson(seq_s), FixedLengths(isl, osl)),
            Deployment(
                costs=costs,
                serving=ServingConfig(max_num_batched_tokens=max(8192, bp * isl), max_num_seqs=bd),
                disaggregate=Disaggregation(PoolShape(x, y, tp_p, tp_d)),
            ),
            num_requests=2000,
        ).summary
        print(
            f"  {model.split('/')[-1]:<32}{system:<10}{fw:<7}{f'{x}P{y}D':<6}"
            f"{ttft_ms:>9.1f} / {ref['ttft']:>7.1f} {ttft_ms / ref['ttft']:5.2f}x"
            f"{tpot_s * 1e3:>7.2f} / {ref['tpot']:>6.2f} {tpot_s * 1e3 / ref['tpot']:5.2f}x"
            f"{seq_s:>7.2f} / {ref['seq/s']:>6.2f} {seq_s / ref['seq/s']:5.2f}x"
            f"  {sim['median_ttft_ms']:8.1f} / {sim['p99_ttft_ms']:8.1f}, {sim['median_tpot_ms']:6.2f}"
        )


if __name__ == "__main__":
    sections = (static_batches, mean_context, vidur_vs_aic, seed_scenario, expert_parallel, disaggregated)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sections", nargs="*", type=int, choices=range(1, len(sections) + 1),
                        help="the sections to run, 1-6 (default: all)")  # fmt: skip
    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    for number in parser.parse_args().sections or range(1, len(sections) + 1):
        sections[number - 1]()
