"""Model and hardware specs: presets, HF-config parsing, derived sizes, bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stallfree.specs import (
    HARDWARE_PRESETS,
    MODEL_PRESETS,
    HardwareSpec,
    ModelSpec,
    hardware_spec_from_dict,
    load_hardware_spec,
    load_model_spec,
)

TINY_LLAMA: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "intermediate_size": 128,
    "vocab_size": 100,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "bos_token_id": 1,
    "eos_token_id": [2, 3],
}


def test_tiny_llama_param_count_by_hand() -> None:
    """hidden 64, 2 layers, 4 heads of 16, 2 KV heads, MLP 128, vocab 100.

    per layer: q 64x64 = 4096, o 4096, k and v 64x32 = 2048 each -> 12,288;
    MLP 3 x 64 x 128 = 24,576; two norms 128 -> 36,992.
    non-embedding: 2 x 36,992 + final norm 64 = 74,048.
    total: embedding 6,400 + 74,048 + LM head 6,400 = 86,848 (80,448 when tied).
    KV per token in bf16: 2 (K, V) x 2 layers x 2 heads x 16 x 2 B = 256 B.
    """
    spec = ModelSpec.from_hf_config(TINY_LLAMA, name="tiny")
    assert spec.head_dim == 16
    assert spec.num_non_embedding_params == 74_048
    assert spec.num_params == 86_848
    assert spec.weight_bytes(2) == 2 * 86_848
    assert spec.kv_bytes_per_token(2) == 256
    tied = ModelSpec.from_hf_config(TINY_LLAMA | {"tie_word_embeddings": True}, name="tiny")
    assert tied.num_params == 80_448
    assert spec.eos_token_ids == (2, 3)


def test_qwen2_counts_qkv_biases() -> None:
    """Qwen2 adds q (64) + k (32) + v (32) = 128 bias values per layer: 86,848 + 2 x 128 = 87,104."""
    config = TINY_LLAMA | {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"}
    spec = ModelSpec.from_hf_config(config, name="tiny-qwen")
    assert spec.attention_bias
    assert spec.num_params == 87_104


@pytest.mark.parametrize(
    ("preset", "billions"),
    [
        # Published sizes: the issue's 8.03 B and 70.6 B, and the model cards' counts.
        ("llama-3-8b", 8.03),
        ("llama-3-70b", 70.6),
        ("llama-3.1-405b", 405.9),
        ("llama-2-7b", 6.74),
        ("llama-2-13b", 13.0),
        ("mistral-7b", 7.25),
        ("qwen2.5-7b", 7.62),
        ("qwen2.5-72b", 72.7),
        ("yi-34b", 34.4),
    ],
)
def test_preset_param_counts_match_published(preset: str, billions: float) -> None:
    spec = load_model_spec(preset)
    digits = len(str(billions).split(".")[1])
    assert spec.num_params / 1e9 == pytest.approx(billions, abs=0.5 * 10**-digits)


def test_llama3_8b_exact_figures() -> None:
    """8,030,261,248 params is the sum of the safetensors shards' element counts of Meta-Llama-3-8B.

    KV per token: 2 x 32 layers x 8 KV heads x 128 x 2 B = 131,072 B (128 KiB).
    """
    spec = load_model_spec("llama-3-8b")
    assert spec.num_params == 8_030_261_248
    assert spec.kv_bytes_per_token(2) == 131_072


def test_every_preset_round_trips_through_hf_config() -> None:
    assert len(MODEL_PRESETS) >= 13
    for name in MODEL_PRESETS:
        spec = load_model_spec(name)
        assert ModelSpec.from_hf_config(spec.to_hf_config(), name=name) == spec
        hash(spec)  # hashable, rope_scaling included


def test_llama31_rope_scaling() -> None:
    spec = load_model_spec("llama-3.1-405b")
    assert spec.rope_scaling_dict() == {
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
        "rope_type": "llama3",
    }
    assert load_model_spec("llama-3-8b").rope_scaling_dict() is None


def test_load_from_file_and_folder(tmp_path: Path) -> None:
    folder = tmp_path / "my-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA))
    from_folder = load_model_spec(str(folder))
    from_file = load_model_spec(str(folder / "config.json"))
    assert from_folder == from_file
    assert from_folder.name == "my-model"


def test_to_hf_config_is_read_by_transformers() -> None:
    """transformers builds the same model from our config: its parameter count equals ours."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    for extra in (
        {},
        {"tie_word_embeddings": True},
        {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2"},
    ):
        spec = ModelSpec.from_hf_config(TINY_LLAMA | extra, name="tiny")
        config = transformers.AutoConfig.for_model(**spec.to_hf_config())
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config)
        assert sum(p.numel() for p in model.parameters()) == spec.num_params


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({"architectures": ["BertForMaskedLM"], "model_type": "bert", "hidden_size": 768}, "BertForMaskedLM"),
        ({"model_type": "t5", "d_model": 512}, "t5"),
        ({"hidden_size": 64}, "neither"),
        (TINY_LLAMA | {"num_hidden_layers": None}, "num_hidden_layers"),
        (TINY_LLAMA | {"num_key_value_heads": 3}, "multiple"),
        (TINY_LLAMA | {"hidden_act": "gelu"}, "hidden_act"),
        (TINY_LLAMA | {"intermediate_size": 0}, "intermediate_size"),
        (TINY_LLAMA | {"model_type": "qwen2"}, "does not match"),
        (TINY_LLAMA | {"eos_token_id": "</s>"}, "eos_token_id"),
        (TINY_LLAMA | {"rope_theta": "big"}, "rope_theta"),
        (TINY_LLAMA | {"hidden_size": "64"}, "hidden_size"),
        (
            TINY_LLAMA
            | {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "sliding_window": 64}
            | {"use_sliding_window": True},
            "sliding-window",
        ),
    ],
)
def test_rejects_configs_we_do_not_model(config: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        ModelSpec.from_hf_config(config, name="bad")
    assert "\n" not in str(info.value)


def test_unknown_model_name_lists_presets() -> None:
    with pytest.raises(ValueError, match="llama-3-70b"):
        load_model_spec("llama-9")


def test_bad_model_files(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not found"):
        load_model_spec(str(tmp_path / "nope.json"))
    broken = tmp_path / "broken.json"
    broken.write_text("{")
    with pytest.raises(ValueError, match="cannot read"):
        load_model_spec(str(broken))
    listed = tmp_path / "list.json"
    listed.write_text("[]")
    with pytest.raises(ValueError, match="not a JSON object"):
        load_model_spec(str(listed))


def test_hardware_presets_are_the_datasheet_figures() -> None:
    assert set(HARDWARE_PRESETS) >= {"a100-40gb", "a100-80gb", "h100-sxm", "h200-sxm", "b200-sxm", "mi300x"}
    assert load_hardware_spec("h200") == load_hardware_spec("h200-sxm")  # the older name, an alias
    assert load_hardware_spec("b200-sxm").mem_bandwidth_bytes_per_s == 7.7e12
    a100 = load_hardware_spec("a100-40gb")
    assert a100.peak_flops_per_s == 312e12
    assert a100.mem_bandwidth_bytes_per_s == 1.555e12
    assert a100.mem_capacity_bytes == 40 * 2**30
    assert load_hardware_spec("h100-sxm").peak_flops_per_s == 989e12
    assert load_hardware_spec("mi300x").mem_bandwidth_bytes_per_s == 5.3e12


def test_hardware_from_json(tmp_path: Path) -> None:
    data = {
        "name": "toy",
        "peak_flops_per_s": 1e12,
        "mem_bandwidth_bytes_per_s": 1e9,
        "mem_capacity_bytes": 8e9,
        "interconnect_bandwidth_bytes_per_s": 1e9,
    }
    path = tmp_path / "toy.json"
    path.write_text(json.dumps(data))
    spec = load_hardware_spec(str(path))
    assert spec == HardwareSpec("toy", 1e12, 1e9, 8e9, 1e9, 0.0)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"peak_flops_per_s": 1e12}, "missing mem_bandwidth_bytes_per_s"),
        (
            {
                "peak_flops_per_s": "fast",
                "mem_bandwidth_bytes_per_s": 1e9,
                "mem_capacity_bytes": 1e9,
                "interconnect_bandwidth_bytes_per_s": 1e9,
            },
            "peak_flops_per_s is not a number",
        ),
        (
            {
                "peak_flops_per_s": -1,
                "mem_bandwidth_bytes_per_s": 1e9,
                "mem_capacity_bytes": 1e9,
                "interconnect_bandwidth_bytes_per_s": 1e9,
            },
            "peak_flops_per_s must be positive",
        ),
        ({"flops": 1}, "unknown field flops"),
    ],
)
def test_bad_hardware_specs(data: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message) as info:
        hardware_spec_from_dict(data)
    assert "\n" not in str(info.value)


def test_unknown_hardware_name_lists_presets(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="h100-sxm"):
        load_hardware_spec("tpu-v9")
    with pytest.raises(ValueError, match="not found"):
        load_hardware_spec(str(tmp_path / "gone.json"))


def test_every_preset_names_its_hugging_face_repository() -> None:
    from stallfree.specs.model_presets import HF_REPOS, MODEL_PRESETS

    assert set(HF_REPOS) == set(MODEL_PRESETS)
    assert all(repo.count("/") == 1 for repo in HF_REPOS.values())


def test_transformers_5_rope_parameters_are_read() -> None:
    """transformers 5 writes rope_theta and the scaling inside one rope_parameters dict."""
    from stallfree.specs import load_model_spec

    ref = load_model_spec("llama-3.1-8b")
    config = ref.to_hf_config()
    scaling = config.pop("rope_scaling")
    config["rope_parameters"] = {"rope_theta": config.pop("rope_theta"), **scaling}
    spec = ModelSpec.from_hf_config(config, name=ref.name)
    assert spec.rope_theta == ref.rope_theta == 500000.0
    assert spec.rope_scaling == ref.rope_scaling
    plain = load_model_spec("llama-3-8b").to_hf_config()
    plain.pop("rope_scaling")
    plain["rope_parameters"] = {"rope_theta": plain.pop("rope_theta"), "rope_type": "default"}
    spec = ModelSpec.from_hf_config(plain)
    assert spec.rope_theta == 500000.0 and spec.rope_scaling is None
