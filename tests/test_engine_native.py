"""The compiled kernels: decode attention against a plain softmax over the blocks, the panel
matmul against an fp64 one, refusals of what they do not take, and torch's ops where they cannot
build or are turned off. (Their logits against transformers: ``test_engine_model.py``; the
engine's greedy tokens with them: ``test_engine_engine.py``, since the engine uses both for fp32
on the CPU.)"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf.quants import dequantize, quantize

from stallfree.engine import native
from stallfree.engine.model import apply_rope, rms_norm
from stallfree.engine.native import (
    chunk_attention_kernel,
    chunk_kernel_for,
    decode_attention_kernel,
    fused_ops_for,
    kernel_for,
    linear_kernel_for,
    native_module,
    pack_panels,
    pack_q8_panels,
    panel_linear_kernel,
    q8_panel_linear_kernel,
)


@pytest.fixture
def fresh_kernel() -> Iterator[None]:
    """Forget the process's kernel before and after (the next call builds or loads it again)."""
    native_module.cache_clear()
    yield
    native_module.cache_clear()


def reference(
    q: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    table: torch.Tensor,
    lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """fp64 softmax attention of each row over its own blocks, gathered the plain way."""
    kv_heads, _, block_size, dim = key.shape
    out = torch.empty(q.shape, dtype=torch.float64)
    for i, length in enumerate(lens.tolist()):
        blocks = table[i, : -(-length // block_size)]
        k = key[:, blocks].reshape(kv_heads, -1, dim)[:, :length].double()
        v = value[:, blocks].reshape(kv_heads, -1, dim)[:, :length].double()
        qi = q[i].view(kv_heads, -1, dim).double()
        probs = torch.softmax(qi @ k.transpose(1, 2) * scale, dim=-1)
        out[i] = (probs @ v).reshape(-1)
    return out


@pytest.mark.parametrize("group", [1, 3])
def test_kernel_matches_a_plain_softmax_over_the_blocks(group: int) -> None:
    kernel = decode_attention_kernel()
    assert kernel is not None, "the decode-attention kernel did not build (see the log)"
    gen = torch.Generator().manual_seed(group)
    kv_heads, num_blocks, block_size, dim = 2, 96, 16, 64
    key = torch.randn(kv_heads, num_blocks, block_size, dim, generator=gen)
    value = torch.randn(kv_heads, num_blocks, block_size, dim, generator=gen)
    lens = torch.tensor([1, 15, 16, 17, 100, 230])
    width = int(-(-lens.max() // block_size))
    table = torch.randperm(num_blocks, generator=gen)[: len(lens) * width].view(len(lens), width)
    q = torch.randn(len(lens), kv_heads * group * dim, generator=gen) * 3  # peaked softmaxes too
    got = kernel(q, key, value, table, lens, dim**-0.5)
    want = reference(q, key, value, table, lens, dim**-0.5)
    assert (got.double() - want).abs().max().item() < 2e-6


def test_kernel_refuses_what_it_does_not_take() -> None:
    kernel = decode_attention_kernel()
    assert kernel is not None
    key = torch.zeros(1, 4, 16, 8)
    table, lens, q = torch.zeros(1, 1, dtype=torch.long), torch.tensor([5]), torch.zeros(1, 8)
    with pytest.raises(RuntimeError, match="fp32 only"):
        kernel(q.bfloat16(), key.bfloat16(), key.bfloat16(), table, lens, 1.0)
    with pytest.raises(RuntimeError, match="block id out of range"):
        kernel(q, key, key, table + 9, lens, 1.0)
    with pytest.raises(RuntimeError, match="context length out of range"):
        kernel(q, key, key, table, torch.tensor([17]), 1.0)


@pytest.fixture
def bf16_dot() -> None:
    if not native.bf16_dot_products():
        pytest.skip("bf16 pair dot products need a CPU with AVX512-BF16")


@pytest.mark.parametrize(
    ("num_tokens", "before", "heads", "kv_heads", "dim", "block_size"),
    [
        (1, 0, 2, 2, 16, 16),
        (37, 0, 6, 2, 32, 4),  # a partial last key panel, blocks smaller than a panel
        (45, 18, 9, 3, 64, 16),  # earlier context, an odd number of keys seen
        (300, 700, 4, 1, 64, 16),  # tiles of a few tokens: each row's own causal limit in them
        (64, 0, 4, 4, 128, 32),
    ],
)
def test_chunk_attention_matches_a_causal_softmax_over_the_blocks(
    bf16_dot: None, num_tokens: int, before: int, heads: int, kv_heads: int, dim: int, block_size: int
) -> None:
    """The bf16 chunk kernel against fp64 attention of each token over its context (its earlier
    tokens and the chunk's up to itself) gathered from the blocks the plain way; q, K, V and the
    probabilities are rounded to bf16 (relative error ~0.4% each), so the bound is 3e-2."""
    kernel = chunk_attention_kernel()
    assert kernel is not None
    gen = torch.Generator().manual_seed(num_tokens)
    context = before + num_tokens
    num_blocks = -(-context // block_size)
    key = torch.randn(kv_heads, num_blocks + 3, block_size, dim, generator=gen)
    value = torch.randn(kv_heads, num_blocks + 3, block_size, dim, generator=gen)
    blocks = torch.randperm(num_blocks + 3, generator=gen)[:num_blocks]
    # q and out as rows of wider tensors (a view of the qkv output, the step's rows)
    qkv = torch.randn(num_tokens, heads * dim + 48, generator=gen) * 2  # peaked softmaxes too
    q, step_out = qkv[:, 16 : 16 + heads * dim], torch.full((num_tokens, heads * dim + 32), 7.0)
    got = step_out[:, 32:]
    kernel(q, key, value, blocks, before, dim**-0.5, got)
    assert (step_out[:, :32] == 7.0).all()  # nothing written outside out
    # each token as one row of the decode reference: its context ends at itself
    table = blocks.expand(num_tokens, num_blocks)
    want = reference(q, key, value, table, before + torch.arange(1, num_tokens + 1), dim**-0.5)
    assert got.shape == q.shape
    assert (got.double() - want).abs().max().item() < 3e-2


def test_chunk_attention_refuses_what_it_does_not_take(bf16_dot: None) -> None:
    kernel = chunk_attention_kernel()
    assert kernel is not None
    key, q, blocks = torch.zeros(1, 4, 16, 16), torch.zeros(3, 16), torch.tensor([0, 1])
    out = torch.empty(3, 16)
    with pytest.raises(RuntimeError, match="fp32 q and cache"):
        kernel(q.bfloat16(), key, key, blocks, 0, 1.0, out)
    with pytest.raises(RuntimeError, match="q and out must be"):
        kernel(q, key, key, blocks, 0, 1.0, torch.empty(16, 3).T)
    with pytest.raises(RuntimeError, match="head size 8 is not a multiple of 16"):
        small = key[..., :8].contiguous()
        kernel(torch.zeros(3, 8), small, small, blocks, 0, 1.0, torch.empty(3, 8))
    with pytest.raises(RuntimeError, match="too few blocks"):
        kernel(q, key, key, blocks, 30, 1.0, out)
    with pytest.raises(RuntimeError, match="block id out of range"):
        kernel(q, key, key, blocks + 3, 0, 1.0, out)


def test_chunk_attention_only_with_bf16_weights_and_dot_products(
    fresh_kernel: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    cpu, fp32 = torch.device("cpu"), torch.float32
    assert chunk_kernel_for(cpu, fp32, "panels", 64) is None  # fp32 matmuls: SDPA keeps fp32
    assert chunk_kernel_for(cpu, fp32, "q8_0", 64) is None
    assert chunk_kernel_for(cpu, fp32, "bf16", 72) is None  # a head size the kernel does not take
    assert chunk_kernel_for(torch.device("cuda"), fp32, "bf16", 64) is None
    assert (chunk_kernel_for(cpu, fp32, "bf16", 64) is not None) == native.bf16_dot_products()
    monkeypatch.setenv(native.BF16_DOT_ENV, "0")
    assert chunk_kernel_for(cpu, fp32, "bf16", 64) is None
    monkeypatch.setenv(native.BF16_DOT_ENV, "1")
    monkeypatch.setenv(native.ATTENTION_ENV, "0")
    assert chunk_kernel_for(cpu, fp32, "bf16", 64) is None


def test_where_it_cannot_build_the_engine_says_so_once_and_uses_torch(
    fresh_kernel: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    def no_compiler(*args: object, **kwargs: object) -> None:
        raise RuntimeError("Error building extension: c++: command not found\nmore detail")

    monkeypatch.setattr("torch.utils.cpp_extension.load_inline", no_compiler)
    monkeypatch.setattr("torch.utils.cpp_extension._get_build_directory", lambda *a, **k: str(tmp_path))
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        assert kernel_for(torch.device("cpu"), torch.float32) is None
        assert linear_kernel_for(torch.device("cpu"), torch.float32) is None
    notes = [r.getMessage() for r in caplog.records]
    assert notes == [
        "note: the engine runs torch's ops; its compiled kernels did not build "
        "(Error building extension: c++: command not found)"
    ]


def test_a_build_lock_left_by_a_stopped_start_is_removed_once_stale(tmp_path: Path) -> None:
    import os
    import time

    lock = tmp_path / "lock"
    lock.touch()
    native._drop_stale_lock(lock)
    assert lock.exists()  # a build may hold it now
    old = time.time() - native.STALE_LOCK_S - 1
    os.utime(lock, (old, old))
    native._drop_stale_lock(lock)
    assert not lock.exists()


def test_it_is_off_where_it_does_not_apply_or_is_turned_off(
    fresh_kernel: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert kernel_for(torch.device("cpu"), torch.bfloat16) is None
    assert kernel_for(torch.device("cuda"), torch.float32) is None
    monkeypatch.setenv(native.ATTENTION_ENV, "0")
    assert kernel_for(torch.device("cpu"), torch.float32) is None
    assert linear_kernel_for(torch.device("cpu"), torch.float32) is not None
    monkeypatch.setenv(native.LINEAR_ENV, "0")
    assert linear_kernel_for(torch.device("cpu"), torch.float32) is None
    assert linear_kernel_for(torch.device("cpu"), torch.bfloat16) is None


@pytest.mark.parametrize("rows", [1, 5, 6, 7, 16, 129])
@pytest.mark.parametrize("with_bias", [False, True])
def test_panel_linear_matches_an_fp64_matmul(rows: int, with_bias: bool) -> None:
    linear = panel_linear_kernel()
    assert linear is not None, "the compiled kernels did not build (see the log)"
    gen = torch.Generator().manual_seed(rows)
    out_features, in_features = 37, 100  # a partial last panel, K not a multiple of 8
    weight = torch.randn(out_features, in_features, generator=gen)
    x = torch.randn(rows, in_features, generator=gen)
    bias = torch.randn(out_features, generator=gen) if with_bias else None
    panels = pack_panels(weight)
    assert panels.shape == (3, in_features, 16) and not panels[2, :, 5:].any()
    want = x.double() @ weight.double().T + (0 if bias is None else bias.double())
    got = linear(x, panels, bias, out_features)
    assert got.shape == (rows, out_features)
    assert (got.double() - want).abs().max().item() < 1e-4


def unpack_bf16(panels: torch.Tensor, out_features: int, in_features: int) -> torch.Tensor:
    """bf16 panels of input pairs back to the weight [N, K]."""
    num_panels, pairs, _ = panels.shape
    weight = panels.view(num_panels, pairs, 16, 2).transpose(1, 2).reshape(num_panels * 16, 2 * pairs)
    return weight[:out_features, :in_features]


@pytest.mark.parametrize(
    "rows", [1, 3, 4, 7, 129]
)  # registers below 4 rows; from 4, pairs or a widened panel
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("dot", ["1", "0"])
def test_bf16_panels_match_an_fp64_matmul_over_the_bf16_weight(
    rows: int, with_bias: bool, dot: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every path gives the fp64 product of the bf16 weight with x, or (bf16 pair dot products,
    on a CPU with AVX512-BF16) with x rounded to bf16."""
    monkeypatch.setenv(native.BF16_DOT_ENV, dot)
    linear = panel_linear_kernel(bf16=True)
    assert linear is not None, "the compiled kernels did not build (see the log)"
    gen = torch.Generator().manual_seed(rows)
    out_features, in_features = 37, 99  # a partial last panel, an odd K (a padded last pair)
    weight = torch.randn(out_features, in_features, generator=gen)
    x = torch.randn(rows, in_features, generator=gen)
    bias = torch.randn(out_features, generator=gen) if with_bias else None
    panels = pack_panels(weight, torch.bfloat16)
    assert panels.dtype == torch.bfloat16 and panels.shape == (3, 50, 32)
    rounded = weight.bfloat16()  # a bf16 checkpoint's own values: packing keeps them exactly
    assert torch.equal(unpack_bf16(panels, out_features, in_features), rounded)
    assert not unpack_bf16(panels, 48, 100)[:, in_features:].any() and not panels[2, :, 10:].any()
    pairs = rows >= 4 and native.bf16_dot_products()
    assert not pairs or dot == "1"
    x_used = x.bfloat16() if pairs else x
    want = x_used.double() @ rounded.double().T + (0 if bias is None else bias.double())
    got = linear(x, panels, bias, out_features)
    assert got.dtype == torch.float32 and got.shape == (rows, out_features)
    assert (got.double() - want).abs().max().item() < 1e-4


def test_panel_linear_refuses_what_it_does_not_take() -> None:
    linear = panel_linear_kernel()
    assert linear is not None
    panels = pack_panels(torch.ones(20, 8))
    with pytest.raises(RuntimeError, match="fp32 activations only"):
        linear(torch.ones(2, 8).bfloat16(), panels, None, 20)
    with pytest.raises(RuntimeError, match="x has 9 features, the weight 8"):
        linear(torch.ones(2, 9), panels, None, 20)
    with pytest.raises(RuntimeError, match="2 panels cannot hold 40 features"):
        linear(torch.ones(2, 8), panels, None, 40)
    with pytest.raises(RuntimeError, match="bias must be fp32"):
        linear(torch.ones(2, 8), panels, torch.ones(19), 20)
    with pytest.raises(RuntimeError, match="fp32 panels \\[P, K, 16\\] or bf16 ones"):
        linear(torch.ones(2, 8), panels.half(), None, 20)
    with pytest.raises(RuntimeError, match="x has 9 features, the weight 4 pairs"):
        linear(torch.ones(2, 9), pack_panels(torch.ones(20, 8), torch.bfloat16), None, 20)


def unpack_q8(
    panels: torch.Tensor, scales: torch.Tensor, out_features: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed Q8_0 panels back to ``q`` [N, blocks, 32] and ``d`` [N, blocks]."""
    _, blocks, _, _ = panels.shape
    q = panels.permute(0, 3, 1, 2).reshape(-1, blocks, 32)[:out_features]
    d = scales.permute(0, 2, 1).reshape(-1, blocks)[:out_features]
    return q, d


def test_q8_packing_keeps_a_q8_0_files_blocks_bit_for_bit() -> None:
    """The loader dequantizes a Q8_0 GGUF to q * d; packing gives back the file's q and d, and
    packing the original weights gives the Q8_0 that llama.cpp's quantizer (gguf's copy) makes."""
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(40, 96, generator=gen) * torch.logspace(-3, 1, 40)[:, None]  # scales far apart
    weight[3, 32:64] = 0  # an all-zero block: d = 0
    raw = quantize(weight.numpy(), gguf.GGMLQuantizationType.Q8_0).reshape(40, 3, 34)
    file_d = torch.from_numpy(raw[..., :2].copy().view(np.float16)[..., 0].astype(np.float32))
    file_q = torch.from_numpy(raw[..., 2:].copy().view(np.int8))
    stored = torch.from_numpy(dequantize(raw.reshape(40, -1), gguf.GGMLQuantizationType.Q8_0))
    for source in (stored, weight):
        panels, scales = pack_q8_panels(source)
        assert panels.dtype == torch.int8 and panels.shape == (3, 3, 32, 16) and scales.shape == (3, 3, 16)
        q, d = unpack_q8(panels, scales, 40)
        assert torch.equal(q, file_q) and torch.equal(d, file_d)
        assert not panels[2, :, :, 8:].any()  # features past N are zero


@pytest.mark.parametrize("rows", [1, 5, 6, 7, 129])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("dot", ["1", "0"])
def test_q8_panel_linear_matches_an_fp64_matmul_over_the_dequantized_weight(
    rows: int, with_bias: bool, dot: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every path gives the fp64 product of the dequantized weight with x, or (int8 values in
    bf16 pair dot products, on a CPU with AVX512-BF16) with x rounded to bf16."""
    monkeypatch.setenv(native.BF16_DOT_ENV, dot)
    linear = q8_panel_linear_kernel()
    assert linear is not None, "the compiled kernels did not build (see the log)"
    gen = torch.Generator().manual_seed(rows)
    out_features, in_features = 37, 100  # a partial last panel and a partial last block
    weight = torch.randn(out_features, in_features, generator=gen)
    x = torch.randn(rows, in_features, generator=gen)
    bias = torch.randn(out_features, generator=gen) if with_bias else None
    panels, scales = pack_q8_panels(weight)
    q, d = unpack_q8(panels, scales, out_features)
    dequantized = (q.double() * d.double()[..., None]).reshape(out_features, -1)[:, :in_features]
    # within half a step of each block's scale, plus d's rounding to fp16 (up to 127 x 2^-11 of d)
    step = d.double().repeat_interleave(32, dim=1)[:, :in_features]
    assert ((dequantized - weight.double()).abs() <= 0.57 * step).all()
    x_used = x.bfloat16() if rows >= 4 and native.bf16_dot_products() else x
    want = x_used.double() @ dequantized.T + (0 if bias is None else bias.double())
    got = linear(x, panels, scales, bias, out_features)
    assert got.shape == (rows, out_features)
    assert (got.double() - want).abs().max().item() < 1e-4
    with pytest.raises(RuntimeError, match="x has 64 features, the weight 4 blocks of 32"):
        linear(x[:, :64].contiguous(), panels, scales, bias, out_features)


def test_fused_small_ops_match_torchs() -> None:
    ops = fused_ops_for(torch.device("cpu"), torch.float32)
    assert ops is not None, "the compiled kernels did not build (see the log)"
    gen = torch.Generator().manual_seed(0)
    rows, q_heads, kv_heads, dim = 37, 6, 2, 16  # rows past one task's grain
    x, weight = torch.randn(rows, 48, generator=gen), torch.randn(48, generator=gen)
    assert torch.allclose(ops.rms_norm(x, weight, 1e-5), rms_norm(x, weight, 1e-5), atol=1e-6)
    qkv = torch.randn(rows, (q_heads + 2 * kv_heads) * dim, generator=gen)
    angles = torch.randn(rows, dim // 2, generator=gen)
    cos, sin = angles.cos(), angles.sin()
    want = qkv.clone().view(rows, -1, dim)
    want[:, : q_heads + kv_heads] = apply_rope(want[:, : q_heads + kv_heads], cos[:, None], sin[:, None])
    ops.rope_(qkv, cos, sin, q_heads, kv_heads)
    assert torch.allclose(qkv, want.view(rows, -1), atol=1e-6)
    gate_up = torch.randn(rows, 2 * 24, generator=gen) * 4
    gate_up[0, :6] = torch.tensor([0.0, -0.0, 30.0, -30.0, 100.0, -100.0])  # both sides of sigmoid's split
    gate, up = gate_up.chunk(2, dim=-1)
    assert torch.allclose(ops.silu_mul(gate_up), torch.nn.functional.silu(gate) * up, atol=1e-5)
    with pytest.raises(RuntimeError, match="not \\(q \\+ 2 kv\\) heads of 16"):
        ops.rope_(qkv, cos, sin, q_heads + 1, kv_heads)


def test_the_panel_split_over_threads_gives_the_same_numbers() -> None:
    """Built with OpenMP, the kernels split the panels over torch's threads: any split is exact."""
    linear = panel_linear_kernel()
    assert linear is not None
    weight, x = torch.randn(4096, 512), torch.randn(64, 512)
    panels = pack_panels(weight)
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            results.append(linear(x, panels, None, 4096))
        assert torch.allclose(results[0], x @ weight.T, atol=1e-3)
        assert all(torch.equal(results[0], other) for other in results[1:])
    finally:
        torch.set_num_threads(before)
