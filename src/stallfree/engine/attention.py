"""Attention of a ragged step over the paged KV cache.

A step's tokens come in two groups (the batch builder orders them so):

- the first ``num_decode_tokens`` rows are single-token chunks (decodes): their contexts
  are gathered block-wise from the cache, padded to the longest, and attended in ONE
  call, with a padding mask;
- then each multi-token chunk (a prompt chunk or a recompute) attends over its own
  context with causal masking inside the chunk, one call per chunk.

Grouped-query attention is computed by folding each KV head's group of query heads into
extra query rows (``[kv_heads, group * tokens, head_dim]``) rather than repeating K/V or
asking SDPA for ``enable_gqa`` (which is many times slower in bf16 on CPU). Masks are
built once per step by the batch builder and shared by all layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True, slots=True)
class ChunkAttention:
    """One multi-token chunk: rows ``[start, start + num_tokens)`` of the step."""

    start: int
    num_tokens: int
    num_computed_tokens: int
    block_ids: torch.Tensor  # [blocks holding the context], long
    mask: torch.Tensor  # [group * num_tokens, context_len] bool, True = attend

    @property
    def context_len(self) -> int:
        return self.num_computed_tokens + self.num_tokens


@dataclass(frozen=True, slots=True)
class AttentionMetadata:
    """Where each token's K/V is written, and what each token attends to."""

    slot_mapping: torch.Tensor  # [num_tokens] long: cache slot of each token
    num_decode_tokens: int
    decode_block_tables: torch.Tensor  # [num_decode_tokens, max_blocks] long, padded with block 0
    decode_mask: torch.Tensor  # [num_decode_tokens, 1, max_blocks * block_size] bool
    chunks: tuple[ChunkAttention, ...]


def paged_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cache: tuple[torch.Tensor, torch.Tensor],
    meta: AttentionMetadata,
    scale: float,
) -> torch.Tensor:
    """Write ``k``/``v`` ([T, kv_heads, D]) to the cache, attend; return ``[T, heads * D]``."""
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    group = num_heads // num_kv_heads
    key_cache, value_cache = cache
    kv_heads, num_blocks, block_size, _ = key_cache.shape
    flat_keys = key_cache.view(kv_heads, num_blocks * block_size, head_dim)
    flat_values = value_cache.view(kv_heads, num_blocks * block_size, head_dim)
    flat_keys.index_copy_(1, meta.slot_mapping, k.transpose(0, 1))
    flat_values.index_copy_(1, meta.slot_mapping, v.transpose(0, 1))

    out = torch.empty(num_tokens, num_heads * head_dim, dtype=q.dtype, device=q.device)
    num_decode = meta.num_decode_tokens
    if num_decode:
        # [B, H, D] -> [kv_heads, B, group, D]: query head h uses KV head h // group.
        dq = q[:num_decode].view(num_decode, kv_heads, group, head_dim).permute(1, 0, 2, 3)
        tables = meta.decode_block_tables
        dk = key_cache[:, tables].view(kv_heads, num_decode, -1, head_dim)
        dv = value_cache[:, tables].view(kv_heads, num_decode, -1, head_dim)
        dout = F.scaled_dot_product_attention(dq, dk, dv, attn_mask=meta.decode_mask, scale=scale)
        out[:num_decode] = dout.permute(1, 0, 2, 3).reshape(num_decode, num_heads * head_dim)
    for chunk in meta.chunks:
        rows = slice(chunk.start, chunk.start + chunk.num_tokens)
        n = chunk.num_tokens
        # [n, H, D] -> [kv_heads, group * n, D]
        cq = (
            q[rows]
            .view(n, kv_heads, group, head_dim)
            .permute(1, 2, 0, 3)
            .reshape(kv_heads, group * n, head_dim)
        )
        if chunk.num_computed_tokens == 0:  # the whole context is this chunk: no gather needed
            ck, cv = k[rows].transpose(0, 1), v[rows].transpose(0, 1)
        else:
            ck = key_cache[:, chunk.block_ids].view(kv_heads, -1, head_dim)[:, : chunk.context_len]
            cv = value_cache[:, chunk.block_ids].view(kv_heads, -1, head_dim)[:, : chunk.context_len]
        cout = F.scaled_dot_product_attention(cq, ck, cv, attn_mask=chunk.mask, scale=scale)
        out[rows] = (
            cout.view(kv_heads, group, n, head_dim).permute(2, 0, 1, 3).reshape(n, num_heads * head_dim)
        )
    return out
