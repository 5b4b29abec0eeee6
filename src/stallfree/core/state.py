"""The scheduler's state: which requests wait, which run, and the KV blocks they hold.

Plain public attributes that the scheduler, the step context and the fast path read; they change
only through the methods below, which keep the invariants:

- a request is in exactly one of ``waiting`` / ``running`` / gone, and ``running_by_id`` indexes
  ``running`` (kept in admission order, oldest first);
- ``waiting`` is in arrival order, a preempted request at its head (``fcfs``), or ordered by
  :attr:`Sequence.queue_key`, priority then arrival (``priority``: vLLM's order);
- a running request holds exactly the KV blocks of its computed tokens (plus those scheduled
  this step, draft tokens' included: the scheduler trims what rejected drafts took when the
  step's result comes back); a waiting one holds none, so a preempted request recomputes from token 0, less
  whatever of its prompt is still in the prefix cache when it is admitted again;
- a finished request that sends its KV away (``Request.sends_kv``) keeps its blocks, listed in
  ``held``, until :meth:`release`.
"""

from __future__ import annotations

from bisect import insort
from collections import deque
from collections.abc import Iterable

from stallfree.core.block_manager import BlockKeys, BlockManager, block_keys
from stallfree.core.config import CacheConfig
from stallfree.core.request import Request


class Sequence:
    """A request's progress inside the scheduler (policies read it; the state changes it)."""

    # request_id and num_prompt_tokens are copied from the request: read on every step.
    __slots__ = (
        "block_keys",
        "num_computed_tokens",
        "num_external_tokens",
        "num_output_tokens",
        "num_prompt_tokens",
        "num_proposed_drafts",
        "pending_ids",
        "queue_key",
        "request",
        "request_id",
    )

    def __init__(self, request: Request, order: int = 0) -> None:
        self.request = request
        # Its place in a priority-ordered waiting queue: priority, arrival, then the order it was
        # queued in (ties go first come, first served).
        self.queue_key = (request.priority, request.arrival_time_s, order)
        self.request_id = request.request_id
        self.num_prompt_tokens = request.num_prompt_tokens
        self.num_computed_tokens = 0
        # KV that came with it (disaggregated serving), until a preemption loses it
        self.num_external_tokens = request.num_external_tokens
        self.num_output_tokens = 0
        self.num_proposed_drafts = 0  # draft tokens its executor proposed for its next step
        # its known full blocks' cache keys (with caching; None: none known)
        self.block_keys: BlockKeys | None = None
        # With caching and a prompt given as token ids: the known token ids after the last keyed
        # block, so generated tokens key the blocks they fill (None: not keyed by token ids).
        self.pending_ids: list[int] | None = None

    @property
    def num_known_tokens(self) -> int:
        """Tokens whose ids exist: the prompt and every token generated so far."""
        return self.num_prompt_tokens + self.num_output_tokens

    @property
    def num_uncomputed_tokens(self) -> int:
        """Known tokens not yet in the KV cache."""
        return self.num_prompt_tokens + self.num_output_tokens - self.num_computed_tokens

    @property
    def is_decoding(self) -> bool:
        """Past its prompt (and any recompute): exactly one token left to run."""
        return self.num_output_tokens > 0 and self.num_uncomputed_tokens == 1


class SchedulerState:
    """Queues and blocks of one scheduler."""

    def __init__(self, cache: CacheConfig, *, by_priority: bool = False) -> None:
        self.by_priority = by_priority
        self.num_added = 0
        self.block_manager = BlockManager(
            cache.block_size, cache.num_blocks, enable_prefix_caching=cache.enable_prefix_caching
        )
        self.watermark_blocks = cache.watermark_blocks
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.running_by_id: dict[str, Sequence] = {}
        self.held: set[str] = set()  # finished, blocks kept for a decode server to read
        self.num_preemptions = 0
        # vLLM's prefix-cache counters: known tokens looked up at each admission, and found.
        self.num_prefix_queried_tokens = 0
        self.num_prefix_hit_tokens = 0

    def add(self, request: Request) -> None:
        """Queue ``request``: last, or by its priority (``by_priority``)."""
        seq = Sequence(request, self.num_added)
        self.num_added += 1
        content = request.prompt_blocks
        if self.block_manager.enable_prefix_caching and content is not None:
            # Ids may go on into the output (a session's answers, known to its workload).
            size = self.block_manager.block_size
            keys = block_keys(content, request.num_prompt_tokens + request.max_tokens, size)
            seq.block_keys = keys if len(keys) else None
            if content.tokens_per_id == 1 and content.num_named_tokens == request.num_prompt_tokens:
                seq.pending_ids = list(content.ids[len(keys) * size :])
        if self.by_priority:
            insort(self.waiting, seq, key=_queue_key)
        else:
            self.waiting.append(seq)

    def key_sampled(self, seq: Sequence, token_id: int) -> None:
        """An executor sampled ``token_id`` for ``seq``: once such tokens fill a block, key it as
        :func:`block_keys` keys a prompt's, so generated blocks are cached too (as in vLLM), and
        a later prompt that repeats this answer (the next turn of a chat) finds them."""
        pending = seq.pending_ids
        if pending is None:
            return
        pending.append(token_id)
        size = self.block_manager.block_size
        if len(pending) == size:
            keys = seq.block_keys
            if keys is None:
                keys = seq.block_keys = BlockKeys([], 1, size, 0)
            keys.append(hash((keys.at(len(keys) - 1) if len(keys) else 0, tuple(pending))))
            pending.clear()

    def cached_prefix(self, seq: Sequence) -> list[int]:
        """The cached blocks a waiting ``seq`` would start from: its prompt's longest cached
        prefix of full blocks, short of its last known token (which must run to give logits)."""
        if seq.block_keys is None:
            return []
        return self.block_manager.match(
            seq.block_keys, (seq.num_known_tokens - 1) // self.block_manager.block_size
        )

    def cache_computed(self, seq: Sequence, num_tokens: int) -> None:
        """Cache ``seq``'s keyed blocks that ``num_tokens`` computed tokens fill."""
        if seq.block_keys is not None:
            self.block_manager.cache_blocks(seq.request_id, seq.block_keys, num_tokens)

    def admit_head(self) -> Sequence:
        """Move the head of ``waiting`` to the end of ``running``; the caller allocates its blocks."""
        seq = self.waiting.popleft()
        self.running.append(seq)
        self.running_by_id[seq.request_id] = seq
        return seq

    def preempt(self, seq: Sequence) -> None:
        """Back to ``waiting`` (its front, or its place by priority) with no blocks: it recomputes
        from token 0."""
        if self.running[-1] is seq:  # the usual case: the newest
            self.running.pop()
        else:
            self.running.remove(seq)
        del self.running_by_id[seq.request_id]
        self.block_manager.free(seq.request_id)
        seq.num_computed_tokens = seq.num_external_tokens = 0
        if self.by_priority:
            insort(self.waiting, seq, key=_queue_key)
        else:
            self.waiting.appendleft(seq)
        self.num_preemptions += 1

    def finish(self, request_ids: Iterable[str]) -> None:
        """Drop running requests and free their blocks (hold them, for those that send their KV)."""
        by_id = self.running_by_id
        for rid in request_ids:
            if by_id.pop(rid).request.sends_kv:
                self.held.add(rid)
            else:
                self.block_manager.free(rid)
        self.running = [s for s in self.running if s.request_id in by_id]

    def release(self, request_id: str) -> None:
        """Free the blocks a finished request held for its KV's transfer."""
        self.held.remove(request_id)
        self.block_manager.free(request_id)

    def drop_waiting(self, request_id: str) -> None:
        self.waiting = deque(s for s in self.waiting if s.request_id != request_id)


def _queue_key(seq: Sequence) -> tuple[int, float, int]:
    return seq.queue_key
