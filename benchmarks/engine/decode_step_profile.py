"""Where one decode step's time goes: the weights' matmuls, attention, and every other op.

Runs ``--streams`` streams of a ``--context``-token prompt through ``LLMEngine`` (chunked,
greedy), then times ``--steps`` pure decode steps twice: once plain (the step time), once under
``torch.profiler`` (each op's own time, grouped). The matmuls' weight bytes over their time is the
bandwidth they stream the weights at, printed next to this machine's read bandwidth (a sum over a
1 GiB buffer with the same threads), which bounds any engine's one-stream decode here: llama.cpp's
included.

    .venv/bin/python benchmarks/engine/decode_step_profile.py --model smollm2 --threads 1
    .venv/bin/python benchmarks/engine/decode_step_profile.py --model smollm2 --threads 2 --context 3000
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from stallfree.core import SamplingParams
from stallfree.engine import LLMEngine

LINEAR = {"mkldnn::_linear_pointwise", "aten::addmm", "aten::mm"}
ATTENTION = {
    "aten::_scaled_dot_product_flash_attention_for_cpu",
    "aten::bmm",
    "aten::_softmax",
    "aten::masked_fill_",
    "aten::index_select",
    "aten::index_copy_",
}


def read_bandwidth() -> float:
    """Bytes per second of a sum over a 1 GiB fp32 buffer, best of 5 (torch's current threads)."""
    buffer = torch.ones(1 << 28)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - start)
    return buffer.numel() * 4 / best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--streams", type=int, default=1)
    p.add_argument("--context", type=int, default=32, help="prompt tokens per stream")
    p.add_argument("--steps", type=int, default=40, help="decode steps timed, each way")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    engine = LLMEngine(
        args.model, dtype=args.dtype, device="cpu", policy="chunked", token_budget=4096, max_num_seqs=64
    )
    params = SamplingParams(max_tokens=3 * args.steps + 16, temperature=0, ignore_eos=True)
    for i in range(args.streams):
        ids = [3 + (7 * j + 13 * i) % 1000 for j in range(args.context)]
        engine.add_request(prompt_token_ids=ids, sampling_params=params)
    for _ in range(8):  # prefill, and the first decode steps' one-off costs
        engine.step()

    def decode_s() -> float:
        step = engine.step().step
        assert step is not None and step.plan.num_decode_tokens == args.streams, "not a pure decode step"
        return step.result.duration_s

    def median_ms() -> float:
        return statistics.median(decode_s() for _ in range(args.steps)) * 1e3

    before_ms = median_ms()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.steps):
            decode_s()
    after_ms = median_ms()  # a host that drifts shows here: before and after differ
    groups = {"weights' matmuls": 0.0, "attention + KV cache": 0.0, "everything else": 0.0}
    calls = dict.fromkeys(groups, 0)  # ops the model called (not counting an op's inner ops)
    for event in prof.events():
        group = (
            "weights' matmuls"
            if event.name in LINEAR
            else "attention + KV cache"
            if event.name in ATTENTION
            else "everything else"
        )
        groups[group] += event.self_cpu_time_total / 1e3 / args.steps
        calls[group] += event.cpu_parent is None
    profiled_ms = sum(groups.values())
    spec = engine.model.spec
    weight_bytes = (spec.num_non_embedding_params + spec.lm_head_params) * engine.dtype.itemsize
    bandwidth = read_bandwidth()
    print(
        f"{args.model} {args.dtype}, {args.threads} threads ({os.cpu_count()} CPUs, load "
        f"{'/'.join(f'{x:.2f}' for x in os.getloadavg())}): {args.streams} streams at {args.context}+ tokens; "
        f"decode step {before_ms:.1f} / {after_ms:.1f} ms (median of {args.steps} before / after profiling; "
        f"{profiled_ms:.1f} ms under the profiler)"
    )
    print("| part | ms per step | share | ops called per step |\n|---|---:|---:|---:|")
    for group, ms in groups.items():
        print(f"| {group} | {ms:.1f} | {ms / profiled_ms:.0%} | {calls[group] // args.steps} |")
    linear_ms = groups["weights' matmuls"]
    print(
        f"weights: {weight_bytes / 1e6:.0f} MB read per step in {linear_ms:.1f} ms = "
        f"{weight_bytes / linear_ms / 1e6:.1f} GB/s; this machine reads {bandwidth / 1e9:.1f} GB/s with "
        f"{args.threads} threads, so the weights alone take >= {weight_bytes / bandwidth * 1e3:.1f} ms a step"
    )


if __name__ == "__main__":
    main()
