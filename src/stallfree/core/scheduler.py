"""The pure scheduler: requests in, one immutable :class:`StepPlan` per step out.

It never reads a clock, sleeps or does I/O. Drivers call :meth:`Scheduler.schedule`,
hand the plan to an executor, and give the executor's :class:`StepResult` back
through :meth:`Scheduler.update_from_output`. *What* runs in a step is decided by
a :class:`~stallfree.core.policy.Policy` through the small API of
:class:`StepContext`; the scheduler owns the bookkeeping (queues, KV blocks,
preemption, finishing) so every policy keeps the same invariants:

- a request is in exactly one of waiting / running / gone;
- a running request holds exactly the KV blocks for its computed tokens
  (plus those scheduled this step); a waiting one holds none;
- a plan never schedules a request twice and never exceeds its known tokens.

A driver that prices many steps at once (the simulator) asks :meth:`Scheduler.steady_run` how
many times a plan repeats unchanged and applies them with :meth:`Scheduler.update_steady`;
the result equals scheduling each of those steps.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from stallfree.core.block_manager import BlockManager
from stallfree.core.context import StepContext
from stallfree.core.plan import StepPlan, StepResult
from stallfree.core.policy import Policy, Steadiness
from stallfree.core.request import FinishReason, Request


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """Limits that hold whatever the policy (vLLM's names)."""

    max_num_seqs: int = 256
    max_model_len: int | None = None

    def __post_init__(self) -> None:
        if self.max_num_seqs <= 0:
            raise ValueError(f"max_num_seqs must be positive, got {self.max_num_seqs}")
        if self.max_model_len is not None and self.max_model_len <= 0:
            raise ValueError(f"max_model_len must be positive, got {self.max_model_len}")


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """KV memory: ``num_blocks`` blocks of ``block_size`` tokens (``None``: unbounded).

    ``watermark`` is the fraction of blocks kept free when admitting new
    prompts, so running requests can grow a little before anyone is preempted.
    """

    block_size: int = 16
    num_blocks: int | None = None
    watermark: float = 0.01

    def __post_init__(self) -> None:
        if self.block_size <= 0:
            raise ValueError(f"block_size must be positive, got {self.block_size}")
        if self.num_blocks is not None and self.num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {self.num_blocks}")
        if not 0.0 <= self.watermark < 1.0:
            raise ValueError(f"watermark must be in [0, 1), got {self.watermark}")


class Sequence:
    """A request's progress inside the scheduler (internal; policies read it)."""

    # request_id and num_prompt_tokens are copied from the request: read on every step.
    __slots__ = ("num_computed_tokens", "num_output_tokens", "num_prompt_tokens", "request", "request_id")

    def __init__(self, request: Request) -> None:
        self.request = request
        self.request_id = request.request_id
        self.num_prompt_tokens = request.num_prompt_tokens
        self.num_computed_tokens = 0
        self.num_output_tokens = 0

    @property
    def num_known_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        return self.num_prompt_tokens + self.num_output_tokens - self.num_computed_tokens

    @property
    def is_decoding(self) -> bool:
        """Past its prompt (and any recompute): exactly one token left to run."""
        return self.num_output_tokens > 0 and self.num_uncomputed_tokens == 1


@dataclass(frozen=True, slots=True)
class StepEvents:
    """What a step changed, for drivers that timestamp tokens."""

    new_token_request_ids: tuple[str, ...]
    finished: tuple[tuple[str, FinishReason], ...]


class Scheduler:
    """Owns the queues and KV blocks; asks its policy what each step runs."""

    def __init__(self, config: SchedulerConfig, cache: CacheConfig, policy: Policy) -> None:
        policy.check_config(config)
        self.config = config
        self.cache_config = cache
        self.policy = policy
        self.block_manager = BlockManager(cache.block_size, cache.num_blocks)
        self._watermark_blocks = int(cache.watermark * cache.num_blocks) if cache.num_blocks else 0
        self._waiting: deque[Sequence] = deque()
        self._running: list[Sequence] = []
        self._running_by_id: dict[str, Sequence] = {}
        self._known_ids: set[str] = set()
        self._freed: list[str] = []
        self.num_preemptions = 0
        self.num_rejected = 0

    # -- requests ---------------------------------------------------------------
    def add_request(self, request: Request) -> str | None:
        """Queue ``request``; return why it can never run (it is then dropped), else None."""
        if request.request_id in self._known_ids:
            raise ValueError(f"request id {request.request_id!r} is already in the scheduler")
        reason = self._rejection_reason(request)
        if reason is not None:
            self.num_rejected += 1
            return reason
        self._known_ids.add(request.request_id)
        self._waiting.append(Sequence(request))
        return None

    def _rejection_reason(self, request: Request) -> str | None:
        total = request.num_prompt_tokens + request.max_tokens
        limit = self.config.max_model_len
        if limit is not None and total > limit:
            return f"prompt ({request.num_prompt_tokens}) + max_tokens ({request.max_tokens}) exceeds max_model_len ({limit})"
        bm = self.block_manager
        if bm.num_blocks is not None and bm.blocks_for(total) > bm.num_blocks - self._watermark_blocks:
            return (
                f"prompt + max_tokens ({total} tokens) needs {bm.blocks_for(total)} KV blocks; "
                f"the cache has {bm.num_blocks - self._watermark_blocks} usable"
            )
        return self.policy.rejection_reason(request)

    def abort_request(self, request_id: str) -> bool:
        """Drop a waiting or running request and free its blocks; False if unknown."""
        if request_id not in self._known_ids:
            return False
        self._known_ids.discard(request_id)
        if self._running_by_id.pop(request_id, None) is not None:
            self._running = [s for s in self._running if s.request_id != request_id]
            self.block_manager.free(request_id)
            self._freed.append(request_id)
        else:
            self._waiting = deque(s for s in self._waiting if s.request_id != request_id)
        return True

    # -- state ------------------------------------------------------------------
    def has_unfinished_requests(self) -> bool:
        return bool(self._waiting or self._running)

    @property
    def num_running(self) -> int:
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        return len(self._waiting)

    def running(self) -> Iterator[Sequence]:
        return iter(self._running)

    # -- the step -----------------------------------------------------------------
    def schedule(self) -> StepPlan:
        ctx = StepContext(self)
        self.policy.schedule(ctx)
        plan = ctx.build(tuple(self._freed))
        self._freed.clear()
        return plan

    def update_from_output(self, plan: StepPlan, result: StepResult) -> StepEvents:
        """Advance the scheduled requests; finish those at max_tokens or stopped."""
        new_tokens: list[str] = []
        finished: list[tuple[str, FinishReason]] = []
        stopped = result.stopped_request_ids
        running = self._running_by_id
        for chunk in plan.chunks:
            rid = chunk.request_id
            seq = running.get(rid)
            if seq is None:  # aborted between schedule() and now
                continue
            seq.num_computed_tokens += chunk.num_tokens
            if chunk.num_computed_tokens + chunk.num_tokens != chunk.num_known_tokens:
                continue
            seq.num_output_tokens += 1
            new_tokens.append(rid)
            if rid in stopped:
                finished.append((rid, FinishReason.STOP))
            elif seq.num_output_tokens >= seq.request.max_tokens:
                finished.append((rid, FinishReason.LENGTH))
        if finished:
            self._finish(finished)
        return StepEvents(tuple(new_tokens), tuple(finished))

    def _finish(self, finished: list[tuple[str, FinishReason]]) -> None:
        running = self._running_by_id
        for rid, _ in finished:
            del running[rid]
            self._known_ids.discard(rid)
            self.block_manager.free(rid)
            self._freed.append(rid)
        self._running = [s for s in self._running if s.request_id in running]

    # -- steady runs (the simulator's fast path) ------------------------------------------
    def steady_run(self, plan: StepPlan) -> tuple[int, bool]:
        """How many steps in a row ``plan`` runs, this one included, if nothing arrives.

        Call it right after :meth:`schedule` returned ``plan``. The count stops at the step in
        which a request finishes, before any prompt chunk would reach its last token, and
        before the running requests would need more KV blocks than are free. The flag says
        whether an arrival would end the run sooner (then the driver cuts it at the first step
        that starts at or after the arrival). Returns ``(1, False)`` when the policy says the
        plan does not repeat (:meth:`Policy.steadiness`).
        """
        steadiness = self.policy.steadiness(plan, len(self._running))
        if steadiness is Steadiness.NONE or plan.preempted_request_ids:
            return 1, False
        running = self._running_by_id
        num_steps = 1 << 62
        for chunk in plan.chunks:
            seq = running[chunk.request_id]
            if chunk.samples:
                # Only decodes may sample in a steady run; a one-token last prompt chunk looks
                # like a decode in the plan but makes the request decode from the next step on.
                if chunk.num_tokens != 1 or seq.num_output_tokens == 0:
                    return 1, False
                num_steps = min(num_steps, seq.request.max_tokens - seq.num_output_tokens)
            else:
                # Steps 1..k run without reaching the last token: u - k * c >= 1.
                num_steps = min(num_steps, (seq.num_uncomputed_tokens - 1) // chunk.num_tokens)
        if num_steps > 1 and self.block_manager.num_blocks is not None:
            num_steps = self._steps_within_free_blocks(plan, num_steps)
        return max(num_steps, 1), steadiness is Steadiness.UNTIL_ARRIVAL

    def _steps_within_free_blocks(self, plan: StepPlan, num_steps: int) -> int:
        """The largest k <= num_steps whose steps 2..k find their new blocks free."""
        bm = self.block_manager
        free = bm.num_free_blocks or 0
        bs = bm.block_size

        def extra_blocks(k: int) -> int:
            return sum(
                -(-(c.num_computed_tokens + k * c.num_tokens) // bs)
                + ((c.num_computed_tokens + c.num_tokens) // -bs)
                for c in plan.chunks
            )

        # ceil((a + k c) / bs) - ceil((a + c) / bs) <= ceil((k - 1) c / bs): usually enough.
        if sum(-(-(num_steps - 1) * c.num_tokens // bs) for c in plan.chunks) <= free:
            return num_steps
        low, high = 1, num_steps  # extra_blocks(1) == 0 <= free; find the largest k that fits
        while low < high:
            mid = (low + high + 1) // 2
            if extra_blocks(mid) <= free:
                low = mid
            else:
                high = mid - 1
        return low

    def update_steady(self, plan: StepPlan, num_steps: int) -> StepEvents:
        """Apply ``num_steps`` runs of ``plan`` at once, as that many :meth:`update_from_output`
        calls (with the plans :meth:`schedule` would have made in between) would.

        ``num_steps`` must not exceed :meth:`steady_run`'s count. The blocks of steps 2.. are
        allocated here, not announced in a plan: for drivers whose executor keeps no block
        tables (the simulator). ``new_token_request_ids`` lists each decode once; it got one
        token per step.
        """
        if num_steps == 1:
            return self.update_from_output(plan, StepResult(0.0))
        new_tokens: list[str] = []
        finished: list[tuple[str, FinishReason]] = []
        running = self._running_by_id
        bm = self.block_manager
        block_size = bm.block_size
        for chunk in plan.chunks:
            rid = chunk.request_id
            seq = running[rid]
            computed = seq.num_computed_tokens = chunk.num_computed_tokens + num_steps * chunk.num_tokens
            # It holds the blocks of its first step's context; grow only past them.
            if -(-computed // block_size) > -(-chunk.context_len // block_size):
                bm.allocate(rid, computed)
            if chunk.samples:
                seq.num_output_tokens += num_steps
                new_tokens.append(rid)
                if seq.num_output_tokens >= seq.request.max_tokens:
                    finished.append((rid, FinishReason.LENGTH))
        if finished:
            self._finish(finished)
        return StepEvents(tuple(new_tokens), tuple(finished))
