"""A compiled decode path on and off, in one engine, interleaved.

S streams of ``--context``-token prompts are prefilled, then pure decode steps alternate, a few
at a time, between two ways of running them, so the host's drift falls on both alike:

- ``--compare attention``: the decode-attention kernel (``stallfree.engine.native``, reading the
  paged blocks in place) vs torch's path (blocks gathered with ``index_select``, two matmuls),
  the layers run one by one from Python both ways;
- ``--compare decoder``: every layer in one compiled call (``csrc/decoder.cpp``) vs the same
  kernels called layer by layer from Python.

Printed: each side's median executor step, the ratio, and the time to load (or first build) the
kernels.

    .venv/bin/python benchmarks/engine/decode_attention_ab.py --model out/vllm/medium-fp32 --streams 1,16 --threads 1
    .venv/bin/python benchmarks/engine/decode_attention_ab.py --compare decoder --model DIR --threads 2
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

import torch

from stallfree.core import SamplingParams
from stallfree.engine import LLMEngine
from stallfree.engine.native import decode_attention_kernel


def switch_for(engine: LLMEngine, compare: str) -> Callable[[bool], None]:
    """Turns the compared path on (True) or off (False)."""
    kernel, decoder = engine.model_runner.decode_kernel, engine.model.native_decoder
    if kernel is None or (compare == "decoder" and decoder is None):
        raise SystemExit("error: the engine runs no compiled decode path here (fp32 on the CPU only)")
    if compare == "attention":
        engine.model.native_decoder = None

    def switch(use: bool) -> None:
        if compare == "attention":
            engine.model_runner.decode_kernel = kernel if use else None
        else:
            engine.model.native_decoder = decoder if use else None

    return switch


def ab(
    engine: LLMEngine, streams: int, context: int, steps: int, block: int, switch: Callable[[bool], None]
) -> tuple[list[float], list[float]]:
    """Executor times of pure decode steps with the compared path and without, ``block`` at a time."""
    rng = random.Random(streams)
    vocab = engine.model.spec.vocab_size
    params = SamplingParams(max_tokens=2 * steps + 4 * block + 16, temperature=0, ignore_eos=True)
    for _ in range(streams):
        engine.add_request(
            prompt_token_ids=[rng.randrange(vocab) for _ in range(context)], sampling_params=params
        )
    times: dict[bool, list[float]] = {True: [], False: []}
    use = True
    while len(times[False]) < steps:
        switch(use)
        for _ in range(block):
            step = engine.step().step
            if (
                step is not None
                and step.plan.num_decode_tokens == streams
                and not step.plan.num_prefill_tokens
            ):
                times[use].append(step.result.duration_s)
        use = not use
    return times[True], times[False]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--compare", choices=("attention", "decoder"), default="attention")
    parser.add_argument("--model", default="random:medium")
    parser.add_argument("--streams", default="1,16")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--steps", type=int, default=40, help="timed steps each way")
    parser.add_argument("--block", type=int, default=5, help="steps in a row before switching")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    if decode_attention_kernel() is None:
        raise SystemExit("error: the decode-attention kernel did not build here (see the note above)")
    print(f"kernel loaded (or built) in {time.perf_counter() - started:.1f} s")
    print(
        f"{args.model}, fp32, {torch.get_num_threads()} thread(s), CPU capability {torch.backends.cpu.get_cpu_capability()}"
    )
    on, off = ("kernel", "torch's path") if args.compare == "attention" else ("one call", "layer by layer")
    print(f"| streams | context | {on} ms (median) | {off} ms | {on} / {off} |")
    print("|---:|---:|---:|---:|---:|")
    for streams in (int(s) for s in args.streams.split(",")):
        engine = LLMEngine(args.model, dtype="float32", policy="chunked", token_budget=2048, max_num_seqs=64)
        with_path, without = ab(
            engine, streams, args.context, args.steps, args.block, switch_for(engine, args.compare)
        )
        a, b = statistics.median(with_path) * 1000, statistics.median(without) * 1000
        print(f"| {streams} | {args.context}+ | {a:.1f} | {b:.1f} | {a / b:.2f} |", flush=True)


if __name__ == "__main__":
    main()
