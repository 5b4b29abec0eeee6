"""Scheduling policies: what runs in a step. The extension point of the core.

A policy implements :meth:`Policy.schedule`, which reads the queues through a
:class:`~stallfree.core.context.StepContext` and calls its two actions:
``schedule_running(seq, n, preempt=...)`` and ``admit(n)``. The context keeps
KV blocks, sequence limits and preemption right, so a new policy is one small
class registered in :data:`POLICIES`; the scheduler loop never changes.

- ``chunked`` — stall-free batching (Sarathi-Serve): every decoding request
  gets its token, then prompts part-way through prefill, then new prompts,
  chunked to fill the step's token budget, or, with ``step_budget_s`` and a
  step-time predictor, its time target (:mod:`stallfree.core.time_budget`).
  With a token budget it plans the steps vLLM V1 plans with the same
  ``--max-num-batched-tokens`` / ``--max-num-seqs`` (tests/test_vllm_parity.py).
  With speculative decoding (``num_speculative_tokens``) decodes also verify the drafts their
  executor proposed, under one of two rules (:data:`SPECULATIVE_RULES`).
- ``prefill-first`` — vLLM's old default: waiting prompts run whole, batched
  up to ``max_num_batched_tokens``, in a step of their own; decodes pause.
- ``decode-first`` — request-level batching: prompts are admitted only when
  nothing is running, so new prompts wait for the batch to drain.
"""

from __future__ import annotations

import abc
import enum
from typing import ClassVar

from mypy_extensions import mypyc_attr

from stallfree.core.config import DEFAULT_TOKEN_BUDGET, SchedulerConfig
from stallfree.core.context import StepContext
from stallfree.core.plan import StepPlan
from stallfree.core.request import Request
from stallfree.core.time_budget import StepTimePredictor, fill_prompts_by_time

SPECULATIVE_RULES = {
    "vllm": "each draft token takes a token of the step's budget, before any prompt chunk (vLLM V1)",
    "sglang": "a step that verifies drafts carries no prompt chunk: prompts run in steps of their own, "
    "first (SGLang turns mixed chunked prefill off under speculation)",
}
"""How drafts share a step with prompt chunks, by the framework that does it that way."""


class Steadiness(enum.Enum):
    """Whether the next step repeats a plan when nothing but time changes (the simulator's fast path).

    *Repeats* means: the same requests, the same chunk sizes, each chunk starting where the
    previous one ended. The scheduler itself checks the rest (no request finishes, no prompt
    chunk reaches its last token, KV blocks suffice; see :meth:`Scheduler.steady_run`).
    """

    NONE = "none"  # the next plan may differ: schedule it
    UNTIL_ARRIVAL = "until-arrival"  # repeats until a request arrives
    IGNORES_ARRIVALS = "ignores-arrivals"  # repeats even if requests arrive (they only queue)


@mypyc_attr(allow_interpreted_subclasses=True)  # users write policies (compiled build)
class Policy(abc.ABC):
    name: ClassVar[str]

    def check_config(self, config: SchedulerConfig) -> None:  # noqa: B027 - optional hook
        """Raise ``ValueError`` if this policy cannot work under ``config``."""

    def rejection_reason(self, request: Request) -> str | None:
        """Why ``request`` can never run under this policy (None: it can)."""
        return None

    @abc.abstractmethod
    def schedule(self, ctx: StepContext) -> None:
        """Fill one step through ``ctx``."""

    def steadiness(self, plan: StepPlan, num_running: int) -> Steadiness:
        """Whether the next step repeats ``plan`` (see :class:`Steadiness`).

        Only a speed-up: the default, ``NONE``, is always correct. ``num_running`` counts the
        running requests after ``plan`` was built. A subclass that changes :meth:`schedule`
        must check that the answer it inherits still holds (the simulator's tests compare its
        fast path with scheduling every step).
        """
        return Steadiness.NONE

    @staticmethod
    def _decodes_everything(plan: StepPlan, num_running: int) -> bool:
        """Every running request decodes one token in ``plan``, and nothing else runs."""
        return len(plan.chunks) == num_running and all(c.is_decode for c in plan.chunks)

    @staticmethod
    def _decode_all(ctx: StepContext) -> None:
        """Give every running request its next token, finishing any prefill whole."""
        for seq in ctx.running:
            if ctx.is_running(seq):
                ctx.schedule_running(seq, seq.num_uncomputed_tokens, preempt=True)

    @staticmethod
    def _admit_whole(ctx: StepContext, max_num_batched_tokens: int | None) -> int:
        """Admit waiting prompts whole, first-come-first-served, up to the token cap.

        The first prompt is admitted even if it alone exceeds the cap, so a
        long prompt is never stuck. Returns how many were admitted.
        """
        admitted = 0
        while ctx.waiting:
            need = ctx.num_tokens_to_run(ctx.waiting[0])
            cap = max_num_batched_tokens
            if admitted and cap is not None and ctx.num_scheduled_tokens + need > cap:
                break
            if ctx.admit(need) != need:
                break
            admitted += 1
        return admitted


def check_budget_holds_seqs(token_budget: int | None, max_num_seqs: int | None) -> None:
    """A chunked token budget must hold a decode token for every running request (vLLM refuses
    the same); None: nothing to check."""
    if token_budget is not None and max_num_seqs is not None and token_budget < max_num_seqs:
        raise ValueError(
            f"token budget {token_budget} is smaller than max_num_seqs {max_num_seqs}: every running "
            "request needs its decode token each step; raise the budget or lower max_num_seqs"
        )


class ChunkedPolicy(Policy):
    """Stall-free batching under a per-step token budget or step-time target.

    Give exactly one of ``token_budget`` (total tokens per step, decodes
    included: Sarathi-Serve's and vLLM's ``max_num_batched_tokens``) or
    ``chunk_tokens`` (prompt tokens per step on top of the decodes: the seed's view).

    ``step_budget_s`` sizes prompt chunks by time instead: each step gets the prompt tokens whose
    predicted step time (``predictor``, required with it) stays within the target; a
    ``token_budget`` or ``chunk_tokens`` given with it is a cap on top (neither: no cap). The
    decodes always run, even when they alone exceed the target. ``num_guarded_steps`` counts
    steps whose first prompt got the starvation guard's minimum chunk past the target, and
    ``num_decode_overruns`` those of them whose decodes alone were predicted over it.

    ``num_speculative_tokens`` (k > 0): each decode also verifies up to k draft tokens its
    executor proposed, shared with prompt chunks by ``speculative_rule`` (:data:`SPECULATIVE_RULES`):
    ``vllm``, drafts take the budget left after the decodes, oldest request first, and prompt
    chunks what remains (with ``chunk_tokens`` the drafts ride on top, as the decodes do);
    ``sglang``, a step runs prompt chunks alone (under the budget) while any prompt can run, and
    decodes with all their drafts otherwise. With k = 0 both are the plain policy.
    """

    name = "chunked"

    def __init__(
        self,
        token_budget: int | None = None,
        chunk_tokens: int | None = None,
        *,
        step_budget_s: float | None = None,
        predictor: StepTimePredictor | None = None,
        num_speculative_tokens: int = 0,
        speculative_rule: str = "vllm",
    ) -> None:
        if num_speculative_tokens < 0:
            raise ValueError(f"num_speculative_tokens must be >= 0, got {num_speculative_tokens}")
        if speculative_rule not in SPECULATIVE_RULES:
            raise ValueError(
                f"unknown speculative rule {speculative_rule!r}; choose from: {', '.join(SPECULATIVE_RULES)}"
            )
        if num_speculative_tokens and step_budget_s is not None:
            raise ValueError("chunked policy: a step-time budget does not combine with speculative decoding")
        both = token_budget is not None and chunk_tokens is not None
        if both or (step_budget_s is None and token_budget is None and chunk_tokens is None):
            raise ValueError(
                "chunked policy: give exactly one of token_budget or chunk_tokens "
                "(with step_budget_s, at most one of them, as a cap)"
            )
        if step_budget_s is None:
            if predictor is not None:
                raise ValueError("chunked policy: a step-time predictor needs a step_budget_s to aim at")
        else:
            if not (step_budget_s > 0 and step_budget_s != float("inf")):
                raise ValueError(
                    f"chunked policy: step_budget_s must be positive and finite, got {step_budget_s}"
                )
            if predictor is None:
                raise ValueError(
                    "chunked policy: step_budget_s needs a step-time predictor (a function StepPlan -> "
                    "seconds, such as a cost model's step_time_s)"
                )
        for label, value in (("token_budget", token_budget), ("chunk_tokens", chunk_tokens)):
            if value is not None and value <= 0:
                raise ValueError(f"chunked policy: {label} must be positive, got {value}")
        self.token_budget = token_budget
        self.chunk_tokens = chunk_tokens
        self.step_budget_s = step_budget_s
        self.predictor = predictor
        self.num_guarded_steps = 0
        self.num_decode_overruns = 0
        self.num_speculative_tokens = num_speculative_tokens
        self.speculative_rule = speculative_rule

    def check_config(self, config: SchedulerConfig) -> None:
        check_budget_holds_seqs(self.token_budget, config.max_num_seqs)

    def schedule(self, ctx: StepContext) -> None:
        drafts = self.num_speculative_tokens
        if drafts and self.speculative_rule == "sglang":
            # Prompts first, in a step of their own; decodes verify their drafts in the others.
            self._fill_prompts(ctx, self.chunk_tokens or self.token_budget or 0)
            if not ctx.num_scheduled_tokens:
                ctx.schedule_decodes()
                ctx.schedule_drafts(None, drafts)
            return
        # 1. Every decoding request gets exactly one token: the stall-free property.
        ctx.schedule_decodes()
        if drafts:  # then their drafts, from the budget (vLLM V1: a draft is a scheduled token)
            left = None if self.token_budget is None else self.token_budget - ctx.num_scheduled_tokens
            ctx.schedule_drafts(left, drafts)
        if self.step_budget_s is not None:
            assert self.predictor is not None  # required with a step budget (checked in __init__)
            if self.chunk_tokens is not None:
                cap: int | None = self.chunk_tokens
            else:
                cap = None if self.token_budget is None else self.token_budget - ctx.num_scheduled_tokens
            fill = fill_prompts_by_time(ctx, self.predictor, self.step_budget_s, cap)
            self.num_guarded_steps += fill.guarded
            self.num_decode_overruns += fill.decodes_over
            return
        if self.chunk_tokens is not None:
            budget = self.chunk_tokens
        else:
            assert self.token_budget is not None  # one of the two is set (checked in __init__)
            budget = self.token_budget - ctx.num_scheduled_tokens
        self._fill_prompts(ctx, budget)

    @staticmethod
    def _fill_prompts(ctx: StepContext, budget: int) -> None:
        """Prompt chunks of up to ``budget`` tokens in all: running prompts, then new ones. A
        chunk taken out of the step by a preemption (the priority rule) gives its tokens back."""
        end = ctx.num_scheduled_tokens + budget
        # 2. Prompts already part-way through prefill (and recomputes) continue. Short of KV
        # blocks they preempt the newest running request, possibly themselves, as vLLM V1 does
        # (docs/vllm-parity.md); a chunk shrunk to the free blocks would run a step vLLM never runs.
        for seq in ctx.running:
            if ctx.num_scheduled_tokens >= end:
                return
            if not seq.is_decoding and ctx.is_running(seq) and not ctx.is_scheduled(seq):
                ctx.schedule_running(seq, end - ctx.num_scheduled_tokens, preempt=True)
                if not ctx.is_running(seq):
                    return  # it preempted itself: nothing newer (fcfs) or lower (priority) is left
        # 3. New prompts, in the waiting queue's order, each chunked to what is left; none in a
        # step that preempted (vLLM V1: the preempted request, back in the queue ahead of newer
        # ones, goes first once blocks free up, and a new prompt must not take them).
        if any(not ctx.is_running(seq) for seq in ctx.running):
            return
        while ctx.num_scheduled_tokens < end and ctx.waiting:
            # SGLang's rule: a head short of blocks may preempt much lower priorities, then go.
            admitted = ctx.admit(end - ctx.num_scheduled_tokens)
            if not admitted and not (ctx.preempts_to_admit and ctx.preempt_for_head()):
                return

    def steadiness(self, plan: StepPlan, num_running: int) -> Steadiness:
        if self.num_speculative_tokens:
            return Steadiness.NONE  # how many drafts are accepted changes every step
        # Only decodes: a waiting head not admitted now stays out (slots and free blocks only
        # shrink while nothing finishes), but a new arrival may fit.
        if self._decodes_everything(plan, num_running):
            return Steadiness.UNTIL_ARRIVAL
        if self.step_budget_s is not None:
            # Contexts grow every step, so a time-sized chunk need not repeat: schedule each step.
            # (Only decodes, above, does repeat: the waiting head was refused for slots or blocks,
            # since the guard admits it whatever the time, and those only shrink.)
            return Steadiness.NONE
        # Decodes plus one prompt chunk that used up the budget: the same prompt gets the same
        # leftover next step (the scheduler checks it does not reach its last token); arrivals
        # find no budget left and only queue.
        prompt_chunks = [c for c in plan.chunks if not c.is_decode]
        if len(prompt_chunks) != 1:
            return Steadiness.NONE
        if self.chunk_tokens is not None:
            full = prompt_chunks[0].num_tokens == self.chunk_tokens
        else:
            full = plan.num_tokens == self.token_budget
        return Steadiness.IGNORES_ARRIVALS if full else Steadiness.NONE


class _WholePromptPolicy(Policy):
    """Prompts run whole, batched up to ``max_num_batched_tokens`` prompt tokens a step (None: no cap)."""

    def __init__(self, max_num_batched_tokens: int | None = None) -> None:
        if max_num_batched_tokens is not None and max_num_batched_tokens <= 0:
            raise ValueError(f"max_num_batched_tokens must be positive, got {max_num_batched_tokens}")
        self.max_num_batched_tokens = max_num_batched_tokens


class PrefillFirstPolicy(_WholePromptPolicy):
    """Waiting prompts first, whole, in their own step; then one decode step for all."""

    name = "prefill-first"

    def schedule(self, ctx: StepContext) -> None:
        if ctx.waiting and self._admit_whole(ctx, self.max_num_batched_tokens):
            return
        self._decode_all(ctx)

    def steadiness(self, plan: StepPlan, num_running: int) -> Steadiness:
        # A decode step means the waiting head did not fit; it keeps not fitting until
        # something finishes, but a new arrival may fit.
        return Steadiness.UNTIL_ARRIVAL if self._decodes_everything(plan, num_running) else Steadiness.NONE


class DecodeFirstPolicy(_WholePromptPolicy):
    """Request-level batching: decode while anything runs; admit prompts only when idle."""

    name = "decode-first"

    def schedule(self, ctx: StepContext) -> None:
        if ctx.num_running:
            self._decode_all(ctx)
        else:
            self._admit_whole(ctx, self.max_num_batched_tokens)

    def steadiness(self, plan: StepPlan, num_running: int) -> Steadiness:
        # Prompts wait while anything runs, so arrivals change nothing until a request finishes.
        if self._decodes_everything(plan, num_running):
            return Steadiness.IGNORES_ARRIVALS
        return Steadiness.NONE


POLICIES: dict[str, type[Policy]] = {
    p.name: p for p in (ChunkedPolicy, PrefillFirstPolicy, DecodeFirstPolicy)
}


def make_policy(
    name: str,
    *,
    token_budget: int | None = None,
    chunk_tokens: int | None = None,
    step_budget_s: float | None = None,
    predictor: StepTimePredictor | None = None,
    num_speculative_tokens: int = 0,
    speculative_rule: str = "vllm",
) -> Policy:
    """Build a policy by name; ``token_budget`` is the per-step token cap for every policy.

    For ``chunked`` exactly one of ``token_budget`` / ``chunk_tokens`` is needed
    (default: :data:`~stallfree.core.config.DEFAULT_TOKEN_BUDGET`) unless ``step_budget_s`` (with
    its ``predictor``) sizes chunks by time, when either is an optional cap; for the whole-prompt
    policies it caps how many prompt tokens one step batches (``None``: no cap).
    """
    if name not in POLICIES:
        raise ValueError(f"unknown policy {name!r}; choose from: {', '.join(POLICIES)}")
    if name == ChunkedPolicy.name:
        if token_budget is None and chunk_tokens is None and step_budget_s is None:
            token_budget = DEFAULT_TOKEN_BUDGET
        return ChunkedPolicy(
            token_budget=token_budget,
            chunk_tokens=chunk_tokens,
            step_budget_s=step_budget_s,
            predictor=predictor,
            num_speculative_tokens=num_speculative_tokens,
            speculative_rule=speculative_rule,
        )
    if num_speculative_tokens:
        raise ValueError(f"speculative decoding applies to the chunked policy only, not {name}")
    if chunk_tokens is not None:
        raise ValueError(f"--chunk-tokens applies to the chunked policy only, not {name}")
    if step_budget_s is not None:
        raise ValueError(f"a step-time budget applies to the chunked policy only, not {name}")
    cls = PrefillFirstPolicy if name == PrefillFirstPolicy.name else DecodeFirstPolicy
    return cls(max_num_batched_tokens=token_budget)
