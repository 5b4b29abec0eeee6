"""Speculative decoding on the real engine: n-gram drafts on SmolLM2, where lookup pays and where not.

For each case the engine runs the same greedy requests without drafts and with ``--speculative-tokens
K`` (interleaved, a warm-up first), and prints decode tokens/s, the ratio, the mean acceptance
length (tokens per verify step) and whether the outputs are the same token for token. Then the
seed's arrival: 16 streams decoding when a long prompt arrives, at one token budget, with and
without drafts: the streams' longest gap and the prompt's TTFT.

    python benchmarks/engine/spec_decode_engine.py [--model smollm2] [--k 4] [--repeats 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from stallfree.core import SamplingParams
from stallfree.engine import LLMEngine

DOCUMENT = (
    "The committee met on Tuesday to review the budget for the new library. The chair opened the "
    "meeting at nine and asked each member to report on their area. The treasurer said the costs of "
    "the building had risen by ten percent since the spring, mostly because of steel and labour. The "
    "head librarian said the reading rooms, the children's wing and the archive would open in stages, "
    "the first in March and the last in October. After a long discussion the committee agreed to delay "
    "the archive by one year and to ask the city for a second grant to cover the rest of the costs."
)
LOOKUP = f"Rewrite the following text, changing only 'committee' to 'board'.\n\nText: {DOCUMENT}\n\nRewritten text:"
CHAT = [
    "Write a short story about a robot who learns to paint.",
    "What are three ways to stay healthy in winter? Explain each.",
    "Describe the water cycle for a ten-year-old.",
    "Give me a recipe for a simple vegetable soup.",
]


def engine(model: str, k: int, budget: int) -> LLMEngine:
    options = {"num_speculative_tokens": k, "prompt_lookup_min": 2, "prompt_lookup_max": 4} if k else {}
    return LLMEngine(model, max_num_batched_tokens=budget, max_num_seqs=64, **options)


def decode(
    eng: LLMEngine, prompts: list[str], max_tokens: int
) -> tuple[float, int, list[tuple[int, ...]], float]:
    """Decode tokens/s after every prompt's first token, output tokens, the outputs, tokens per verify."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
    ids = [eng.add_request(prompt=p, sampling_params=params) for p in prompts]
    out: dict[str, tuple[int, ...]] = {}
    start = None
    first_tokens = verifies = accepted = 0
    while eng.has_unfinished_requests():
        step = eng.step()
        if step.step is None:
            continue
        for o in step.outputs:
            out[o.request_id] = o.token_ids
        if start is None and len(out) == len(ids):
            start, first_tokens = time.perf_counter(), sum(len(t) for t in out.values())
        elif start is not None:
            verifies += sum(1 for c in step.step.plan.chunks if c.num_draft_tokens)
            accepted += sum(step.step.events.num_accepted_drafts.values())
    assert start is not None
    elapsed = time.perf_counter() - start
    tokens = sum(len(t) for t in out.values()) - first_tokens
    return (
        tokens / elapsed,
        tokens,
        [out[i] for i in ids],
        (1 + accepted / verifies) if verifies else float("nan"),
    )


def long_prompt(eng: LLMEngine, prompt_words: int) -> tuple[float, float]:
    """16 streams decoding, then a long prompt: the streams' longest gap and the prompt's TTFT (s)."""
    params = SamplingParams(max_tokens=400, temperature=0, ignore_eos=True)
    streams = [eng.add_request(prompt=LOOKUP, sampling_params=params) for _ in range(16)]
    last: dict[str, float] = {}
    gap = 0.0
    arrived = ttft = None
    for _ in range(10_000):
        step = eng.step()
        now = time.perf_counter()
        for o in step.outputs:
            if arrived is not None and o.request_id in last:
                gap = max(gap, now - last[o.request_id])
            last[o.request_id] = now
            if o.request_id == "long" and ttft is None:
                ttft = now - (arrived or now)
        if arrived is None and len(last) == 16:
            for _ in range(5):
                eng.step()
            last = {rid: time.perf_counter() for rid in streams}
            arrived = time.perf_counter()
            # the prompt's tokens, at most what the model's context holds beside its one output token
            ids = eng.tokenizer.encode(" ".join(["word"] * prompt_words))[: eng.max_model_len - 1]
            eng.add_request("long", prompt_token_ids=ids, sampling_params=SamplingParams(max_tokens=1))
        if ttft is not None:
            break
    for rid in streams:
        eng.abort_request(rid)
    assert ttft is not None
    return gap, ttft


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2")
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--budget", type=int, default=256)
    p.add_argument("--prompt-words", type=int, default=1500)
    args = p.parse_args()
    print(
        f"{args.model}, k={args.k}, n-gram 2..4, budget {args.budget}, greedy, {os.cpu_count()} CPUs, "
        f"load {os.getloadavg()[0]:.2f}"
    )
    engines = {k: engine(args.model, k, args.budget) for k in (0, args.k)}
    for eng in engines.values():  # warm-up: kernels, caches
        decode(eng, [LOOKUP], 8)
    cases = [
        ("lookup, 1 stream", [LOOKUP]),
        ("chat, 1 stream", CHAT[:1]),
        ("lookup, 16 streams", [LOOKUP] * 16),
        ("chat, 16 streams", (CHAT * 4)[:16]),
    ]
    print(
        f"{'case':<22}{'tok/s plain':>12}{'tok/s drafts':>13}{'ratio':>7}{'tokens/verify':>15}{'same output':>13}"
    )
    for name, prompts in cases:
        plain, drafted, per_verify, same = [], [], [], True
        for _ in range(args.repeats):
            a = decode(engines[0], prompts, args.max_tokens)
            b = decode(engines[args.k], prompts, args.max_tokens)
            plain.append(a[0])
            drafted.append(b[0])
            per_verify.append(b[3])
            same = same and a[2] == b[2]
        pa, pb = statistics.median(plain), statistics.median(drafted)
        print(
            f"{name:<22}{pa:>12.1f}{pb:>13.1f}{pb / pa:>7.2f}{statistics.median(per_verify):>15.2f}{same!s:>13}"
        )
    print(f"\nlong prompt ({args.prompt_words} words) into 16 lookup streams, budget {args.budget}:")
    for k, eng in engines.items():
        gap, ttft = long_prompt(eng, args.prompt_words)
        print(f"  k={k}: streams' longest gap {gap * 1000:,.0f} ms, prompt TTFT {ttft * 1000:,.0f} ms")


if __name__ == "__main__":
    main()
