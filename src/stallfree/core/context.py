"""The API a policy builds one step with: :class:`StepContext`.

A context is made by :meth:`Scheduler.schedule` for one step and lives only while the policy
fills it. Its two actions keep the scheduler's invariants whatever the policy asks: a chunk
never runs past a request's known tokens, KV blocks are allocated for every scheduled token
(preempting the newest running request, by recompute, when they run out), new requests are
admitted only within ``max_num_seqs`` and above the KV watermark, and no request is scheduled
twice in one step.
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from stallfree.core.plan import ScheduledChunk, StepPlan

if TYPE_CHECKING:
    from stallfree.core.scheduler import Scheduler, Sequence


class StepContext:
    """The API a policy uses to build one step; it enforces KV and seq limits.

    ``running`` is a snapshot in admission order (oldest first); requests it
    preempts are skipped by :meth:`is_running`.
    """

    def __init__(self, scheduler: Scheduler) -> None:
        self._s = scheduler
        self.running: tuple[Sequence, ...] = tuple(scheduler._running)
        self._scheduled: dict[str, int] = {}
        self._chunks: list[ScheduledChunk] = []
        self._new_blocks: dict[str, tuple[int, ...]] = {}
        self._preempted: list[str] = []
        self.num_scheduled_tokens = 0

    # -- queries ----------------------------------------------------------------
    @property
    def waiting(self) -> deque[Sequence]:
        return self._s._waiting

    def is_running(self, seq: Sequence) -> bool:
        return seq.request_id in self._s._running_by_id

    def is_scheduled(self, seq: Sequence) -> bool:
        return seq.request_id in self._scheduled

    @property
    def num_running(self) -> int:
        return len(self._s._running)

    # -- actions ----------------------------------------------------------------
    def schedule_running(self, seq: Sequence, num_tokens: int, *, preempt: bool) -> int:
        """Schedule up to ``num_tokens`` tokens of running ``seq``; return how many.

        Short of KV blocks, ``preempt=True`` preempts the newest unscheduled
        running request until the blocks fit (possibly ``seq`` itself: then 0);
        ``preempt=False`` shrinks the chunk to what the free blocks hold.
        """
        s = self._s
        bm = s.block_manager
        rid = seq.request_id
        num_tokens = min(num_tokens, seq.num_uncomputed_tokens)
        if num_tokens <= 0 or rid in self._scheduled or rid not in s._running_by_id:
            return 0
        target = seq.num_computed_tokens + num_tokens
        need = bm.num_new_blocks(rid, target)
        if not need:  # most decodes: the last block still has room
            self._add(seq, num_tokens, ())
            return num_tokens
        if preempt:
            while not bm.can_allocate(need):
                # Never a request already in this plan: its chunk would run on freed blocks.
                victim = next(
                    (v for v in reversed(s._running) if v is not seq and v.request_id not in self._scheduled),
                    seq,
                )
                self._preempt(victim)
                if victim is seq:
                    return 0
        elif not bm.can_allocate(need):
            free = bm.num_free_blocks or 0
            held_tokens = (len(bm.block_table(rid)) + free) * bm.block_size
            num_tokens = held_tokens - seq.num_computed_tokens
            if num_tokens <= 0:
                return 0
            target = seq.num_computed_tokens + num_tokens
        self._add(seq, num_tokens, bm.allocate(rid, target))
        return num_tokens

    def schedule_decodes(self) -> None:
        """``schedule_running(seq, 1, preempt=True)`` for every decoding running request, oldest
        first: the stall-free step's first part, on the hot path of every simulated step."""
        block_size = self._s.block_manager.block_size
        running = self._s._running_by_id
        scheduled = self._scheduled
        for seq in self.running:
            rid = seq.request_id
            if (
                seq.num_output_tokens
                and seq.num_prompt_tokens + seq.num_output_tokens - seq.num_computed_tokens == 1
                and rid in running
                and rid not in scheduled
            ):
                if seq.num_computed_tokens % block_size:
                    # A running request holds exactly the blocks of its computed tokens, so its
                    # last block has room: no allocation, nothing to preempt.
                    self._add(seq, 1, ())
                else:
                    self.schedule_running(seq, 1, preempt=True)

    def admit(self, num_tokens: int) -> int:
        """Move the head of the waiting queue to running with a first chunk.

        Admits only if a sequence slot is free and the blocks of the whole prompt
        (or recompute) fit above the watermark, though only the chunk's are allocated
        now; returns the tokens scheduled (0: not admitted).
        """
        s = self._s
        if not s._waiting or len(s._running) >= s.config.max_num_seqs:
            return 0
        seq = s._waiting[0]
        num_tokens = min(num_tokens, seq.num_uncomputed_tokens)
        if num_tokens <= 0:
            return 0
        bm = s.block_manager
        target = seq.num_computed_tokens + num_tokens
        # Checking the first chunk alone would admit prompts whose later chunks find no room:
        # under memory pressure they are preempted before their first token, again and again.
        whole = bm.num_new_blocks(seq.request_id, seq.num_known_tokens)
        if not bm.can_allocate(whole, reserve=s._watermark_blocks):
            return 0
        s._waiting.popleft()
        s._running.append(seq)
        s._running_by_id[seq.request_id] = seq
        self._add(seq, num_tokens, bm.allocate(seq.request_id, target))
        return num_tokens

    # -- internals --------------------------------------------------------------
    def _add(self, seq: Sequence, num_tokens: int, new_blocks: tuple[int, ...]) -> None:
        rid = seq.request_id
        self._scheduled[rid] = num_tokens
        self.num_scheduled_tokens += num_tokens
        self._chunks.append(ScheduledChunk(rid, seq.num_computed_tokens, num_tokens, seq.num_known_tokens))
        if new_blocks:
            self._new_blocks[rid] = new_blocks

    def _preempt(self, victim: Sequence) -> None:
        s = self._s
        if s._running[-1] is victim:  # the usual case: the newest
            s._running.pop()
        else:
            s._running.remove(victim)
        del s._running_by_id[victim.request_id]
        s.block_manager.free(victim.request_id)
        victim.num_computed_tokens = 0
        s._waiting.appendleft(victim)
        s.num_preemptions += 1
        self._preempted.append(victim.request_id)

    def build(self, freed: tuple[str, ...]) -> StepPlan:
        return StepPlan(
            chunks=tuple(self._chunks),
            new_block_ids=self._new_blocks,
            preempted_request_ids=tuple(self._preempted),
            freed_request_ids=freed + tuple(self._preempted),
        )
