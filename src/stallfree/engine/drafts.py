"""Draft tokens for speculative decoding, from the request's own text: prompt lookup (n-gram).

The last ``n`` tokens (``n`` from ``max_n`` down to ``min_n``) are looked up earlier in the
prompt and output; the tokens that followed their latest earlier occurrence are the guess. It
costs a search, no model: it pays where the output repeats the prompt (summarising or editing
a document, code) and proposes nothing where it finds no match.

How many drafts a request gets is decided per step (:class:`DraftHistory`, :class:`DraftCost`): a
draft is proposed only where its chance of being accepted, from the request's recent history, is
worth the row it adds to the step on this machine, so drafting never makes a run much slower where
guesses keep failing (free chat, or many streams on a compute-bound CPU).
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from dataclasses import dataclass


def propose_ngram(token_ids: Sequence[int], num_tokens: int, min_n: int, max_n: int) -> list[int]:
    """Up to ``num_tokens`` tokens that followed the latest earlier occurrence of the sequence's
    longest suffix of ``min_n..max_n`` tokens seen before; [] if none is."""
    if num_tokens <= 0 or not 0 < min_n <= max_n:
        return []
    length = len(token_ids)
    if length <= min_n:
        return []
    text = array("i", token_ids).tobytes()  # 4 bytes a token: bytes.rfind does the search in C
    width = 4
    for n in range(min(max_n, length - 1), min_n - 1, -1):
        suffix = text[(length - n) * width :]
        limit = (length - 1) * width  # an occurrence starts before the suffix does
        while (at := text.rfind(suffix, 0, limit)) >= 0:
            if at % width == 0:
                start = at // width + n
                return list(token_ids[start : start + num_tokens])
            limit = at + len(suffix) - 1  # straddles two tokens: look before it
    return []


@dataclass(frozen=True, slots=True)
class DraftCost:
    """What verifying a draft costs on this machine, measured at start-up: a one-row decode step
    (``step_s``) and each row more (``row_s``; a draft is a row)."""

    step_s: float
    row_s: float

    def threshold(self, num_running: int) -> float:
        """The chance a draft must have of being accepted to pay for itself with ``num_running``
        requests decoding: its row's cost over the step's cost per token emitted. At one stream a
        row is nearly free beside the weights' read (a low bar); where the step is compute-bound,
        every row costs what a decode does (a bar near 1)."""
        batch = max(num_running, 1)
        return self.row_s * batch / (self.step_s + (batch - 1) * self.row_s)


class DraftHistory:
    """How often a request's drafts were right lately: accepted drafts over drafts tried (a
    draft is tried only when every one before it was accepted), both decayed, from a prior of
    one in two."""

    __slots__ = ("accepted", "idle_steps", "tried")

    DECAY = 0.8
    PROBE_EVERY = 8  # steps a request that stopped drafting waits before one draft again

    def __init__(self) -> None:
        self.accepted, self.tried, self.idle_steps = 1.0, 2.0, 0

    def verified(self, num_drafts: int, num_accepted: int) -> None:
        tried = num_accepted + (num_accepted < num_drafts)
        self.accepted = self.DECAY * self.accepted + num_accepted
        self.tried = self.DECAY * self.tried + tried

    def length(self, most: int, threshold: float) -> int:
        """Drafts worth proposing: the most positions ``i`` (1..``most``) whose chance
        ``rate ** i`` of being accepted clears ``threshold``; none past that, but one every
        :attr:`PROBE_EVERY` steps, so a request whose text turns repetitive is found again."""
        rate = self.accepted / self.tried
        length = 0
        while length < most and rate ** (length + 1) >= threshold:
            length += 1
        if length:
            self.idle_steps = 0
            return length
        self.idle_steps += 1
        if self.idle_steps >= self.PROBE_EVERY and most:
            self.idle_steps = 0
            return 1
        return 0
