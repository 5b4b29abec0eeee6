"""Hypothesis strategies shared by the scheduler and simulator property tests."""

from __future__ import annotations

from hypothesis import strategies as st

from stallfree.core import SchedulerConfig

PolicyCase = tuple[str, dict[str, int], SchedulerConfig]


@st.composite
def policy_cases(draw: st.DrawFn) -> PolicyCase:
    """A policy name, its budget keywords for ``make_policy``, and a fitting ``max_num_seqs``.

    Chunked gets either a token budget (never below ``max_num_seqs``) or a chunk size; the
    whole-prompt policies get a batching cap half the time.
    """
    policy = draw(st.sampled_from(["chunked", "chunked-tokens", "prefill-first", "decode-first"]))
    max_num_seqs = draw(st.integers(1, 8))
    kw: dict[str, int] = {}
    if policy == "chunked-tokens":
        policy, kw = "chunked", {"chunk_tokens": draw(st.integers(1, 64))}
    elif policy == "chunked":
        kw = {"token_budget": draw(st.integers(max_num_seqs, 96))}
    elif draw(st.booleans()):
        kw = {"token_budget": draw(st.integers(1, 96))}
    return policy, kw, SchedulerConfig(max_num_seqs=max_num_seqs)
