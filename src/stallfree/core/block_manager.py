"""Paged KV-cache blocks: which block ids each request holds.

A request holding ``n`` tokens of KV owns ``ceil(n / block_size)`` blocks, in
order (its block table). Blocks are either free or owned by exactly one
request; ``num_free_blocks + num_used_blocks == num_blocks`` always. With
``num_blocks=None`` the pool is unbounded (the seed's picture ignores memory).
"""

from __future__ import annotations

from stallfree.core.config import ceil_div


class BlockManager:
    """Hands out block ids; knows nothing about scheduling."""

    def __init__(self, block_size: int, num_blocks: int | None) -> None:
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        if num_blocks is not None and num_blocks <= 0:
            raise ValueError(f"num_blocks must be positive, got {num_blocks}")
        self.block_size = block_size
        self.num_blocks = num_blocks
        # Free ids are popped from the end: lowest ids are handed out first.
        self._free: list[int] = list(range(num_blocks - 1, -1, -1)) if num_blocks is not None else []
        self._next_unbounded_id = 0
        self._tables: dict[str, list[int]] = {}
        self.num_used_blocks = 0

    def blocks_for(self, num_tokens: int) -> int:
        return ceil_div(num_tokens, self.block_size)

    @property
    def num_free_blocks(self) -> int | None:
        """Free blocks, or ``None`` for an unbounded pool."""
        return len(self._free) if self.num_blocks is not None else None

    def num_new_blocks(self, request_id: str, num_tokens: int) -> int:
        """Blocks ``request_id`` must add to hold ``num_tokens`` tokens in total."""
        held = len(self._tables.get(request_id, ()))
        return max(0, self.blocks_for(num_tokens) - held)

    def can_allocate(self, num_new_blocks: int, reserve: int = 0) -> bool:
        return self.num_blocks is None or len(self._free) - reserve >= num_new_blocks

    def allocate(self, request_id: str, num_tokens: int) -> tuple[int, ...]:
        """Grow ``request_id``'s table to hold ``num_tokens`` tokens; return the ids added."""
        need = self.num_new_blocks(request_id, num_tokens)
        if need == 0:
            return ()
        if not self.can_allocate(need):
            raise RuntimeError(f"request {request_id}: needs {need} blocks, {len(self._free)} free")
        if self.num_blocks is None:
            new = tuple(range(self._next_unbounded_id, self._next_unbounded_id + need))
            self._next_unbounded_id += need
        else:
            new = tuple(self._free[-need:][::-1])
            del self._free[-need:]
        self._tables.setdefault(request_id, []).extend(new)
        self.num_used_blocks += need
        return new

    def free(self, request_id: str) -> None:
        """Release every block of ``request_id`` (no-op if it holds none)."""
        table = self._tables.pop(request_id, None)
        if not table:
            return
        self.num_used_blocks -= len(table)
        if self.num_blocks is not None:
            self._free.extend(reversed(table))

    def block_table(self, request_id: str) -> tuple[int, ...]:
        return tuple(self._tables.get(request_id, ()))

    @property
    def usage(self) -> float:
        """Fraction of the pool in use (0 for an unbounded pool)."""
        return self.num_used_blocks / self.num_blocks if self.num_blocks else 0.0
