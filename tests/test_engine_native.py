"""The compiled decode-attention kernel: the same numbers as a plain softmax over the blocks,
refusals of what it does not take, and the torch path where it cannot build or is turned off.
(Its logits against transformers: ``test_engine_model.py``; the engine's greedy tokens with it:
``test_engine_engine.py``, since the engine uses it for fp32 on the CPU.)"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
import torch

from stallfree.engine import native
from stallfree.engine.native import decode_attention_kernel, kernel_for


@pytest.fixture
def fresh_kernel() -> Iterator[None]:
    """Forget the process's kernel before and after (the next call builds or loads it again)."""
    decode_attention_kernel.cache_clear()
    yield
    decode_attention_kernel.cache_clear()


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


def test_where_it_cannot_build_the_engine_says_so_once_and_uses_torch(
    fresh_kernel: None, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def no_compiler(*args: object, **kwargs: object) -> None:
        raise RuntimeError("Error building extension: c++: command not found\nmore detail")

    monkeypatch.setattr("torch.utils.cpp_extension.load_inline", no_compiler)
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        assert kernel_for(torch.device("cpu"), torch.float32) is None
        assert kernel_for(torch.device("cpu"), torch.float32) is None
    notes = [r.getMessage() for r in caplog.records]
    assert notes == [
        "note: decode attention runs through torch; its compiled kernel did not build "
        "(Error building extension: c++: command not found)"
    ]


def test_it_is_off_where_it_does_not_apply_or_is_turned_off(
    fresh_kernel: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert kernel_for(torch.device("cpu"), torch.bfloat16) is None
    assert kernel_for(torch.device("cuda"), torch.float32) is None
    monkeypatch.setenv(native.ENV, "0")
    assert kernel_for(torch.device("cpu"), torch.float32) is None
