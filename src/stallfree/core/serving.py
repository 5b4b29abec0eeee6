"""How one replica schedules, in one place: the simulator, the engine, the server and tune all
build their scheduler from a :class:`ServingConfig` (field names are vLLM's engine arguments).

Rules that used to be re-derived by each (and drifted apart) live here:

- the chunked policy's budget defaults to :data:`DEFAULT_TOKEN_BUDGET`;
- ``max_num_seqs`` defaults to 256 and, for a chunked budget, to at most the budget (every
  running request needs its decode token inside it); an explicit value above the budget is an
  error, as in vLLM;
- the whole-prompt policies batch prompts up to ``max_num_batched_tokens``, by default
  ``max_model_len`` (vLLM without chunked prefill);
- ``max_model_len`` defaults to the model's context and may not exceed it;
- ``step_budget_ms`` (chunked only) sizes chunks by a step-time target; the scheduler then needs
  a step-time predictor from whoever builds it, and the token cap defaults to
  :data:`DEFAULT_STEP_TOKEN_CAP` (what activation memory is sized for).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from stallfree.core.config import (
    DEFAULT_STEP_TOKEN_CAP,
    DEFAULT_TOKEN_BUDGET,
    CacheConfig,
    SchedulerConfig,
    ceil_div,
)
from stallfree.core.policy import (
    POLICIES,
    SPECULATIVE_RULES,
    ChunkedPolicy,
    Policy,
    check_budget_holds_seqs,
    make_policy,
)
from stallfree.core.scheduler import Scheduler
from stallfree.core.time_budget import StepTimePredictor

DEFAULT_MAX_NUM_SEQS = 256
OPTION_ALIASES = {"token_budget": "max_num_batched_tokens"}  # the Sarathi-Serve name


@dataclass(frozen=True, slots=True, kw_only=True)
class ServingConfig:
    """The scheduling half of a deployment (the model and hardware are the other half).

    ``max_num_batched_tokens``: the chunked policy's per-step token budget, decodes included
    (vLLM's ``--max-num-batched-tokens``, SGLang's ``--chunked-prefill-size``); for the
    whole-prompt policies, how many prompt tokens one step batches. ``chunk_tokens`` instead
    gives chunked a fixed number of prompt tokens per step on top of the decodes (the seed's
    view). ``num_blocks`` None: the runner sizes the KV cache from memory.

    ``step_budget_ms``: chunked steps hold the prompt tokens whose predicted step time stays
    within this many milliseconds (decodes always run); a token budget or ``chunk_tokens`` given
    with it caps the step on top. Building its scheduler needs a step-time predictor.

    ``enable_prefix_caching`` (on by default, as in vLLM V1): requests whose prompts say what
    they are (:class:`~stallfree.core.request.PromptBlocks`) reuse each other's cached full
    prompt blocks; requests that do not are never cached.

    ``num_speculative_tokens`` (chunked only): each decode may verify up to this many draft
    tokens a step, shared with prompt chunks by ``speculative_rule``
    (:data:`~stallfree.core.policy.SPECULATIVE_RULES`: ``vllm`` or ``sglang``).

    ``scheduling_policy``: ``fcfs`` or ``priority`` (vLLM's ``--scheduling-policy``: who waits
    first and who is preempted, :data:`~stallfree.core.config.SCHEDULING_POLICIES`).
    """

    policy: str = "chunked"
    max_num_batched_tokens: int | None = None
    chunk_tokens: int | None = None
    max_num_seqs: int | None = None
    max_model_len: int | None = None
    block_size: int = 16
    num_blocks: int | None = None
    watermark: float = 0.01
    step_budget_ms: float | None = None
    enable_prefix_caching: bool = True
    num_speculative_tokens: int = 0
    speculative_rule: str = "vllm"
    scheduling_policy: str = "fcfs"

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown policy {self.policy!r}; choose from: {', '.join(POLICIES)}")
        for name in ("max_num_batched_tokens", "chunk_tokens", "max_num_seqs", "max_model_len", "num_blocks"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ValueError(f"{name} must be positive, got {value}")
        if self.chunk_tokens is not None:
            if self.policy != ChunkedPolicy.name:
                raise ValueError(f"chunk_tokens applies to the chunked policy only, not {self.policy}")
            if self.max_num_batched_tokens is not None:
                raise ValueError("chunked: give either a token budget or chunk_tokens, not both")
        if self.step_budget_ms is not None:
            if not (math.isfinite(self.step_budget_ms) and self.step_budget_ms > 0):
                raise ValueError(f"step_budget_ms must be positive, got {self.step_budget_ms}")
            if self.policy != ChunkedPolicy.name:
                raise ValueError(f"step_budget_ms applies to the chunked policy only, not {self.policy}")
        if self.num_speculative_tokens:
            if self.num_speculative_tokens < 0:
                raise ValueError(f"num_speculative_tokens must be >= 0, got {self.num_speculative_tokens}")
            if self.policy != ChunkedPolicy.name:
                raise ValueError(
                    f"speculative decoding applies to the chunked policy only, not {self.policy}"
                )
            if self.step_budget_ms is not None:
                raise ValueError("step_budget_ms does not combine with speculative decoding")
        if self.speculative_rule not in SPECULATIVE_RULES:
            raise ValueError(
                f"unknown speculative rule {self.speculative_rule!r}; choose from: {', '.join(SPECULATIVE_RULES)}"
            )
        CacheConfig(block_size=self.block_size, watermark=self.watermark)  # validates both
        SchedulerConfig(scheduling_policy=self.scheduling_policy)  # validates it
        check_budget_holds_seqs(self.token_budget, self.max_num_seqs)

    @classmethod
    def from_options(cls, **options: Any) -> ServingConfig:
        """Build from keyword options (``token_budget`` is ``max_num_batched_tokens``)."""
        fields = {OPTION_ALIASES.get(name, name): value for name, value in options.items()}
        unknown = sorted(set(fields) - set(cls.__dataclass_fields__))
        if unknown:
            raise ValueError(f"unknown serving option(s): {', '.join(unknown)}")
        return cls(**fields)

    @property
    def budget_is_default(self) -> bool:
        """Chunked with no token budget, chunk size or step-time budget given."""
        return (
            self.policy == ChunkedPolicy.name
            and self.max_num_batched_tokens is None
            and self.chunk_tokens is None
            and self.step_budget_ms is None
        )

    @property
    def token_budget(self) -> int | None:
        """The chunked policy's tokens per step, decodes included (None: not a budgeted chunked run)."""
        if self.policy != ChunkedPolicy.name or self.chunk_tokens is not None:
            return None
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return DEFAULT_STEP_TOKEN_CAP if self.step_budget_ms is not None else DEFAULT_TOKEN_BUDGET

    def at_most_seqs(self, limit: int) -> ServingConfig:
        """This config running at most ``limit`` sequences, fewer where a chunked token budget is
        smaller (every running request needs its decode token each step; vLLM refuses
        ``--max-num-seqs`` above ``--max-num-batched-tokens``)."""
        budget = self.token_budget
        return replace(self, max_num_seqs=limit if budget is None else min(limit, budget))

    @property
    def step_budget_s(self) -> float | None:
        """``step_budget_ms`` in seconds (None: chunks sized by tokens)."""
        return None if self.step_budget_ms is None else self.step_budget_ms / 1000

    @property
    def num_seqs_limit(self) -> int:
        """``max_num_seqs`` as it applies: the default is capped at a chunked budget."""
        if self.max_num_seqs is not None:
            return self.max_num_seqs
        budget = self.token_budget
        return DEFAULT_MAX_NUM_SEQS if budget is None else min(DEFAULT_MAX_NUM_SEQS, budget)

    def model_len(self, model_context: int) -> int:
        """``max_model_len`` for a model whose context is ``model_context`` tokens."""
        if self.max_model_len is None:
            return model_context
        if self.max_model_len > model_context:
            raise ValueError(
                f"max_model_len {self.max_model_len} exceeds the model's context of {model_context}"
            )
        return self.max_model_len

    def full_contexts_num_blocks(self, model_context: int) -> int:
        """KV blocks for ``num_seqs_limit`` sequences at ``model_len`` tokens each: all a replica
        can ever hold at once (the engine's cache where memory allows)."""
        return self.num_seqs_limit * ceil_div(self.model_len(model_context), self.block_size)

    def step_token_cap(self, model_context: int) -> int:
        """The most tokens one step can hold (what activation memory is sized for)."""
        if self.chunk_tokens is not None:
            return self.chunk_tokens + self.num_seqs_limit  # decodes ride on top of the chunk
        if self.token_budget is not None:
            return self.token_budget
        # The first prompt of a step runs whole even past the cap.
        return max(self.whole_prompt_cap(model_context), self.model_len(model_context))

    def whole_prompt_cap(self, model_context: int) -> int:
        """Prompt tokens a prefill-first or decode-first step batches."""
        if self.max_num_batched_tokens is not None:
            return self.max_num_batched_tokens
        return self.model_len(model_context)

    def make_policy(self, model_context: int, predictor: StepTimePredictor | None = None) -> Policy:
        """The named policy; ``predictor`` (a function ``StepPlan -> seconds``) is required with
        ``step_budget_ms`` and unused without it."""
        if self.policy == ChunkedPolicy.name:
            if self.step_budget_ms is not None and predictor is None:
                raise ValueError(
                    "step_budget_ms needs a step-time predictor: the simulator passes its cost model, "
                    "the engine a measured profile (stallfree profile, then --profile FILE)"
                )
            return make_policy(
                self.policy,
                token_budget=self.token_budget,
                chunk_tokens=self.chunk_tokens,
                step_budget_s=self.step_budget_s,
                predictor=predictor if self.step_budget_ms is not None else None,
                num_speculative_tokens=self.num_speculative_tokens,
                speculative_rule=self.speculative_rule,
            )
        return make_policy(self.policy, token_budget=self.whole_prompt_cap(model_context))

    def make_scheduler(
        self, model_context: int, num_blocks: int | None = None, predictor: StepTimePredictor | None = None
    ) -> Scheduler:
        """A scheduler for a model of ``model_context`` tokens over ``num_blocks`` KV blocks
        (this config's ``num_blocks`` wins; None for both: unbounded); ``predictor`` prices steps
        for ``step_budget_ms`` (see :meth:`make_policy`)."""
        return Scheduler(
            SchedulerConfig(
                max_num_seqs=self.num_seqs_limit,
                max_model_len=self.model_len(model_context),
                scheduling_policy=self.scheduling_policy,
            ),
            CacheConfig(
                block_size=self.block_size,
                num_blocks=self.num_blocks if self.num_blocks is not None else num_blocks,
                watermark=self.watermark,
                enable_prefix_caching=self.enable_prefix_caching,
            ),
            self.make_policy(model_context, predictor),
        )
