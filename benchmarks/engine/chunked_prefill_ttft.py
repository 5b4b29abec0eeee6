"""What chunked prefill costs a long prompt: its TTFT under a small token budget vs prefill-first.

One ``--prompt-tokens`` prompt (3,000 by default) runs through :class:`LLMEngine` in this
process, alone or while ``--streams`` other requests decode (they are prefilled first, then
the prompt arrives), under prefill-first and under chunked with each ``--budgets`` value.
TTFT is the wall time from ``add_request`` to the step that samples the prompt's first token;
the streams' longest gap is the longest step they saw meanwhile. Each configuration runs
``--repeats`` times, the configurations taking turns (best TTFT kept: this machine is shared);
ratios are against prefill-first measured in the same run. ``ttft_cpu_ms`` is this process's CPU
time over the same span: with ``--threads 1`` it is what the TTFT would be on an undisturbed
core, the fairer figure when other jobs share the machine.

    .venv/bin/python benchmarks/engine/chunked_prefill_ttft.py --model random:medium --budgets 64,256
"""

from __future__ import annotations

import argparse
import json
import random
import time

import torch

from stallfree.cli.common import QUANTIZATIONS
from stallfree.core import SamplingParams
from stallfree.engine import LLMEngine


def measure(args: argparse.Namespace, policy: str, budget: int | None) -> dict[str, float]:
    streams, prompt_tokens = args.streams, args.prompt_tokens
    engine = LLMEngine(
        args.model,
        dtype=args.dtype,
        quantization=args.quantization,
        device="cpu",
        policy=policy,
        token_budget=budget,
        max_num_seqs=streams + 1,
        max_model_len=prompt_tokens + 64,
        num_blocks=(streams + 1) * -(-(prompt_tokens + 64) // 16),
    )
    vocab = engine.model.spec.vocab_size
    rng = random.Random(0)
    decode_params = SamplingParams(max_tokens=prompt_tokens, temperature=0, ignore_eos=True)
    for _ in range(streams):
        engine.add_request(
            prompt_token_ids=[rng.randrange(3, vocab) for _ in range(64)], sampling_params=decode_params
        )
    while streams and engine.step().step.plan.num_prefill_tokens:  # type: ignore[union-attr]
        pass  # streams prefilled; the last step above was their first pure decode
    prompt = [rng.randrange(3, vocab) for _ in range(prompt_tokens)]
    start_s, start_cpu_s = time.perf_counter(), time.process_time()
    rid = engine.add_request(
        prompt_token_ids=prompt, sampling_params=SamplingParams(max_tokens=1, temperature=0)
    )
    longest_gap_s = executor_s = 0.0
    steps = 0
    while True:
        step_start_s = time.perf_counter()
        stepped = engine.step()
        longest_gap_s = max(longest_gap_s, time.perf_counter() - step_start_s)
        assert stepped.step is not None
        executor_s += stepped.step.result.duration_s
        steps += 1
        if any(out.request_id == rid for out in stepped.outputs):
            break
    return {
        "ttft_s": time.perf_counter() - start_s,
        "ttft_cpu_s": time.process_time() - start_cpu_s,
        "executor_s": executor_s,
        "steps": steps,
        "longest_gap_s": longest_gap_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="random:medium")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--quantization", choices=QUANTIZATIONS, help="weights: as serve's flag")
    parser.add_argument("--prompt-tokens", type=int, default=3000)
    parser.add_argument("--streams", type=int, default=0, help="requests decoding while the prompt runs")
    parser.add_argument("--budgets", default="64,256")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    configs: list[tuple[str, int | None]] = [("prefill-first", None)]
    configs += [("chunked", int(b)) for b in args.budgets.split(",")]
    print(
        f"{args.model} {args.dtype}{f' ({args.quantization} weights)' if args.quantization else ''}, "
        f"{torch.get_num_threads()} threads: a {args.prompt_tokens}-token "
        f"prompt, {args.streams} streams decoding"
    )
    runs: dict[tuple[str, int | None], list[dict[str, float]]] = {config: [] for config in configs}
    for _ in range(args.repeats):  # interleaved: a swing in the host's speed hits every config alike
        for policy, budget in configs:
            runs[policy, budget].append(measure(args, policy, budget))
    baseline_s = None
    for (policy, budget), config_runs in runs.items():
        best = min(config_runs, key=lambda r: r["ttft_s"])
        baseline_s = baseline_s or best["ttft_s"]
        row = {
            "policy": policy,
            "token_budget": budget,
            "ttft_ms": round(best["ttft_s"] * 1e3, 1),
            "ttft_ms_all": [round(r["ttft_s"] * 1e3, 1) for r in config_runs],
            "vs_prefill_first": round(best["ttft_s"] / baseline_s, 2),
            "ttft_cpu_ms": round(best["ttft_cpu_s"] * 1e3, 1),
            "executor_ms": round(best["executor_s"] * 1e3, 1),
            "steps": best["steps"],
            "longest_gap_ms": round(best["longest_gap_s"] * 1e3, 1),
        }
        print(json.dumps(row))


if __name__ == "__main__":
    main()
