"""Requests as the scheduler sees them: immutable descriptions, no token ids.

A :class:`Request` says how long its prompt is and how many tokens it may
generate, and optionally what its prompt is (:class:`PromptBlocks`), which is all the
prefix cache needs to tell which prompts share a prefix. Progress (tokens computed, blocks held) lives inside the scheduler,
never on the request, so one request object can be replayed through several
schedulers. :class:`SamplingParams` travels beside it for executors that
sample real tokens; the scheduler only reads ``max_tokens``.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field


class FinishReason(enum.Enum):
    """Why a request left the scheduler (values match OpenAI's ``finish_reason``)."""

    LENGTH = "length"  # generated max_tokens
    STOP = "stop"  # the executor saw EOS, a stop token or a stop string
    ABORT = "abort"  # the client went away or the caller aborted it
    REJECTED = "rejected"  # can never run under this configuration (see reason)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to pick tokens; vLLM's names. ``temperature == 0`` is greedy."""

    max_tokens: int = 16
    temperature: float = 1.0
    top_k: int = 0  # 0: no top-k cut
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: tuple[int, ...] = ()
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False
    logprobs: bool = False  # the sampled token's logprob at each generated position
    top_logprobs: int = 0  # and this many most likely alternatives (with logprobs)

    def __post_init__(self) -> None:
        if self.max_tokens <= 0:
            raise ValueError(f"max_tokens must be positive, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_logprobs < 0:
            raise ValueError(f"top_logprobs must be >= 0, got {self.top_logprobs}")


@dataclass(frozen=True, slots=True)
class PromptBlocks:
    """A prompt's content as the prefix cache sees it: ``ids[i]`` names prompt tokens
    ``[i * tokens_per_id, (i + 1) * tokens_per_id)``, and equal ids mean equal tokens.

    The engine gives token ids (``tokens_per_id`` 1); a trace gives block hash ids (Mooncake's:
    512 tokens each). Ids may cover fewer tokens than the prompt (the rest is never shared) or go
    on into the tokens the request will generate, where its workload knows them (a multi-turn
    session's answers, which the next turn's prompt repeats), so those blocks are cached too.
    """

    ids: tuple[int, ...]
    tokens_per_id: int = 1
    num_tokens: int | None = None  # tokens the ids name, if fewer than all (a partial last id)

    def __post_init__(self) -> None:
        if self.tokens_per_id <= 0:
            raise ValueError(f"tokens_per_id must be positive, got {self.tokens_per_id}")
        if self.num_tokens is not None and not 0 <= self.num_tokens <= len(self.ids) * self.tokens_per_id:
            raise ValueError(
                f"num_tokens must be in [0, {len(self.ids) * self.tokens_per_id}], got {self.num_tokens}"
            )

    @property
    def num_named_tokens(self) -> int:
        """How many tokens, from the first, the ids name."""
        return len(self.ids) * self.tokens_per_id if self.num_tokens is None else self.num_tokens


@dataclass(frozen=True, slots=True)
class Request:
    """One generation request: ``num_prompt_tokens`` in, up to ``max_tokens`` out."""

    request_id: str
    num_prompt_tokens: int
    max_tokens: int
    arrival_time_s: float = 0.0
    sampling: SamplingParams | None = field(default=None, compare=False)
    prompt_blocks: PromptBlocks | None = field(default=None, compare=False, repr=False)
    # the conversation it belongs to (a session-affine router keys on it); None: none said
    session_id: str | None = field(default=None, compare=False, repr=False)
    # Disaggregated serving. On a decode server: the KV of this many prompt tokens arrives with the
    # request (a prefill server computed them; vLLM's remote prefill), so it starts after them as
    # after a prefix-cache hit, its last prompt token run again for logits. On a prefill server:
    # ``sends_kv``, its KV goes to a decode server, so its blocks stay held once it finishes,
    # until :meth:`~stallfree.core.scheduler.Scheduler.release_kv`.
    num_external_tokens: int = field(default=0, compare=False, repr=False)
    sends_kv: bool = field(default=False, compare=False, repr=False)
    # vLLM's request priority: lower runs first under the "priority" scheduling policy (ignored
    # under "fcfs"); any integer, negative included, as vLLM takes it
    priority: int = field(default=0, compare=False, repr=False)
    # the kind of traffic it belongs to (per-class metrics group by it); None: one class
    traffic_class: str | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.num_prompt_tokens <= 0:
            raise ValueError(f"request {self.request_id}: num_prompt_tokens must be positive")
        if self.max_tokens <= 0:
            raise ValueError(f"request {self.request_id}: max_tokens must be positive")
        if not (math.isfinite(self.arrival_time_s) and self.arrival_time_s >= 0):
            raise ValueError(f"request {self.request_id}: arrival_time_s must be finite and >= 0")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise ValueError(f"request {self.request_id}: priority must be an integer, got {self.priority!r}")
        if not 0 <= self.num_external_tokens <= self.num_prompt_tokens:
            raise ValueError(
                f"request {self.request_id}: num_external_tokens must be in [0, num_prompt_tokens]"
            )
