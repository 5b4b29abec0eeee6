"""The pure scheduler: requests in, one immutable :class:`StepPlan` per step out.

It never reads a clock, sleeps or does I/O. Drivers call :meth:`Scheduler.schedule`, hand the
plan to an executor, and give the executor's :class:`StepResult` back through
:meth:`Scheduler.update_from_output`. The whole algorithm, in order:

1. ``add_request`` rejects what can never run (longer than ``max_model_len``, more KV blocks
   than the cache has, or what the policy refuses) and queues the rest, first come first served
   (or by priority: ``SchedulerConfig.scheduling_policy``);
2. ``schedule`` lets the :class:`~stallfree.core.policy.Policy` fill one step through a
   :class:`~stallfree.core.context.StepContext`, which allocates KV blocks for every scheduled
   token, admits within ``max_num_seqs`` and the watermark, and preempts the newest running
   request when blocks run out (the lowest-priority one under ``priority``);
3. ``update_from_output`` advances every scheduled request and finishes those that stopped or
   reached ``max_tokens``; their blocks are freed and announced in the next plan (held instead,
   for a request whose KV goes to a decode server, until :meth:`Scheduler.release_kv`). A decode that
   verified draft tokens keeps the accepted ones (and the token after them); the KV slots of the
   rejected ones are released, their blocks announced as trimmed in the next plan.

State lives in a :class:`~stallfree.core.state.SchedulerState` (see its invariants). A driver
that prices many steps at once (the simulator) uses :meth:`steady_run` / :meth:`update_steady`
(:mod:`stallfree.core.steady`); the result equals scheduling each of those steps.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from mypy_extensions import mypyc_attr

from stallfree.core.block_manager import BlockManager
from stallfree.core.config import CacheConfig, SchedulerConfig
from stallfree.core.context import StepContext
from stallfree.core.plan import StepPlan, StepResult
from stallfree.core.policy import Policy
from stallfree.core.request import FinishReason, Request
from stallfree.core.state import SchedulerState, Sequence
from stallfree.core.steady import SteadyRun, apply_steady, steady_run

_NO_DRAFTS: Mapping[str, int] = MappingProxyType({})


class StepEvents:
    """What a step changed, for drivers that timestamp tokens: each request in
    ``new_token_request_ids`` got one token, plus ``num_accepted_drafts`` more where it verified
    drafts (speculative decoding). Immutable (``Final`` attributes), a plain class as
    :class:`~stallfree.core.plan.StepPlan` is: one is made every step."""

    __slots__ = ("finished", "new_token_request_ids", "num_accepted_drafts")

    def __init__(
        self,
        new_token_request_ids: tuple[str, ...],
        finished: tuple[tuple[str, FinishReason], ...],
        num_accepted_drafts: Mapping[str, int] = _NO_DRAFTS,
    ) -> None:
        self.new_token_request_ids: Final = new_token_request_ids
        self.finished: Final = finished
        self.num_accepted_drafts: Final = num_accepted_drafts


@mypyc_attr(allow_interpreted_subclasses=True)  # tests check it by subclassing (compiled build)
class Scheduler:
    """Owns the queues and KV blocks; asks its policy what each step runs."""

    def __init__(self, config: SchedulerConfig, cache: CacheConfig, policy: Policy) -> None:
        policy.check_config(config)
        self.config = config
        self.cache_config = cache
        self.policy = policy
        self.state = SchedulerState(cache, by_priority=config.scheduling_policy != "fcfs")
        self._known_ids: set[str] = set()
        self._freed: list[str] = []  # released since the last plan: announced in the next
        self._trimmed: dict[str, int] = {}  # blocks kept by requests whose rejected drafts' were released
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
        self.state.add(request)
        return None

    def rejection_reason(self, request: Request) -> str | None:
        """Why :meth:`add_request` would refuse ``request`` (None: it would queue it)."""
        return self._rejection_reason(request)

    def _rejection_reason(self, request: Request) -> str | None:
        total = request.num_prompt_tokens + request.max_tokens
        limit = self.config.max_model_len
        if limit is not None and total > limit:
            return f"prompt ({request.num_prompt_tokens}) + max_tokens ({request.max_tokens}) exceeds max_model_len ({limit})"
        bm = self.state.block_manager
        usable = None if bm.num_blocks is None else bm.num_blocks - self.state.watermark_blocks
        if usable is not None and bm.blocks_for(total) > usable:
            return (
                f"prompt + max_tokens ({total} tokens) needs {bm.blocks_for(total)} KV blocks; "
                f"the cache has {usable} usable"
            )
        return self.policy.rejection_reason(request)

    def abort_request(self, request_id: str) -> bool:
        """Drop a waiting or running request and free its blocks; False if unknown."""
        if request_id not in self._known_ids:
            return False
        self._known_ids.discard(request_id)
        if request_id in self.state.running_by_id:
            self.state.finish((request_id,))
            if request_id in self.state.held:  # aborted: no decode server will read it
                self.state.release(request_id)
            self._freed.append(request_id)
        else:
            self.state.drop_waiting(request_id)
        return True

    # -- state ------------------------------------------------------------------
    def has_request(self, request_id: str) -> bool:
        """``request_id`` waits or runs here."""
        return request_id in self._known_ids

    def has_unfinished_requests(self) -> bool:
        return bool(self.state.waiting or self.state.running)

    @property
    def num_running(self) -> int:
        return len(self.state.running)

    @property
    def num_waiting(self) -> int:
        return len(self.state.waiting)

    @property
    def running(self) -> tuple[Sequence, ...]:
        """Running requests in admission order, oldest first (a snapshot)."""
        return tuple(self.state.running)

    @property
    def block_manager(self) -> BlockManager:
        return self.state.block_manager

    @property
    def num_preemptions(self) -> int:
        return self.state.num_preemptions

    # -- the step -----------------------------------------------------------------
    def schedule(self) -> StepPlan:
        ctx = StepContext(self.state, self.config)
        self.policy.schedule(ctx)
        trimmed = self._trimmed
        plan = ctx.build(tuple(self._freed), trimmed)
        self._freed.clear()
        if trimmed:  # the plan keeps this dict: start a new one
            self._trimmed = {}
        return plan

    def update_from_output(self, plan: StepPlan, result: StepResult) -> StepEvents:
        """Advance the scheduled requests; finish those at max_tokens or stopped."""
        new_tokens: list[str] = []
        finished: list[tuple[str, FinishReason]] = []
        stopped = result.stopped_request_ids
        running = self.state.running_by_id
        if result.sampled_token_ids and self.state.block_manager.enable_prefix_caching:
            accepted_ids = result.accepted_draft_ids
            for rid, token_id in result.sampled_token_ids.items():
                if (seq := running.get(rid)) is not None:
                    for draft_id in accepted_ids.get(rid, ()):
                        self.state.key_sampled(seq, draft_id)
                    self.state.key_sampled(seq, token_id)
        accepted: dict[str, int] = {}
        proposed = result.num_proposed_drafts
        for chunk in plan.chunks:
            rid = chunk.request_id
            seq = running.get(rid)
            if seq is None:  # aborted between schedule() and now
                continue
            seq.num_computed_tokens += chunk.num_tokens
            if not chunk.emits_token:
                continue
            if chunk.num_draft_tokens:
                self._verified(seq, chunk.num_draft_tokens, result.num_accepted_drafts.get(rid, 0), accepted)
            if proposed:
                seq.num_proposed_drafts = proposed.get(rid, 0)
            seq.num_output_tokens += 1
            new_tokens.append(rid)
            if rid in stopped:
                finished.append((rid, FinishReason.STOP))
            elif seq.num_output_tokens >= seq.request.max_tokens:
                finished.append((rid, FinishReason.LENGTH))
        if finished:
            self._finish([rid for rid, _ in finished])
        return StepEvents(tuple(new_tokens), tuple(finished), accepted)

    def _verified(self, seq: Sequence, num_drafts: int, num_accepted: int, accepted: dict[str, int]) -> None:
        """``seq`` ran ``num_drafts`` draft tokens (counted as computed) and ``num_accepted`` of them
        were right: keep those as output, release the slots of the rest."""
        if not 0 <= num_accepted <= num_drafts:
            raise ValueError(f"request {seq.request_id}: {num_accepted} of {num_drafts} drafts accepted")
        seq.num_computed_tokens -= num_drafts - num_accepted
        if num_accepted:
            seq.num_output_tokens += num_accepted
            accepted[seq.request_id] = num_accepted
            self.state.cache_computed(seq, seq.num_computed_tokens)
        kept = self.state.block_manager.trim(seq.request_id, seq.num_computed_tokens)
        if kept is not None:
            self._trimmed[seq.request_id] = kept

    def _finish(self, request_ids: list[str]) -> None:
        state = self.state
        state.finish(request_ids)
        self._known_ids.difference_update(request_ids)
        self._freed.extend(rid for rid in request_ids if rid not in state.held)

    def release_kv(self, request_id: str) -> None:
        """A decode server has the KV of finished ``request_id`` (``Request.sends_kv``): free its
        blocks, announced in the next plan."""
        if request_id not in self.state.held:
            raise ValueError(f"request {request_id!r} holds no KV for a transfer")
        self.state.release(request_id)
        self._freed.append(request_id)

    @property
    def num_held_kv(self) -> int:
        """Finished requests whose blocks wait for a decode server to take their KV."""
        return len(self.state.held)

    # -- steady runs (the simulator's fast path) ------------------------------------------
    def steady_run(self, plan: StepPlan) -> SteadyRun:
        """How many steps in a row ``plan`` runs (see :func:`stallfree.core.steady.steady_run`)."""
        return steady_run(self.state, self.policy, plan)

    def update_steady(self, plan: StepPlan, num_steps: int) -> StepEvents:
        """Apply ``num_steps`` runs of ``plan`` at once, as that many :meth:`update_from_output`
        calls (with the plans :meth:`schedule` would have made in between) would.

        ``num_steps`` must not exceed :meth:`steady_run`'s count. ``new_token_request_ids`` lists
        each decode once; it got one token per step.
        """
        if num_steps == 1:
            return self.update_from_output(plan, StepResult(0.0))
        new_tokens, at_max_tokens = apply_steady(self.state, plan, num_steps)
        if at_max_tokens:
            self._finish(at_max_tokens)
        return StepEvents(tuple(new_tokens), tuple((rid, FinishReason.LENGTH) for rid in at_max_tokens))
