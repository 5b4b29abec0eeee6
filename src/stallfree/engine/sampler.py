"""Pick one token per sampling row: greedy, temperature, top-k, top-p, seeded per request.

Each request brings its own ``torch.Generator``, so what it samples depends only on its
seed and its own logits, never on which other requests share the step. Logprobs are of
the chosen token under the model's raw distribution (before temperature / top-k / top-p),
as vLLM reports them by default; ``top_logprobs`` alternatives come from the same distribution
(one ``topk`` over the rows that ask, nothing for the others).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from stallfree.core import SamplingParams

# Temperatures below this sample greedily: dividing logits by ~0 overflows to inf (vLLM's choice too).
GREEDY_TEMPERATURE = 1e-5


@dataclass(frozen=True, slots=True)
class SampledToken:
    token_id: int
    logprob: float | None = None
    # (token id, logprob) of the most likely tokens, most likely first; empty unless asked for.
    top_logprobs: tuple[tuple[int, float], ...] = ()


def sample_tokens(
    logits: torch.Tensor, params: Sequence[SamplingParams], generators: Sequence[torch.Generator]
) -> list[SampledToken]:
    """``logits`` is fp32 ``[rows, vocab]``; row ``i`` follows ``params[i]`` with ``generators[i]``."""
    if not params:
        return []
    chosen = logits.argmax(dim=-1)
    for row, p in enumerate(params):
        if p.temperature >= GREEDY_TEMPERATURE:
            chosen[row] = _sample_row(logits[row], p, generators[row])
    token_ids = chosen.tolist()
    wants_logprobs = [row for row, p in enumerate(params) if p.logprobs]
    logprobs: dict[int, float] = {}
    tops: dict[int, tuple[tuple[int, float], ...]] = {}
    if wants_logprobs:
        rows = torch.tensor(wants_logprobs, device=logits.device)
        log_probs = torch.log_softmax(logits[rows], dim=-1)
        picked = log_probs.gather(1, chosen[rows, None]).squeeze(1)
        logprobs = dict(zip(wants_logprobs, picked.tolist(), strict=True))
        k = min(max(params[row].top_logprobs for row in wants_logprobs), log_probs.shape[-1])
        if k > 0:
            values, indices = log_probs.topk(k, dim=-1)
            for i, row in enumerate(wants_logprobs):
                n = params[row].top_logprobs
                tops[row] = tuple(zip(indices[i, :n].tolist(), values[i, :n].tolist(), strict=True))
    return [SampledToken(tok, logprobs.get(row), tops.get(row, ())) for row, tok in enumerate(token_ids)]


def verify_drafts(
    logits: torch.Tensor, drafts: Sequence[int], p: SamplingParams, generator: torch.Generator
) -> list[int]:
    """The tokens a verify step emits: the drafts accepted, in order, then one more.

    ``logits`` has ``len(drafts) + 1`` rows: row ``i`` is the distribution of the token at draft
    ``i``'s position (the last row, after every draft). Greedy: a draft is kept while it is the
    argmax, and the token after the kept ones is the argmax there, so the output is the one
    decoding without drafts gives. Sampling: a draft ``x`` is kept with probability ``p(x)``
    (the target distribution after temperature, top-k, top-p; the drafter's own is a point mass
    on ``x``), and the first one rejected is replaced by a draw from ``p`` without ``x``:
    speculative sampling's rule, which leaves every token distributed as ``p`` says.
    """
    if p.temperature < GREEDY_TEMPERATURE:
        best = logits.argmax(dim=-1).tolist()
        kept = 0
        while kept < len(drafts) and drafts[kept] == best[kept]:
            kept += 1
        return [*drafts[:kept], best[kept]]
    out: list[int] = []
    for i, draft in enumerate(drafts):
        probs = _probs(logits[i], p)
        if torch.rand((), generator=generator, device=probs.device).item() < probs[draft].item():
            out.append(draft)
            continue
        probs[draft] = 0.0
        out.append(int(torch.multinomial(probs / probs.sum(), 1, generator=generator).item()))
        return out
    out.append(int(torch.multinomial(_probs(logits[len(drafts)], p), 1, generator=generator).item()))
    return out


def _sample_row(logits: torch.Tensor, p: SamplingParams, generator: torch.Generator) -> torch.Tensor:
    return torch.multinomial(_probs(logits, p), 1, generator=generator).squeeze(0)


def _probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The distribution a row samples from: temperature, then top-k, then top-p."""
    scaled = logits / p.temperature
    if 0 < p.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, p.top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        # Drop a token once the tokens ranked above it already cover top_p (the first always stays).
        drop_sorted = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= p.top_p
        drop_sorted[0] = False  # a tiny top_p rounds to 0 in fp32 and would drop every token
        drop = torch.empty_like(drop_sorted).scatter_(0, order, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    return torch.softmax(scaled, dim=-1)
