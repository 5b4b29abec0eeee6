"""The simulator's side of speculative decoding: how many drafts are accepted, and what was.

The scheduler plans drafts (:class:`~stallfree.core.plan.ScheduledChunk.num_draft_tokens`); an
executor says how many were right. The engine verifies them; the simulator draws them from an
:class:`Acceptance` model with :class:`DraftVerifier`, which also proposes the next step's
drafts (k for a request that got a token, in a share of the steps: a draft model or EAGLE always
guesses, n-gram lookup only where it finds a match), adds what drafting costs (:func:`draft_pricer`)
and counts what :class:`DraftStats` reports, in vLLM's terms (its ``vllm:spec_decode_*`` counters).
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from stallfree.core import StepPlan, StepResult
from stallfree.costs.choice import CostChoice, CostPick, pick_cost_model


@dataclass(frozen=True, slots=True)
class Acceptance:
    """``rates[i]``: the share of verify steps whose draft at position ``i`` (0-based) is accepted,
    all before it accepted too (vLLM's per-position acceptance: accepted tokens at that position
    over drafts), so rates never rise with the position."""

    rates: tuple[float, ...]
    proposal_rate: float = 1.0  # the share of decode steps with drafts (n-gram lookup finds none in some)

    def __post_init__(self) -> None:
        if not self.rates:
            raise ValueError("an acceptance model needs at least one position's rate")
        if not 0.0 < self.proposal_rate <= 1.0:
            raise ValueError(f"the share of steps with drafts must be in (0, 1], got {self.proposal_rate}")
        if any(not 0.0 <= r <= 1.0 for r in self.rates):
            raise ValueError(f"acceptance rates must be in [0, 1], got {list(self.rates)}")
        if any(b > a for a, b in itertools.pairwise(self.rates)):
            raise ValueError(
                f"acceptance rates by position must not rise (a draft counts only after every earlier "
                f"one is accepted), got {list(self.rates)}"
            )

    @classmethod
    def per_token(cls, alpha: float, num_positions: int) -> Acceptance:
        """Each draft token right with probability ``alpha``, independently: position ``i`` is
        accepted with probability ``alpha ** (i + 1)``."""
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"the acceptance rate must be in [0, 1], got {alpha}")
        return cls(tuple(alpha ** (i + 1) for i in range(max(num_positions, 1))))

    @classmethod
    def parse(cls, text: str, num_positions: int) -> Acceptance:
        """``0.7`` (per token) or ``0.8,0.6,0.45`` (per position, at least ``num_positions``)."""
        try:
            values = [float(v) for v in text.split(",") if v.strip()]
        except ValueError:
            raise ValueError(f"acceptance rate {text!r}: give a number or a comma list of numbers") from None
        if len(values) == 1:
            return cls.per_token(values[0], num_positions)
        acceptance = cls(tuple(values))
        if len(values) < num_positions:
            raise ValueError(f"acceptance rates {text!r}: one per draft position, {num_positions} needed")
        return acceptance

    @classmethod
    def from_bench_result(cls, result: dict[str, Any]) -> Acceptance:
        """What a ``bench`` result's spec-decode counters say (its ``spec_decode``: acceptance by
        position per verify step), with the share of decode steps that had drafts: the verify steps
        over the decode steps its requests took (tokens after each request's first, less the
        accepted drafts, each of which saved a step). ValueError if it has no such counters."""
        counters = result.get("spec_decode")
        if not counters:
            raise ValueError("it has no spec-decode counters (its server did not speculate, or exports none)")
        steps = result["total_output_tokens"] - result["completed"] - counters["num_accepted_tokens"]
        rates = tuple(counters["acceptance_per_position"]) or (0.0,)
        share = counters["num_drafts"] / steps if steps > 0 else 1.0
        return cls(tuple(min(r, 1.0) for r in rates), min(max(share, 1e-6), 1.0))

    def rate(self, position: int) -> float:
        """The rate at ``position``; past the last one given, none is accepted."""
        return self.rates[position] if position < len(self.rates) else 0.0

    def mean_accepted(self, num_drafts: int) -> float:
        """Expected drafts accepted out of ``num_drafts``."""
        return sum(self.rate(i) for i in range(num_drafts))

    def describe(self) -> dict[str, Any]:
        return {"acceptance_rates": [round(r, 4) for r in self.rates], "draft_rate": self.proposal_rate}


@dataclass(slots=True)
class DraftStats:
    """vLLM's spec-decode counters: verify steps (``num_drafts``), draft tokens run, accepted
    tokens, and accepted tokens by position."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: list[int] = field(default_factory=list)

    def add(self, num_drafted: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_drafted
        self.num_accepted_tokens += num_accepted
        per_position = self.accepted_per_position
        if len(per_position) < num_drafted:
            per_position.extend([0] * (num_drafted - len(per_position)))
        for i in range(num_accepted):
            per_position[i] += 1

    def merge(self, other: DraftStats) -> None:
        self.num_drafts += other.num_drafts
        self.num_draft_tokens += other.num_draft_tokens
        self.num_accepted_tokens += other.num_accepted_tokens
        for i, n in enumerate(other.accepted_per_position):
            if i < len(self.accepted_per_position):
                self.accepted_per_position[i] += n
            else:
                self.accepted_per_position.append(n)

    def summary(self) -> dict[str, Any]:
        """The counters, the mean acceptance length (tokens a verify step gives: 1 + accepted per
        draft, vLLM's definition), the draft acceptance rate and the draft tokens wasted."""
        drafts = self.num_drafts
        return {
            "spec_decode_num_drafts": drafts,
            "spec_decode_num_draft_tokens": self.num_draft_tokens,
            "spec_decode_num_accepted_tokens": self.num_accepted_tokens,
            "spec_decode_mean_acceptance_length": round(1 + self.num_accepted_tokens / drafts, 4)
            if drafts
            else None,
            "spec_decode_draft_acceptance_rate": round(self.num_accepted_tokens / self.num_draft_tokens, 4)
            if self.num_draft_tokens
            else None,
            "spec_decode_wasted_draft_tokens": self.num_draft_tokens - self.num_accepted_tokens,
            "spec_decode_acceptance_per_position": [round(n / drafts, 4) for n in self.accepted_per_position]
            if drafts
            else [],
        }


DRAFT_METHODS = ("ngram", "eagle", "model:NAME")
DraftPassPrice = Callable[[int, int], float]
"""Seconds one drafting pass takes for ``num_seqs`` requests at ``context_len`` tokens; a step
that proposes k drafts runs k passes."""


def draft_pricer(method: str, target: CostPick) -> DraftPassPrice | None:
    """How drafting is priced beside ``target``'s steps: ``ngram`` free (a lookup, None);
    ``eagle`` a one-layer head on the target's hidden states, one of its decoder layers' share of
    a decode step (EAGLE / MTP); ``model:NAME`` the draft model NAME's own decode step on the same
    GPUs, priced the same way (roofline or tables; a profile prices only the model it measured)."""
    if method == "ngram":
        return None
    if method == "eagle":
        layers = target.model.num_layers
        decode_step_s = target.pricer.decode_step_s
        return lambda num_seqs, context_len: decode_step_s(num_seqs, context_len) / layers
    name = method.removeprefix("model:")
    if not method.startswith("model:") or not name:
        raise ValueError(f"unknown draft method {method!r}; choose from: {', '.join(DRAFT_METHODS)}")
    if target.source == "profile":
        raise ValueError(
            f"a draft model ({name}) needs steps priced by the roofline or GPU tables: a profile prices "
            "only the model it measured"
        )
    kind = "full" if target.source == "roofline" else "auto"
    draft = pick_cost_model(
        CostChoice(
            kind=kind, model=name, hardware=target.hardware, tp=target.tp, dtype_bytes=target.dtype_bytes
        )
    )
    return draft.pricer.decode_step_s


class DraftVerifier:
    """The simulator's executor half for drafts: accepts each request's drafts position by
    position (``acceptance``, seeded), proposes ``num_speculative_tokens`` for every request that
    got a token, and counts it all in ``stats``. ``draft_pass``: what a drafting pass costs
    (:func:`draft_pricer`; None: free), added to a step by :meth:`drafting_s`."""

    def __init__(
        self,
        acceptance: Acceptance,
        num_speculative_tokens: int,
        seed: int = 0,
        draft_pass: DraftPassPrice | None = None,
    ) -> None:
        if num_speculative_tokens <= 0:
            raise ValueError(f"num_speculative_tokens must be positive, got {num_speculative_tokens}")
        self.acceptance = acceptance
        self.num_speculative_tokens = num_speculative_tokens
        self.stats = DraftStats()
        self._random = random.Random(seed).random
        self._proposal_rate = acceptance.proposal_rate
        self._draft_pass = draft_pass
        # P(position i accepted | every earlier one accepted)
        rates = [acceptance.rate(i) for i in range(num_speculative_tokens)]
        self._given_earlier = [
            (r / before if before > 0 else 0.0) for r, before in zip(rates, [1.0, *rates[:-1]], strict=True)
        ]

    def drafting_s(self, plan: StepPlan) -> float:
        """The time ``plan``'s step spends drafting the next step's guesses: k passes of the
        drafter over the requests that get a token (0 for n-gram lookup)."""
        if self._draft_pass is None:
            return 0.0
        contexts = [c.context_len for c in plan.chunks if c.emits_token]
        if not contexts:
            return 0.0
        mean = round(sum(contexts) / len(contexts))
        return self.num_speculative_tokens * self._draft_pass(len(contexts), mean)

    def result(self, plan: StepPlan, duration_s: float) -> StepResult:
        accepted: dict[str, int] = {}
        proposed: dict[str, int] = {}
        draw, given_earlier, k = self._random, self._given_earlier, self.num_speculative_tokens
        always = self._proposal_rate >= 1.0
        for chunk in plan.chunks:
            if not chunk.emits_token:
                continue
            proposed[chunk.request_id] = k if always or draw() < self._proposal_rate else 0
            if drafted := chunk.num_draft_tokens:
                n = 0
                while n < drafted and draw() < given_earlier[n]:
                    n += 1
                accepted[chunk.request_id] = n
                self.stats.add(drafted, n)
        return StepResult(duration_s, num_accepted_drafts=accepted, num_proposed_drafts=proposed)
