"""The API a policy builds one step with: :class:`StepContext`.

A context is made by :meth:`Scheduler.schedule` for one step, over the scheduler's
:class:`~stallfree.core.state.SchedulerState`, and lives only while the policy fills it. Its two actions keep the scheduler's invariants whatever the policy asks: a chunk
never runs past a request's known tokens, KV blocks are allocated for every scheduled token
(preempting the newest running request, or under ``priority`` the lowest-priority one, by
recompute, when they run out), new requests are
admitted only within ``max_num_seqs`` and above the KV watermark, and no request is scheduled
twice in one step.

:meth:`StepContext.preview` lets a policy price a candidate before it commits: the plan as it
would be with one more chunk, built without allocating, preempting or changing anything.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from types import MappingProxyType

from stallfree.core.config import PRIORITY_PREEMPTION_THRESHOLD, SchedulerConfig
from stallfree.core.plan import ScheduledChunk, StepPlan
from stallfree.core.state import SchedulerState, Sequence

_NOTHING_TRIMMED: Mapping[str, int] = MappingProxyType({})


class StepContext:
    """The API a policy uses to build one step; it enforces KV and seq limits.

    ``running`` is a snapshot in admission order (oldest first); requests it
    preempts are skipped by :meth:`is_running`.
    """

    def __init__(self, state: SchedulerState, config: SchedulerConfig) -> None:
        self._state = state
        self._config = config
        self.running: tuple[Sequence, ...] = tuple(state.running)
        self._scheduled: dict[str, int] = {}  # request id -> its chunk's index in _chunks
        self._chunks: list[ScheduledChunk] = []
        self._new_blocks: dict[str, tuple[int, ...]] = {}
        self._preempted: list[str] = []
        self.num_scheduled_tokens = 0

    # -- queries ----------------------------------------------------------------
    @property
    def waiting(self) -> deque[Sequence]:
        return self._state.waiting

    def is_running(self, seq: Sequence) -> bool:
        return seq.request_id in self._state.running_by_id

    def is_scheduled(self, seq: Sequence) -> bool:
        return seq.request_id in self._scheduled

    @property
    def num_running(self) -> int:
        return len(self._state.running)

    def preview(self, seq: Sequence | None = None, num_tokens: int = 0) -> StepPlan:
        """The step's chunks so far plus, if ``seq`` is given, a chunk of ``num_tokens`` of it.

        For pricing a candidate (a step-time predictor reads chunks only): the extra chunk
        starts after ``seq``'s computed tokens (a waiting one's: its cached prefix), exactly as
        :meth:`schedule_running` or :meth:`admit` would schedule it, and comes last. Nothing
        changes: no block is allocated, nobody is preempted, ``seq`` is not scheduled, and the plan carries no
        block ids, preemptions or frees (whether the chunk would get its blocks is not
        checked: a preview prices, the actions decide). ``ValueError`` if ``seq`` is already
        scheduled or ``num_tokens`` is not in ``1..num_tokens_to_run(seq)``.
        """
        if seq is None:
            return StepPlan(tuple(self._chunks))
        if seq.request_id in self._scheduled:
            raise ValueError(f"preview: request {seq.request_id} is already in this step")
        start = self._start(seq)
        if not 0 < num_tokens <= seq.num_known_tokens - start:
            raise ValueError(
                f"preview: request {seq.request_id} has {seq.num_known_tokens - start} tokens to run, "
                f"asked for {num_tokens}"
            )
        hit = start > 0 and seq.request_id not in self._state.running_by_id
        chunk = ScheduledChunk(seq.request_id, start, num_tokens, seq.num_known_tokens, hit)
        return StepPlan((*self._chunks, chunk))

    def num_tokens_to_run(self, seq: Sequence) -> int:
        """Tokens ``seq`` has left to compute; for a waiting one, after its cached prefix."""
        return seq.num_known_tokens - self._start(seq)

    def _start(self, seq: Sequence) -> int:
        """The computed tokens ``seq``'s next chunk starts after (a waiting one's cache hit, or
        the KV that came with it)."""
        if seq.request_id in self._state.running_by_id:
            return seq.num_computed_tokens
        cached = len(self._state.cached_prefix(seq)) * self._state.block_manager.block_size
        return max(cached, _external(seq))

    # -- actions ----------------------------------------------------------------
    def schedule_running(self, seq: Sequence, num_tokens: int, *, preempt: bool) -> int:
        """Schedule up to ``num_tokens`` tokens of running ``seq``; return how many.

        Short of KV blocks, ``preempt=True`` preempts the newest unscheduled
        running request until the blocks fit (possibly ``seq`` itself: then 0);
        ``preempt=False`` shrinks the chunk to what the free blocks hold.
        """
        state = self._state
        bm = state.block_manager
        rid = seq.request_id
        num_tokens = min(num_tokens, seq.num_uncomputed_tokens)
        if num_tokens <= 0 or rid in self._scheduled or rid not in state.running_by_id:
            return 0
        target = seq.num_computed_tokens + num_tokens
        need = bm.num_new_blocks(rid, target)
        if not need:  # most decodes: the last block still has room
            self._add(seq, num_tokens, ())
            state.cache_computed(seq, target)  # a block this chunk fills is cached with it
            return num_tokens
        if preempt:
            while not bm.can_allocate(need):
                victim = self._victim(seq)
                self._preempt(victim)
                if victim is seq:
                    return 0
        elif not bm.can_allocate(need):
            # Shrink to the tokens its held blocks plus every free block can store.
            free = bm.num_free_blocks or 0
            held_tokens = (len(bm.block_table(rid)) + free) * bm.block_size
            num_tokens = held_tokens - seq.num_computed_tokens
            if num_tokens <= 0:
                return 0
            target = seq.num_computed_tokens + num_tokens
        self._add(seq, num_tokens, bm.allocate(rid, target))
        state.cache_computed(seq, target)
        return num_tokens

    def schedule_decodes(self) -> None:
        """``schedule_running(seq, 1, preempt=True)`` for every decoding running request, oldest
        first: the stall-free step's first part, on the hot path of every simulated step."""
        block_size = self._state.block_manager.block_size
        running = self._state.running_by_id
        scheduled = self._scheduled
        for seq in self.running:
            rid = seq.request_id
            if (
                seq.num_output_tokens  # seq.is_decoding, inlined: this loop runs every step
                and seq.num_prompt_tokens + seq.num_output_tokens - seq.num_computed_tokens == 1
                and rid in running
                and rid not in scheduled
            ):
                if seq.num_computed_tokens % block_size:
                    # A running request holds exactly the blocks of its computed tokens, so its
                    # last block has room: no allocation, nothing to preempt.
                    self._add(seq, 1, ())
                    if seq.block_keys is not None and not (seq.num_computed_tokens + 1) % block_size:
                        self._state.cache_computed(seq, seq.num_computed_tokens + 1)  # it fills it
                else:
                    self.schedule_running(seq, 1, preempt=True)

    def schedule_drafts(self, num_tokens: int | None, max_per_request: int) -> int:
        """Let the decodes scheduled so far verify their proposed drafts, oldest first: up to
        ``max_per_request`` each and ``num_tokens`` in all (None: no cap), never past the
        request's ``max_tokens`` (one more token always follows the accepted drafts). Drafts
        never preempt: short of KV blocks they shrink to what the free blocks hold. Returns the
        draft tokens scheduled."""
        state = self._state
        bm = state.block_manager
        total = 0
        for seq in self.running:
            left = max_per_request if num_tokens is None else min(max_per_request, num_tokens - total)
            if left <= 0:
                break
            index = self._scheduled.get(seq.request_id)
            if index is None or not seq.num_proposed_drafts:
                continue
            chunk = self._chunks[index]
            if not chunk.is_decode:
                continue
            drafts = min(left, seq.num_proposed_drafts, seq.request.max_tokens - seq.num_output_tokens - 1)
            if drafts <= 0:
                continue
            rid = seq.request_id
            target = chunk.context_len + drafts
            need = bm.num_new_blocks(rid, target)
            if need and not bm.can_allocate(need):
                free = bm.num_free_blocks or 0
                drafts = (len(bm.block_table(rid)) + free) * bm.block_size - chunk.context_len
                if drafts <= 0:
                    continue
                target = chunk.context_len + drafts
            new = bm.allocate(rid, target)
            if new:
                self._new_blocks[rid] = (*self._new_blocks.get(rid, ()), *new)
            self._chunks[index] = ScheduledChunk(
                rid, chunk.num_computed_tokens, 1 + drafts, chunk.num_known_tokens, num_draft_tokens=drafts
            )
            self.num_scheduled_tokens += drafts
            total += drafts
        return total

    def admit(self, num_tokens: int) -> int:
        """Move the head of the waiting queue to running with a first chunk.

        Its cached prefix (with prefix caching), or the KV that came with it (disaggregated
        serving), counts as computed and costs no budget: the chunk starts after it. Admits only
        if a sequence slot is free and the blocks of the whole prompt (or recompute) fit above
        the watermark, though only the chunk's are allocated now; returns the tokens scheduled
        (0: not admitted).
        """
        state = self._state
        if not state.waiting or len(state.running) >= self._config.max_num_seqs:
            return 0
        seq = state.waiting[0]
        bm = state.block_manager
        if bm.tiers is not None:  # KV loaded from the tiers goes into the cache as it is admitted
            bm.land_staged(seq.request_id, state.watermark_blocks)
        hits = state.cached_prefix(seq)
        num_cached = len(hits) * bm.block_size
        start = max(num_cached, _external(seq))  # KV that came with it costs no budget either
        num_tokens = min(num_tokens, seq.num_known_tokens - start)
        if num_tokens <= 0:
            return 0
        # Checking the first chunk alone would admit prompts whose later chunks find no room:
        # under memory pressure they are preempted before their first token, again and again.
        # Cached blocks no one holds are free blocks until taken.
        whole = bm.blocks_for(seq.num_known_tokens) - len(hits) + bm.num_evictable(hits)
        if not bm.can_allocate(whole, reserve=state.watermark_blocks):
            return 0
        state.admit_head()
        if seq.block_keys is not None:
            state.num_prefix_queried_tokens += seq.num_known_tokens
            state.num_prefix_hit_tokens += num_cached
        if hits:
            bm.take_cached(seq.request_id, hits)
        seq.num_computed_tokens = start
        target = start + num_tokens
        self._add(seq, num_tokens, (*hits, *bm.allocate(seq.request_id, target)), after_cache_hit=start > 0)
        state.cache_computed(seq, target)
        return num_tokens

    # -- internals --------------------------------------------------------------
    def _add(
        self, seq: Sequence, num_tokens: int, new_blocks: tuple[int, ...], *, after_cache_hit: bool = False
    ) -> None:
        rid = seq.request_id
        self._scheduled[rid] = len(self._chunks)
        self.num_scheduled_tokens += num_tokens
        chunk = ScheduledChunk(
            rid, seq.num_computed_tokens, num_tokens, seq.num_known_tokens, after_cache_hit
        )
        self._chunks.append(chunk)
        if new_blocks:
            self._new_blocks[rid] = new_blocks

    def _victim(self, seq: Sequence) -> Sequence:
        """Whom to preempt so that ``seq`` gets blocks (``seq`` itself when no one else can go).

        ``fcfs``: the newest running request not in this plan (a chunk in the plan would run on
        freed blocks). ``priority`` (vLLM's rule): the lowest priority, latest arrival, first in
        running order on a tie, ``seq`` included; one already in this plan leaves it (its tokens
        go back to the step's budget), unless its chunk filled a block, which the prefix cache
        then holds as computed (vLLM takes it out all the same; a later prompt would find KV that
        was never computed), when the next lowest goes.
        """
        state = self._state
        if not state.by_priority:
            return next(
                (v for v in reversed(state.running) if v is not seq and v.request_id not in self._scheduled),
                seq,
            )
        candidates = [v for v in state.running if v is seq or not self._fills_block(v)]
        victim = max(candidates, key=_victim_key)
        if victim is not seq and victim.request_id in self._scheduled:
            self._unschedule(victim)
        return victim

    @property
    def preempts_to_admit(self) -> bool:
        """A waiting request may preempt running ones to be admitted (``sglang-priority``)."""
        return self._config.scheduling_policy == "sglang-priority"

    def preempt_for_head(self) -> bool:
        """SGLang's priority preemption: when the waiting queue's head finds too few KV blocks,
        preempt running requests whose priority is more than
        :data:`~stallfree.core.config.PRIORITY_PREEMPTION_THRESHOLD` below its own, lowest first,
        if together they hold the blocks it lacks (none is preempted otherwise); True if any was.
        A victim in this plan leaves it, unless its chunk filled a block (see :meth:`_victim`)."""
        state = self._state
        bm = state.block_manager
        if not state.waiting or bm.num_blocks is None:
            return False
        head = state.waiting[0]
        hits = state.cached_prefix(head)
        whole = bm.blocks_for(head.num_known_tokens) - len(hits) + bm.num_evictable(hits)
        lacking = whole + state.watermark_blocks - (bm.num_free_blocks or 0)
        if lacking <= 0:
            return False  # held back by something else (a sequence slot)
        floor = head.request.priority + PRIORITY_PREEMPTION_THRESHOLD
        below = [v for v in state.running if v.request.priority > floor and not self._fills_block(v)]
        chosen: list[Sequence] = []
        for victim in sorted(below, key=_victim_key, reverse=True):
            if lacking <= 0:
                break
            chosen.append(victim)
            lacking -= len(bm.block_table(victim.request_id))
        if lacking > 0:
            return False
        for victim in chosen:
            if victim.request_id in self._scheduled:
                self._unschedule(victim)
            self._preempt(victim)
        return True

    def _fills_block(self, seq: Sequence) -> bool:
        """``seq``'s chunk in this plan fills a block (one the prefix cache may now hold)."""
        index = self._scheduled.get(seq.request_id)
        if index is None:
            return False
        chunk = self._chunks[index]
        size = self._state.block_manager.block_size
        start = chunk.num_computed_tokens
        return (start + chunk.num_tokens) // size > start // size

    def _unschedule(self, seq: Sequence) -> None:
        """Take ``seq``'s chunk out of this plan (it is about to be preempted)."""
        index = self._scheduled.pop(seq.request_id)
        chunk = self._chunks.pop(index)
        self.num_scheduled_tokens -= chunk.num_tokens
        self._new_blocks.pop(seq.request_id, None)
        for rid, i in self._scheduled.items():
            if i > index:
                self._scheduled[rid] = i - 1

    def _preempt(self, victim: Sequence) -> None:
        self._state.preempt(victim)
        self._preempted.append(victim.request_id)

    def build(self, freed: tuple[str, ...], trimmed: Mapping[str, int] = _NOTHING_TRIMMED) -> StepPlan:
        return StepPlan(
            chunks=tuple(self._chunks),
            new_block_ids=self._new_blocks,
            preempted_request_ids=tuple(self._preempted),
            freed_request_ids=freed + tuple(self._preempted),
            trimmed_block_tables=trimmed if trimmed else _NOTHING_TRIMMED,
        )


def _victim_key(seq: Sequence) -> tuple[int, float]:
    return seq.request.priority, seq.request.arrival_time_s


def _external(seq: Sequence) -> int:
    """The tokens of ``seq``'s KV that came with it, short of its last known token (run again for
    its logits, as vLLM's decode server does after a remote prefill)."""
    return min(seq.num_external_tokens, seq.num_known_tokens - 1)
