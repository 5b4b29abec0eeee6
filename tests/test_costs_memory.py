"""KV capacity from hardware, worked by hand."""

from __future__ import annotations

import pytest

from stallfree.costs.memory import activation_reserve_bytes, kv_memory
from stallfree.specs import HARDWARE_PRESETS, load_model_spec

GIB = 2**30


def test_llama_3_8b_on_one_a100_80gb() -> None:
    """usable = 80 GiB x 0.9 = 77,309,411,328 B; weights = 8,030,261,248 params x 2 B
    = 16,060,522,496 B. Reserve for a 512-token step: per token per GPU 2 x 4096 (residual +
    normed) + 4096 + 2 x 1024 (q, k, v) + 2 x 14336 (gate, up) = 43,008 values x 2 B x 512 =
    44,040,192 B, plus float32 logits 256 x 128,256 x 4 = 131,334,144 B. KV per token =
    2 (K, V) x 32 layers x 1024 x 2 B = 131,072 B, so a 16-token block is 2 MiB.
    (77,309,411,328 - 16,060,522,496 - 175,374,336) / 2,097,152 = 29,122.1 -> 29,122 blocks."""
    kv = kv_memory(
        load_model_spec("llama-3-8b"),
        HARDWARE_PRESETS["a100-80gb"],
        max_num_batched_tokens=512,
        max_num_seqs=256,
    )
    assert kv.usable_bytes == pytest.approx(77_309_411_328)
    assert kv.weight_bytes == 16_060_522_496
    assert kv.activation_reserve_bytes == 44_040_192 + 131_334_144
    assert kv.kv_bytes_per_token == 131_072
    assert kv.num_blocks == 29_122
    assert kv.num_tokens == 29_122 * 16


def test_tensor_parallelism_adds_memory_and_replicates_few_kv_heads() -> None:
    """Llama-3-70B has 8 KV heads: on 16 GPUs each head lives on 2 of them, so a token's KV
    takes twice its bytes summed over the replica."""
    model, hw = load_model_spec("llama-3-70b"), HARDWARE_PRESETS["h100-sxm"]
    tp8 = kv_memory(model, hw, tp=8)
    tp16 = kv_memory(model, hw, tp=16)
    assert tp16.kv_bytes_per_token == 2 * tp8.kv_bytes_per_token == 2 * model.kv_bytes_per_token(2)
    assert tp8.usable_bytes == pytest.approx(8 * 80 * GIB * 0.9)


def test_reserve_grows_with_the_step() -> None:
    model = load_model_spec("llama-3-8b")
    small = activation_reserve_bytes(model, tp=1, dtype_bytes=2, max_num_batched_tokens=512, max_num_seqs=8)
    big = activation_reserve_bytes(model, tp=1, dtype_bytes=2, max_num_batched_tokens=8192, max_num_seqs=8)
    assert big - small == (8192 - 512) * 43_008 * 2


def test_a_model_that_does_not_fit_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"does not fit on 1 x a100-40gb.*weights 141\.1 GB"):
        kv_memory(load_model_spec("llama-3-70b"), HARDWARE_PRESETS["a100-40gb"])


@pytest.mark.parametrize(
    ("kw", "match"),
    [({"gpu_memory_utilization": 0.0}, "gpu_memory_utilization"), ({"block_size": 0}, "block_size")],
)
def test_bad_settings(kw: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        kv_memory(load_model_spec("llama-3-8b"), HARDWARE_PRESETS["a100-80gb"], **kw)  # type: ignore[arg-type]
