"""Token-budget candidates: powers of two plus multiples of the roofline ridge, tile-aligned.

The ridge (tokens per step at which linear-layer compute equals the weight read) is where a
step stops being free: below it prompt tokens ride along with the decodes at no cost, above
it every token adds time, so the budgets worth trying sit at and a few times above the ridge.
Powers of two are what deployments usually try (vLLM and SGLang defaults are 2048, 8192, ...).

Every candidate is rounded to a multiple of :data:`TILE_TOKENS` (64). GPU matmul kernels cut
the token dimension into tiles of 64 or 128 rows; a step of 257 tokens runs a mostly empty
extra tile and costs about what 320 would, so a budget that is not a tile multiple buys latency
without throughput (Sarathi-Serve makes the same observation). Invariant: candidates are
sorted, distinct, multiples of 64 and within [min_tokens, max_tokens].
"""

from __future__ import annotations

TILE_TOKENS = 64
RIDGE_MULTIPLES = (1, 2, 4)


def round_to_tile(tokens: float, tile: int = TILE_TOKENS) -> int:
    """The nearest multiple of ``tile`` (at least one tile)."""
    if not tokens > 0:
        raise ValueError(f"a token count must be positive, got {tokens}")
    return max(tile, tile * round(tokens / tile))


def budget_candidates(ridge_tokens: float, min_tokens: int = 128, max_tokens: int = 8192) -> tuple[int, ...]:
    """Powers of two in [min_tokens, max_tokens] and the ridge x 1, 2, 4, tile-rounded."""
    if not 0 < min_tokens <= max_tokens:
        raise ValueError(f"need 0 < min_tokens <= max_tokens, got {min_tokens}, {max_tokens}")
    powers = [2**k for k in range(max_tokens.bit_length()) if min_tokens <= 2**k <= max_tokens]
    ridge = [round_to_tile(ridge_tokens * m) for m in RIDGE_MULTIPLES]
    rounded = {round_to_tile(b) for b in powers + ridge}
    return tuple(sorted(b for b in rounded if min_tokens <= b <= max_tokens))
