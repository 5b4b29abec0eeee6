"""The KV transfer of disaggregated serving: bytes from the model's layout, time over a link."""

from __future__ import annotations

import dataclasses

import pytest

from stallfree.costs.kv_transfer import KvLink, kv_link, kv_transfer, kv_transfer_bytes
from stallfree.specs import load_hardware_spec, load_model_spec

LLAMA_70B = load_model_spec("llama-3.1-70b")
H100 = load_hardware_spec("h100-sxm")


def test_a_16k_prompt_of_llama_70b_by_hand() -> None:
    # 80 layers x (K + V) x 8 KV heads x 128 dims = 163,840 values a token
    assert (LLAMA_70B.num_layers, LLAMA_70B.num_kv_heads, LLAMA_70B.head_dim) == (80, 8, 128)
    bf16 = kv_transfer_bytes(LLAMA_70B, 16384, 2)
    fp8 = kv_transfer_bytes(LLAMA_70B, 16384, 1)
    assert bf16 == 80 * 2 * 8 * 128 * 2 * 16384 == 5_368_709_120 and fp8 == bf16 // 2
    # NVLink: 450 GB/s a GPU one way on an H100, TP 4 to TP 4: four GPUs send their shards at once
    nvlink = kv_transfer(LLAMA_70B, 16384, 2, kv_link("nvlink", H100), tp_prefill=4, tp_decode=4)
    assert nvlink.num_links == 4 and nvlink.wire_s == pytest.approx(10e-6 + 5_368_709_120 / (4 * 450e9))
    # 400 Gb/s RDMA (50 GB/s) a GPU: 26.8 ms in bf16, 13.4 ms in fp8
    ib = kv_transfer(LLAMA_70B, 16384, 2, kv_link("ib-400", H100), tp_prefill=4, tp_decode=4)
    assert ib.wire_s == pytest.approx(5e-6 + 5_368_709_120 / 200e9) and 0.0268 < ib.wire_s < 0.0269
    ib_fp8 = kv_transfer(LLAMA_70B, 16384, 1, kv_link("ib-400", H100), tp_prefill=4, tp_decode=4)
    assert ib_fp8.wire_s == pytest.approx(5e-6 + 2_684_354_560 / 200e9)
    # the smaller group sets how many links run: TP 8 prefill to TP 2 decode, two
    assert kv_transfer(LLAMA_70B, 16384, 2, kv_link("ib-400", H100), tp_prefill=8, tp_decode=2).num_links == 2


def test_sliding_window_layers_and_latent_attention_hold_less() -> None:
    windowed = dataclasses.replace(LLAMA_70B, sliding_window=4096, num_sliding_layers=40)
    per_layer_token = 2 * 8 * 128 * 2
    assert kv_transfer_bytes(windowed, 16384, 2) == per_layer_token * (40 * 16384 + 40 * 4096)
    assert kv_transfer_bytes(windowed, 1000, 2) == kv_transfer_bytes(LLAMA_70B, 1000, 2)  # within the window
    mla = dataclasses.replace(LLAMA_70B, kv_lora_rank=512, qk_rope_head_dim=64)
    assert kv_transfer_bytes(mla, 16384, 2) == 80 * (512 + 64) * 2 * 16384


def test_layer_by_layer_hides_the_transfer_behind_the_prefill() -> None:
    link = KvLink("slow", 1e9, 0.0)
    plain = kv_transfer(LLAMA_70B, 16384, 2, link, prefill_s=1.0)
    assert plain.exposed_s == plain.wire_s  # sent once the prefill is done: all of it on the clock
    layered = kv_transfer(LLAMA_70B, 16384, 2, link, prefill_s=1.0, overlap=True)
    # 5.37 s on the wire against 1 s of compute: what outlasts 79/80 of the prefill stays exposed
    assert layered.exposed_s == pytest.approx(plain.wire_s - 79 / 80)
    fast = kv_transfer(LLAMA_70B, 16384, 2, KvLink("fast", 1e12, 0.0), prefill_s=1.0, overlap=True)
    assert fast.exposed_s == pytest.approx(fast.wire_s / 80)  # hidden but for the last layer


def test_links_are_named_or_given_in_gb_per_s() -> None:
    assert kv_link("nvlink", H100).bytes_per_s == H100.interconnect_bandwidth_bytes_per_s
    assert kv_link("25", H100).bytes_per_s == 25e9
    with pytest.raises(ValueError, match="unknown KV link"):
        kv_link("carrier-pigeon", H100)
    with pytest.raises(ValueError, match="positive"):
        kv_link("0", H100)
