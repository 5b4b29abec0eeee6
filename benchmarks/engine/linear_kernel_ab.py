"""The compiled panel matmul vs oneDNN's packed fp32 matmul: per layer shape, and in the engine.

Part 1 times each of the model's matmul shapes at ``--rows`` rows (one stream's decode up to a
prefill), both ways, alternating, on the weights of a ``--model`` layer (fresh random values, so
the big ones stream from memory as in a step). Part 2 runs two engines in one process, one packed
each way, and alternates them step for step on the same requests: pure decode steps of S streams
at ``--context`` tokens, then a ``--prompt-tokens`` prompt prefilled in one step. Printed: medians,
the ratio, and both engines' greedy tokens (the same, or the script says where they part).

    .venv/bin/python benchmarks/engine/linear_kernel_ab.py --model out/vllm/medium-fp32 --threads 1
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Callable

import torch

from stallfree.core import SamplingParams
from stallfree.engine import LLMEngine
from stallfree.engine.native import DECODER_ENV, LINEAR_ENV, pack_panels, panel_linear_kernel
from stallfree.engine.weights import load_model
from stallfree.specs import ModelSpec


def median_ms(fn: Callable[[], object], reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def time_both(x: torch.Tensor, weight: torch.Tensor, reps: int) -> tuple[float, float]:
    """Median ms of ``x @ weight.T`` through the panels and through oneDNN's packed weight."""
    linear = panel_linear_kernel()
    assert linear is not None
    panels, n = pack_panels(weight), weight.shape[0]
    blocked = torch.ops.mkldnn._reorder_linear_weight(weight, 16)
    a = median_ms(lambda: linear(x, panels, None, n), reps)
    b = median_ms(lambda: torch.ops.mkldnn._linear_pointwise(x, blocked, None, "none", [], ""), reps)
    return a, b


def shapes_part(spec: ModelSpec, rows: list[int], reps: int) -> None:
    shapes = {
        "qkv": (spec.q_size + 2 * spec.kv_size, spec.hidden_size),
        "o": (spec.hidden_size, spec.q_size),
        "gate_up": (2 * spec.intermediate_size, spec.hidden_size),
        "down": (spec.hidden_size, spec.intermediate_size),
        "lm_head": (spec.vocab_size, spec.hidden_size),
    }
    print("\n| rows | matmul (N x K) | panels ms | oneDNN ms | panels / oneDNN | panels GFLOP/s |")
    print("|---:|---|---:|---:|---:|---:|")
    for m in rows:
        per_step = {"panels": 0.0, "onednn": 0.0}
        for name, (n, k) in shapes.items():
            weight = torch.randn(n, k) / k**0.5
            x = torch.randn(m, k)
            a, b = time_both(x, weight, reps)
            if name != "lm_head":  # a step runs it on its sampling rows only
                per_step["panels"] += a * spec.num_layers
                per_step["onednn"] += b * spec.num_layers
            gflops = 2 * m * n * k / a / 1e6
            print(f"| {m} | {name} ({n} x {k}) | {a:.3f} | {b:.3f} | {a / b:.2f} | {gflops:.0f} |")
        p, o = per_step["panels"], per_step["onednn"]
        print(
            f"| {m} | **the {spec.num_layers} layers' matmuls** | {p:.1f} | {o:.1f} | {p / o:.2f} | |",
            flush=True,
        )


def make_engine(model: str, panels: bool) -> LLMEngine:
    os.environ[LINEAR_ENV] = "1" if panels else "0"
    os.environ[DECODER_ENV] = "0"  # the layers one by one both ways: only the matmuls differ
    engine = LLMEngine(model, dtype="float32", policy="chunked", token_budget=4096, max_num_seqs=64)
    assert engine.model.weights.kind == ("panels" if panels else "onednn"), engine.model.weights.kind
    return engine


def engines_part(model: str, streams: list[int], context: int, prompt: int, steps: int) -> None:
    engines = {"panels": make_engine(model, True), "onednn": make_engine(model, False)}
    vocab = engines["panels"].model.spec.vocab_size
    print("\n| step | panels ms (median) | oneDNN ms | panels / oneDNN | greedy tokens |")
    print("|---|---:|---:|---:|---|")
    for s in streams:
        rng = random.Random(s)
        prompts = [[rng.randrange(vocab) for _ in range(context)] for _ in range(s)]
        params = SamplingParams(max_tokens=steps + 8, temperature=0, ignore_eos=True)
        tokens: dict[str, dict[str, list[int]]] = {}
        times: dict[str, list[float]] = {}
        for name, engine in engines.items():
            for i, ids in enumerate(prompts):
                engine.add_request(prompt_token_ids=ids, sampling_params=params, request_id=f"s{s}-{i}")
            tokens[name], times[name] = {}, []
        while any(e.has_unfinished_requests() for e in engines.values()):
            for name, engine in engines.items():  # one step each, in turn
                out = engine.step()
                for o in out.outputs:
                    tokens[name][o.request_id] = list(o.token_ids)
                step = out.step
                if step is not None and step.plan.num_decode_tokens == s and not step.plan.num_prefill_tokens:
                    times[name].append(step.result.duration_s)
        report(f"decode, {s} stream(s) at {context}+ tokens", times, tokens)
    rng = random.Random(prompt)
    times = {name: [] for name in engines}
    tokens = {name: {} for name in engines}
    params = SamplingParams(max_tokens=1, temperature=0)
    for r in range(3):
        ids = [rng.randrange(vocab) for _ in range(prompt)]
        for name, engine in engines.items():
            engine.add_request(prompt_token_ids=ids, sampling_params=params, request_id=f"p{r}")
            out = engine.step()
            assert out.step is not None and out.step.plan.num_prefill_tokens == prompt
            times[name].append(out.step.result.duration_s)
            tokens[name].update({o.request_id: list(o.token_ids) for o in out.outputs})
    report(f"prefill of {prompt} tokens (3 prompts)", times, tokens)


def report(label: str, times: dict[str, list[float]], tokens: dict[str, dict[str, list[int]]]) -> None:
    a, b = (statistics.median(times[k]) * 1e3 for k in ("panels", "onednn"))
    differ = [rid for rid, toks in tokens["panels"].items() if toks != tokens["onednn"].get(rid)]
    same = "the same" if not differ else f"differ in {len(differ)} of {len(tokens['panels'])} requests"
    print(f"| {label} | {a:.1f} | {b:.1f} | {a / b:.2f} | {same} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="random:medium")
    parser.add_argument("--rows", default="1,4,16,64,129,2048", help="rows for part 1")
    parser.add_argument("--streams", default="1,16")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--prompt-tokens", type=int, default=2048)
    parser.add_argument("--steps", type=int, default=40, help="decode steps timed per engine")
    parser.add_argument("--reps", type=int, default=9, help="calls timed per shape")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--part", choices=["both", "shapes", "engine"], default="both")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    started = time.perf_counter()
    if panel_linear_kernel() is None:
        raise SystemExit("error: the compiled kernels did not build here (see the note above)")
    print(f"kernels loaded (or built) in {time.perf_counter() - started:.1f} s")
    print(
        f"{args.model}, fp32, {torch.get_num_threads()} thread(s), CPU {torch.backends.cpu.get_cpu_capability()}"
    )
    if args.part in ("both", "shapes"):
        spec = load_model(args.model, torch.float32, "cpu", 0)[0].spec
        shapes_part(spec, [int(r) for r in args.rows.split(",")], args.reps)
    if args.part in ("both", "engine"):
        engines_part(
            args.model,
            [int(s) for s in args.streams.split(",")],
            args.context,
            args.prompt_tokens,
            args.steps,
        )


if __name__ == "__main__":
    main()
