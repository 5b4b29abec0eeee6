"""Decode throughput of the stallfree engine vs Hugging Face ``generate``, and vs the roofline.

For each stream count B: B random prompts of ``--context`` tokens are prefilled, then
``--decode-steps`` pure decode steps are timed (each step: one token for each of the B
streams). The same checkpoint (``stallfree save-model`` output) and the same prompts go
through transformers' ``generate`` (greedy, KV cache); its decode time is
``t(1 + N new tokens) - t(1 new token)``, i.e. prefill removed.

The roofline bound of a decode step is ``max(FLOPs / peak, bytes / bandwidth)`` with the
peak bf16/fp32 matmul rate and the memory bandwidth MEASURED here (a large matmul and a
large copy), FLOPs = 2 x (non-embedding + LM-head params) x B + attention over the
context, bytes = weights once + every stream's K/V context.

On a shared machine a run can be 10x slower than an undisturbed one (two OpenMP threads
on two busy cores wait at every op's barrier), so each engine is run ``--repeats`` times
and HF's timings are best of two; the best run is reported.

    .venv/bin/python benchmarks/engine/engine_decode_throughput.py --model random:medium --streams 16,64
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

import torch

from stallfree.core import SamplingParams
from stallfree.engine import LLMEngine, StepOutputs
from stallfree.engine.dtypes import choose_dtype
from stallfree.engine.weights import load_model, save_pretrained
from stallfree.specs import ModelSpec


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def measure_peak_flops(dtype: torch.dtype, device: torch.device) -> float:
    """Best FLOP/s over a few large matmul shapes (square, and tall-by-MLP-sized), best of 10 each."""
    best = 0.0
    for m, k, n in (
        (2048, 2048, 2048),
        (512, 768, 6144),
        (512, 3072, 768),
        (1024, 1024, 4096),
        (8192, 8192, 8192),
    ):
        if device.type == "cpu" and m > 4096:
            continue  # minutes on a CPU, and no faster than the smaller shapes
        a = torch.randn(m, k, dtype=dtype, device=device)
        b = torch.randn(n, k, dtype=dtype, device=device)
        for _ in range(10):
            _sync(device)
            start = time.perf_counter()
            torch.nn.functional.linear(a, b)
            _sync(device)
            best = max(best, 2 * m * k * n / (time.perf_counter() - start))
    return best


def measure_bandwidth(device: torch.device, num_bytes: int = 1 << 30) -> float:
    """Best of a few large copies, bytes moved (read + write) per second."""
    src = torch.ones(num_bytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(10):
        _sync(device)
        start = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * num_bytes / best


def decode_step_roofline(
    spec: ModelSpec, streams: int, context: int, dtype_bytes: int, peak_flops: float, bandwidth: float
) -> float:
    linear_flops = 2 * (spec.num_non_embedding_params + spec.lm_head_params) * streams
    attention_flops = 4 * streams * context * spec.q_size * spec.num_layers  # QK^T and PV
    bytes_moved = spec.weight_bytes(dtype_bytes) + streams * context * spec.kv_bytes_per_token(dtype_bytes)
    return max((linear_flops + attention_flops) / peak_flops, bytes_moved / bandwidth)


def run_engine(
    folder: Path,
    dtype: str,
    device: torch.device,
    prompts: list[list[int]],
    decode_steps: int,
    quantization: str | None = None,
) -> tuple[list[float], float]:
    """Executor times of ``decode_steps`` pure decode steps, and their wall-clock tokens/s."""
    streams, context = len(prompts), len(prompts[0])
    token_budget = max(2048, streams)
    # Early prompts decode while later ones prefill: give every stream enough tokens to still
    # be running for the whole timed window.
    max_tokens = decode_steps + -(-streams * context // token_budget) + 2
    engine = LLMEngine(
        str(folder),
        dtype=dtype,
        device=str(device),
        quantization=quantization,
        policy="chunked",
        token_budget=token_budget,
        max_num_seqs=streams,
        # + headroom for the blocks the scheduler keeps free (its watermark) when admitting.
        num_blocks=(streams * -(-(context + max_tokens + 1) // 16)) * 51 // 50 + 2,
    )
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    for ids in prompts:
        engine.add_request(prompt_token_ids=ids, sampling_params=params)

    def pure_decode_s(stepped: StepOutputs) -> float | None:
        """The step's executor time if it decoded every stream and nothing else."""
        step = stepped.step
        if step is None or step.plan.num_decode_tokens != streams or step.plan.num_prefill_tokens:
            return None
        return step.result.duration_s

    while True:  # prefill, then one warm-up decode step
        if not engine.has_unfinished_requests():
            raise RuntimeError("streams finished before all of them were decoding")
        if pure_decode_s(engine.step()) is not None:
            break
    step_times = []
    start = time.perf_counter()
    for _ in range(decode_steps):
        step_s = pure_decode_s(engine.step())
        if step_s is None:
            raise RuntimeError("a timed step was not a pure decode step")
        step_times.append(step_s)
    return step_times, streams * decode_steps / (time.perf_counter() - start)


def run_hf(
    folder: Path, dtype: torch.dtype, device: torch.device, prompts: list[list[int]], decode_steps: int
) -> float:
    """transformers' decode tokens/s on the same batch (prefill subtracted)."""
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval()
    input_ids = torch.tensor(prompts, device=device)
    mask = torch.ones_like(input_ids)

    def timed(new_tokens: int) -> float:
        _sync(device)
        start = time.perf_counter()
        with torch.inference_mode():
            model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
            )
        _sync(device)
        return time.perf_counter() - start

    timed(2)  # warm up
    # Best of two: on a shared machine the minimum is the least disturbed run.
    prefill_s = min(timed(1), timed(1))
    total_s = min(timed(1 + decode_steps), timed(1 + decode_steps))
    return len(prompts) * decode_steps / (total_s - prefill_s)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="random:medium")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--streams", default="16,64")
    parser.add_argument("--context", type=int, default=512, help="prompt tokens per stream")
    parser.add_argument("--decode-steps", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=2, help="runs per engine; the best is reported")
    parser.add_argument("--no-hf", action="store_true", help="skip the transformers baseline")
    parser.add_argument("--json", type=Path, help="write results here")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    device = torch.device(args.device)
    torch_dtype = choose_dtype(args.dtype, device).dtype
    dtype_name = str(torch_dtype).removeprefix("torch.")
    model, tokenizer = load_model(args.model, torch_dtype, "cpu")
    spec = model.spec
    peak_flops = measure_peak_flops(torch_dtype, device)
    bandwidth = measure_bandwidth(device)
    print(
        f"{args.model} ({spec.num_params / 1e6:.0f} M params, {dtype_name}) on {device}, "
        f"{torch.get_num_threads()} CPU threads; "
        f"measured peak {peak_flops / 1e9:.0f} GFLOP/s, bandwidth {bandwidth / 1e9:.1f} GB/s"
    )
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        save_pretrained(model, tokenizer, folder)
        del model
        rng = random.Random(0)
        for streams in (int(s) for s in args.streams.split(",")):
            prompts = [
                [rng.randrange(3, spec.vocab_size) for _ in range(args.context)] for _ in range(streams)
            ]
            runs = [
                run_engine(folder, dtype_name, device, prompts, args.decode_steps)
                for _ in range(args.repeats)
            ]
            step_times = min((run[0] for run in runs), key=statistics.median)
            engine_wall_tps = max(run[1] for run in runs)
            step_s = statistics.median(step_times)
            best_step_s = min(step_times)
            bound_s = decode_step_roofline(
                spec,
                streams,
                args.context + args.decode_steps // 2,
                torch_dtype.itemsize,
                peak_flops,
                bandwidth,
            )
            row = {
                "streams": streams,
                "context": args.context,
                "engine_decode_step_ms": round(step_s * 1e3, 2),
                "engine_decode_step_min_ms": round(best_step_s * 1e3, 2),
                "engine_decode_tokens_per_s": round(streams / step_s, 1),
                "engine_wall_tokens_per_s": round(engine_wall_tps, 1),
                "roofline_step_ms": round(bound_s * 1e3, 2),
                "fraction_of_roofline": round(bound_s / step_s, 3),
                "fraction_of_roofline_best_step": round(bound_s / best_step_s, 3),
            }
            if not args.no_hf:
                hf_tps = run_hf(folder, torch_dtype, device, prompts, args.decode_steps)
                row["hf_decode_tokens_per_s"] = round(hf_tps, 1)
                row["speedup_vs_hf"] = round(engine_wall_tps / hf_tps, 2)
            results.append(row)
            print(json.dumps(row))
    if args.json:
        args.json.write_text(
            json.dumps(
                {
                    "model": args.model,
                    "dtype": dtype_name,
                    "device": str(device),
                    "peak_flops_per_s": peak_flops,
                    "bandwidth_bytes_per_s": bandwidth,
                    "results": results,
                },
                indent=2,
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
