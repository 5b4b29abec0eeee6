"""Turn a step plan into model inputs: flat token ids, positions, slots, masks.

Rows are ordered single-token chunks first (batched decode attention), then each
multi-token chunk in plan order. Each sampling chunk contributes one logit row (its last
token); :attr:`ModelInputs.sample_request_ids` says whose, in logit order.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch

from stallfree.core import ScheduledChunk
from stallfree.engine.attention import AttentionMetadata, ChunkAttention


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
    block_size: int,
    group: int,
    device: torch.device,
) -> ModelInputs:
    """``group`` is query heads per KV head (the chunk masks are tiled that many times)."""
    decodes = [c for c in chunks if c.num_tokens == 1]
    multis = [c for c in chunks if c.num_tokens > 1]
    ids: list[int] = []
    positions: list[int] = []
    slots: list[int] = []
    logit_rows: list[int] = []
    sample_ids: list[str] = []

    context_lens = []
    tables = []
    for c in decodes:
        rid, pos = c.request_id, c.num_computed_tokens
        decode_table = block_tables[rid]
        if c.samples:
            logit_rows.append(len(ids))
            sample_ids.append(rid)
        ids.append(token_ids[rid][pos])
        positions.append(pos)
        slots.append(decode_table[pos // block_size] * block_size + pos % block_size)
        context_lens.append(pos + 1)
        tables.append(decode_table[: -(-(pos + 1) // block_size)])
    max_blocks = max((len(t) for t in tables), default=0)
    decode_tables = torch.tensor([list(t) + [0] * (max_blocks - len(t)) for t in tables], dtype=torch.long)
    span = torch.arange(max_blocks * block_size)
    decode_mask = (span[None, :] < torch.tensor(context_lens, dtype=torch.long)[:, None]).unsqueeze(1)

    chunk_attn = []
    for c in multis:
        rid, start, n = c.request_id, c.num_computed_tokens, c.num_tokens
        table = torch.tensor(block_tables[rid][: -(-(start + n) // block_size)], dtype=torch.long)
        chunk_pos = torch.arange(start, start + n)
        row = len(ids)
        ids.extend(token_ids[rid][start : start + n])
        positions.extend(range(start, start + n))
        slots.extend((table[chunk_pos // block_size] * block_size + chunk_pos % block_size).tolist())
        if c.samples:
            logit_rows.append(row + n - 1)
            sample_ids.append(rid)
        mask = torch.arange(start + n)[None, :] <= chunk_pos[:, None]
        chunk_attn.append(
            ChunkAttention(
                start=row,
                num_tokens=n,
                num_computed_tokens=start,
                block_ids=table.to(device),
                mask=mask.repeat(group, 1).to(device),
            )
        )

    attn = AttentionMetadata(
        slot_mapping=torch.tensor(slots, dtype=torch.long, device=device),
        num_decode_tokens=len(decodes),
        decode_block_tables=decode_tables.to(device),
        decode_mask=decode_mask.to(device),
        chunks=tuple(chunk_attn),
    )
    return ModelInputs(
        input_ids=torch.tensor(ids, dtype=torch.long, device=device),
        positions=torch.tensor(positions, dtype=torch.long, device=device),
        attn=attn,
        logits_indices=torch.tensor(logit_rows, dtype=torch.long, device=device),
        sample_request_ids=tuple(sample_ids),
    )
