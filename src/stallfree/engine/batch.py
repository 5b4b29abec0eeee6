"""Turn a step plan into model inputs: flat token ids, positions, slots, masks.

Rows are ordered single-token chunks first (batched decode attention, shortest context
first; a chunk verifying ``d`` drafts is ``d + 1`` such rows in a row), then each multi-token chunk
in plan order. Each sampling chunk contributes one logit row (its last token), a verifying one
``d + 1`` (its last known token's and each draft's); :attr:`ModelInputs.sample_request_ids` says
whose, in logit order.

Decodes are split into groups whose gathered K+V stays under ``_GATHER_BYTES``, so each
group's gather is still in cache when its attention matmuls read it, and memory for the
gather stays bounded however many sequences decode.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from stallfree.core import ScheduledChunk
from stallfree.core.config import ceil_div
from stallfree.engine.attention import (
    AttentionMetadata,
    ChunkAttention,
    DecodeGroup,
    NativeDecode,
    gather_rows,
    merges_chunk_attention,
)
from stallfree.engine.kv_cache import KVCache
from stallfree.engine.native import ChunkKernel, DecodeKernel

_GATHER_BYTES = 4 << 20


@dataclass(frozen=True, slots=True)
class ModelInputs:
    input_ids: torch.Tensor
    positions: torch.Tensor
    attn: AttentionMetadata
    logits_indices: torch.Tensor
    sample_request_ids: tuple[str, ...]


def build_inputs(
    chunks: Sequence[ScheduledChunk],
    token_ids: Mapping[str, Sequence[int]],
    block_tables: Mapping[str, Sequence[int]],
    kv_cache: KVCache,
    *,
    query_group: int,
    decode_kernel: DecodeKernel | None = None,
    chunk_kernel: ChunkKernel | None = None,
) -> ModelInputs:
    """``query_group``: query heads per KV head (the row folding of a chunk's attention mask);
    ``decode_kernel``: the compiled kernel that attends all decodes at once (else: in groups);
    ``chunk_kernel``: the compiled kernel that attends each multi-token chunk (else: SDPA)."""
    device, dtype = kv_cache.key.device, kv_cache.key.dtype
    block_size, num_blocks, kv_heads = kv_cache.block_size, kv_cache.num_blocks, kv_cache.num_kv_heads
    # Decodes sorted by context length: each group then pads its contexts only a little. A chunk
    # verifying drafts is decode rows too, one a position (each attends up to itself: the cache
    # holds every row's K/V before attention reads it): the batched kernel, and the numbers a
    # decode at that position gives.
    decodes = sorted(
        (c for c in chunks if c.num_tokens == 1 or c.num_draft_tokens), key=lambda c: c.num_computed_tokens
    )
    multis = [c for c in chunks if c.num_tokens > 1 and not c.num_draft_tokens]
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    logit_rows: list[int] = []
    sample_ids: list[str] = []

    tables: list[Sequence[int]] = []
    for c in decodes:
        rid = c.request_id
        table = block_tables[rid]
        for pos in range(c.num_computed_tokens, c.context_len):
            if c.emits_token:
                logit_rows.append(len(ids))
                sample_ids.append(rid)
            ids.append(token_ids[rid][pos])
            positions.append(pos)
            slots.append(table[pos // block_size] * block_size + pos % block_size)
            tables.append(table[: pos // block_size + 1])
    native = None
    decode_groups: tuple[DecodeGroup, ...] = ()
    if decode_kernel is not None and decodes:
        native = NativeDecode(
            kernel=decode_kernel,
            block_table=_padded(tables).to(device),
            context_lens=torch.tensor(positions, dtype=torch.long, device=device) + 1,
        )
    elif decodes:
        decode_groups = _decode_groups(tables, positions, kv_cache)

    chunk_attn = []
    for c in multis:
        rid, start, n = c.request_id, c.num_computed_tokens, c.num_tokens
        blocks = torch.tensor(block_tables[rid][: ceil_div(start + n, block_size)], dtype=torch.long)
        chunk_pos = torch.arange(start, start + n)
        row = len(ids)
        ids.extend(token_ids[rid][start : start + n])
        positions.extend(range(start, start + n))
        slots.extend((blocks[chunk_pos // block_size] * block_size + chunk_pos % block_size).tolist())
        if c.emits_token:
            logit_rows.append(row + n - 1)
            sample_ids.append(rid)
        chunk_mask = None
        if start and chunk_kernel is None and not merges_chunk_attention(device):
            # earlier context: all of it visible, causal inside the chunk
            hidden = (torch.arange(start + n)[None, :] > chunk_pos[:, None]).repeat_interleave(query_group, 0)
            chunk_mask = torch.zeros(hidden.shape, dtype=dtype).masked_fill_(hidden, float("-inf")).to(device)
        chunk_attn.append(
            ChunkAttention(
                start=row,
                num_tokens=n,
                num_computed_tokens=start,
                gather_rows=gather_rows(blocks, kv_heads, num_blocks).to(device),
                blocks=blocks.to(device),
                mask=chunk_mask,
            )
        )

    attn = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
        decode_groups=decode_groups,
        chunks=tuple(chunk_attn),
        native_decode=native,
        chunk_kernel=chunk_kernel,
    )
    return ModelInputs(
        input_ids=torch.tensor(ids, dtype=torch.long, device=device),
        positions=torch.tensor(positions, dtype=torch.long, device=device),
        attn=attn,
        logits_indices=torch.tensor(logit_rows, dtype=torch.long, device=device),
        sample_request_ids=tuple(sample_ids),
    )


def _decode_groups(
    tables: Sequence[Sequence[int]], positions: Sequence[int], kv_cache: KVCache
) -> tuple[DecodeGroup, ...]:
    """Decodes (``tables[i]`` and ``positions[i]``, row ``i``) in groups whose gathered K+V stays
    under ``_GATHER_BYTES``."""
    device, block_size = kv_cache.key.device, kv_cache.block_size
    seqs_per_group = max(1, _GATHER_BYTES // max(1, kv_cache.bytes_per_block * max(len(t) for t in tables)))
    groups = []
    for first in range(0, len(tables), seqs_per_group):
        group_tables = tables[first : first + seqs_per_group]
        padded = _padded(group_tables)
        context_lens = torch.tensor(positions[first : first + seqs_per_group], dtype=torch.long) + 1
        padding = (torch.arange(padded.shape[1] * block_size)[None, :] >= context_lens[:, None]).unsqueeze(1)
        groups.append(
            DecodeGroup(
                start=first,
                num_seqs=len(group_tables),
                gather_rows=gather_rows(padded, kv_cache.num_kv_heads, kv_cache.num_blocks).to(device),
                padding=padding.to(device),
                max_context_len=max(positions[first : first + seqs_per_group]) + 1,
            )
        )
    return tuple(groups)


def _padded(tables: Sequence[Sequence[int]]) -> torch.Tensor:
    """Block tables as one ``[len(tables), longest]`` long tensor, zero-padded."""
    width = max(len(t) for t in tables)
    return torch.tensor([list(t) + [0] * (width - len(t)) for t in tables], dtype=torch.long)
