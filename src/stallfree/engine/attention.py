"""Attention of a ragged step over the paged KV cache.

A step's tokens come in two groups (the batch builder orders them so):

- the first rows are single-token chunks (decodes), in groups of a few sequences: each
  group's contexts are gathered block-wise from the cache, padded to the longest, and
  attended with one pair of matmuls and a padding mask (a group's gathered K/V is sized
  to stay in cache between the gather and the matmuls that read it);
- then each multi-token chunk (a prompt chunk or a recompute) attends over its own
  context with causal masking inside the chunk, one call per chunk.

Grouped-query attention never copies K/V per query head and never asks SDPA for
``enable_gqa`` (many times slower in bf16 on CPU): decodes fold each KV head's group of
query heads into extra query rows; chunks put the group in SDPA's batch dimension over
expanded (stride-0) K/V views, which keeps SDPA on its flash kernel. Masks are built
once per step by the batch builder and shared by all layers.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True, slots=True)
class DecodeGroup:
    """Single-token chunks in rows ``[start, start + num_seqs)``, attended together."""

    start: int
    num_seqs: int
    gather_rows: torch.Tensor  # [kv_heads * num_seqs * max_blocks] rows of the cache's block view
    padding: torch.Tensor  # [num_seqs, 1, max_blocks * block_size] bool, True = past the context


@dataclass(frozen=True, slots=True)
class ChunkAttention:
    """One multi-token chunk: rows ``[start, start + num_tokens)`` of the step."""

    start: int
    num_tokens: int
    num_computed_tokens: int
    gather_rows: torch.Tensor  # [kv_heads * blocks holding the context]
    # [num_tokens, context_len] bool, True = attend; None: no earlier context, plain causal
    # (SDPA's flash kernel then skips the masked half instead of computing and discarding it).
    mask: torch.Tensor | None

    @property
    def context_len(self) -> int:
        return self.num_computed_tokens + self.num_tokens


@dataclass(frozen=True, slots=True)
class AttentionMetadata:
    """Where each token's K/V is written, and what each token attends to."""

    slot_mapping: torch.Tensor  # [num_tokens] long: cache slot of each token
    decode_groups: tuple[DecodeGroup, ...]
    chunks: tuple[ChunkAttention, ...]


def gather_rows(block_ids: torch.Tensor, kv_heads: int, num_blocks: int) -> torch.Tensor:
    """Rows of the ``[kv_heads * num_blocks, block_size * D]`` cache view holding ``block_ids``,
    head-major, so the gathered rows ARE the ``[kv_heads, blocks, block_size, D]`` layout.

    A dim-0 ``index_select`` of whole rows is about twice as fast as indexing dim 1 on CPU.
    """
    heads = torch.arange(kv_heads, device=block_ids.device)[:, None] * num_blocks
    return (heads + block_ids.flatten()[None, :]).flatten()


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
    key_cache, value_cache = cache
    kv_heads, num_blocks, block_size, _ = key_cache.shape
    group = num_heads // kv_heads
    key_cache.view(kv_heads, -1, head_dim).index_copy_(1, meta.slot_mapping, k.transpose(0, 1))
    value_cache.view(kv_heads, -1, head_dim).index_copy_(1, meta.slot_mapping, v.transpose(0, 1))
    key_rows = key_cache.view(kv_heads * num_blocks, block_size * head_dim)
    value_rows = value_cache.view(kv_heads * num_blocks, block_size * head_dim)

    out = torch.empty(num_tokens, num_heads * head_dim, dtype=q.dtype, device=q.device)
    if meta.decode_groups:
        last = meta.decode_groups[-1]
        decode_q = q[: last.start + last.num_seqs] * scale  # scaled once for every group
    for g in meta.decode_groups:
        rows = slice(g.start, g.start + g.num_seqs)
        n = g.num_seqs
        # [n, H, D] -> [kv_heads, n, group, D]: query head h uses KV head h // group.
        dq = decode_q[rows].view(n, kv_heads, group, head_dim).permute(1, 0, 2, 3)
        dk = key_rows.index_select(0, g.gather_rows).view(kv_heads, n, -1, head_dim)
        dv = value_rows.index_select(0, g.gather_rows).view(kv_heads, n, -1, head_dim)
        # Plain matmuls beat SDPA here: with a handful of query rows per sequence SDPA's
        # CPU kernels fall back to an upcasting math path several times slower. Scores stay
        # in the model dtype (as the matmul made them); the softmax accumulates in fp32.
        scores = torch.matmul(dq, dk.transpose(-1, -2)).masked_fill_(g.padding, float("-inf"))
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out[rows] = torch.matmul(probs, dv).permute(1, 0, 2, 3).reshape(n, num_heads * head_dim)
    for chunk in meta.chunks:
        rows = slice(chunk.start, chunk.start + chunk.num_tokens)
        n = chunk.num_tokens
        # Query heads as [group, kv_heads, n, D]: batch g, head h is query head h * group + g,
        # and K/V broadcast over the group as expanded views (no copies).
        cq = q[rows].view(n, kv_heads, group, head_dim).permute(2, 1, 0, 3)
        if chunk.num_computed_tokens == 0:  # the whole context is this chunk: plain causal
            ck, cv = k[rows].transpose(0, 1), v[rows].transpose(0, 1)
        else:
            ck = key_rows.index_select(0, chunk.gather_rows).view(kv_heads, -1, head_dim)[
                :, : chunk.context_len
            ]
            cv = value_rows.index_select(0, chunk.gather_rows).view(kv_heads, -1, head_dim)[
                :, : chunk.context_len
            ]
        shape = (group, kv_heads, chunk.context_len, head_dim)
        cout = F.scaled_dot_product_attention(
            cq,
            ck.expand(shape),
            cv.expand(shape),
            attn_mask=chunk.mask,
            is_causal=chunk.mask is None,
            scale=scale,
        )
        out[rows] = cout.permute(2, 1, 0, 3).reshape(n, num_heads * head_dim)
    return out
