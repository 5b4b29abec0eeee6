"""What the scheduler is configured with: sequence limits and KV memory (vLLM's names).

Values only: frozen, validated on construction. :data:`DEFAULT_TOKEN_BUDGET` is the chunked
policy's step size when none is given, everywhere (simulator, engine, server, tune);
:data:`DEFAULT_STEP_TOKEN_CAP` the token cap of a time-budgeted one.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_TOKEN_BUDGET = 512
"""Tokens per step, decodes included, when a chunked run names no budget (vLLM's V0 chunked default)."""

DEFAULT_STEP_TOKEN_CAP = 16384
"""Tokens per step at most when a time-budgeted chunked run names no token cap: the step-time
target decides the chunks, this only bounds the activation memory a step may need (SGLang's
default ``--max-prefill-tokens``)."""


PRIORITY_PREEMPTION_THRESHOLD = 10
"""``sglang-priority``: how far apart two priorities must be for the waiting one to preempt the
running one (SGLang's ``--priority-scheduling-preemption-threshold`` default)."""

SCHEDULING_POLICIES = {
    "fcfs": "the waiting queue in arrival order; short of KV blocks the newest running request is "
    "preempted (vLLM's default)",
    "priority": "the waiting queue by each request's priority (lower first), then arrival; short of KV "
    "blocks the running request of the lowest priority (highest value), latest arrival, is preempted "
    "(vLLM's --scheduling-policy priority)",
    "sglang-priority": "as priority, and a waiting request that finds no KV blocks preempts running ones "
    f"whose priority is more than {PRIORITY_PREEMPTION_THRESHOLD} below its own (SGLang's "
    "--enable-priority-scheduling --schedule-low-priority-values-first)",
}
"""Which request waits and which is preempted (vLLM's ``--scheduling-policy``; SGLang's rule beside)."""


@dataclass(frozen=True, slots=True)
class ShedRule:
    """Refuse sheddable requests (``priority >= min_priority``) while ``max_waiting`` or more wait
    for a first token: a batch job's requests are turned away first, before an overload bound
    refuses everyone (llm-d's flow control sheds its sheddable bands the same way). ``serve``
    answers them 429 with Retry-After; the simulator records them rejected, saying why."""

    min_priority: int
    max_waiting: int

    def __post_init__(self) -> None:
        for name in ("min_priority", "max_waiting"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"shedding's {name} must be an integer, got {value!r}")
        if self.max_waiting < 0:
            raise ValueError(f"the shedding bound must be >= 0 waiting requests, got {self.max_waiting}")

    def sheds(self, priority: int, num_waiting: int) -> bool:
        return priority >= self.min_priority and num_waiting >= self.max_waiting

    def reason(self, num_waiting: int) -> str:
        return f"shed: priority >= {self.min_priority} while {num_waiting} requests wait for a first token"


def ceil_div(a: int, b: int) -> int:
    """``ceil(a / b)`` for non-negative ``a`` and positive ``b``, in integers."""
    return -(-a // b)


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Limits that hold whatever the policy, and the queues' order (:data:`SCHEDULING_POLICIES`)."""

    max_num_seqs: int = 256
    max_model_len: int | None = None
    scheduling_policy: str = "fcfs"

    def __post_init__(self) -> None:
        if self.max_num_seqs <= 0:
            raise ValueError(f"max_num_seqs must be positive, got {self.max_num_seqs}")
        if self.max_model_len is not None and self.max_model_len <= 0:
            raise ValueError(f"max_model_len must be positive, got {self.max_model_len}")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(
                f"unknown scheduling policy {self.scheduling_policy!r}; choose from: {', '.join(SCHEDULING_POLICIES)}"
            )


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """KV memory: ``num_blocks`` blocks of ``block_size`` tokens (``None``: unbounded).

    ``watermark`` is the fraction of blocks kept free when admitting new
    prompts, so running requests can grow a little before anyone is preempted.
    ``enable_prefix_caching``: full prompt blocks are cached and shared by requests whose
    prompts start alike (:mod:`stallfree.core.block_manager`).
    """

    block_size: int = 16
    num_blocks: int | None = None
    watermark: float = 0.01
    enable_prefix_caching: bool = False

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        if self.num_blocks is not None and self.num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {self.num_blocks}")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark}")

    @property
    def watermark_blocks(self) -> int:
        """Blocks admission leaves free (0 for an unbounded cache)."""
        return int(self.watermark * self.num_blocks) if self.num_blocks else 0
