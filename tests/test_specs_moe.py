"""Mixture-of-experts models in the specs and the roofline: active vs total parameters, the experts
a step reads, the ridge that moves, and the refusals (the engine, Vidur's dense tables)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from stallfree.cli import main
from stallfree.core.plan import StepPlan, synthetic_plan
from stallfree.costs.choice import CostChoice, pick_cost_model
from stallfree.costs.roofline import CostModel, CostModelConfig
from stallfree.specs import ModelSpec, load_hardware_spec
from tests.factories import shifted_plans

# Qwen3-30B-A3B's published architecture (its config.json's fields)
QWEN3_MOE: dict[str, Any] = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "hidden_act": "silu",
    "hidden_size": 2048,
    "num_hidden_layers": 48,
    "num_attention_heads": 32,
    "num_key_value_heads": 4,
    "head_dim": 128,
    "intermediate_size": 6144,
    "moe_intermediate_size": 768,
    "num_experts": 128,
    "num_experts_per_tok": 8,
    "vocab_size": 151936,
    "max_position_embeddings": 40960,
    "rope_theta": 1000000.0,
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False,
    "sliding_window": None,
    "use_sliding_window": False,
    "mlp_only_layers": [],
    "decoder_sparse_step": 1,
}
MIXTRAL: dict[str, Any] = {
    "architectures": ["MixtralForCausalLM"],
    "model_type": "mixtral",
    "hidden_act": "silu",
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 14336,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "vocab_size": 32000,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
}


def test_active_and_total_parameters_are_the_published_ones() -> None:
    qwen = ModelSpec.from_hf_config(QWEN3_MOE, name="qwen3-30b-a3b")
    assert qwen.is_moe and qwen.num_params / 1e9 == pytest.approx(30.5, abs=0.1)
    assert qwen.num_active_params / 1e9 == pytest.approx(3.3, abs=0.1)  # "A3B"
    mixtral = ModelSpec.from_hf_config(MIXTRAL, name="mixtral")
    assert mixtral.num_params / 1e9 == pytest.approx(46.7, abs=0.1)
    assert mixtral.num_active_params / 1e9 == pytest.approx(12.9, abs=0.1)
    # the config round-trips, and a dense model is one expert every token takes
    assert ModelSpec.from_hf_config(qwen.to_hf_config(), name="qwen3-30b-a3b") == qwen
    dense = ModelSpec.from_hf_config(
        {**MIXTRAL, "architectures": ["MistralForCausalLM"], "model_type": "mistral"}
    )
    assert not dense.is_moe and dense.num_active_params == dense.num_params


def test_a_step_reads_the_experts_its_tokens_route_to() -> None:
    qwen = ModelSpec.from_hf_config(QWEN3_MOE, name="qwen3-30b-a3b")
    assert qwen.expected_experts(1) == pytest.approx(8)
    assert qwen.expected_experts(16) == pytest.approx(128 * (1 - (120 / 128) ** 16))
    assert qwen.expected_experts(4096) == pytest.approx(128)
    reads = [qwen.decoder_weight_bytes(1, n) for n in (1, 4, 16, 64, 512)]
    assert reads == sorted(reads) and reads[-1] == pytest.approx(qwen.num_non_embedding_params)
    assert reads[0] == pytest.approx(qwen.num_active_non_embedding_params)


def test_the_roofline_ridge_moves_and_the_fast_path_holds() -> None:
    qwen = ModelSpec.from_hf_config(QWEN3_MOE, name="qwen3-30b-a3b")
    cost = CostModel(CostModelConfig(qwen, load_hardware_spec("h200-sxm"), kind="full"))
    # decode reads only its experts: one stream is far cheaper than reading all 30B weights
    one = cost.decode_step_s(1, 512)
    assert one < 0.3 * cost.decode_step_s(256, 512)
    # the ridge: where a step's FLOPs catch up with reading every expert, 10x a dense model's
    assert cost.ridge_tokens() > 10 * cost.dense_ridge_tokens()
    plan = StepPlan((*synthetic_plan(9, 300).chunks, *synthetic_plan(0, 0, 100, 200).chunks))
    shifted = shifted_plans(plan, 30)
    assert np.array_equal(cost.steady_durations(plan, 30), [cost.step_time_s(p) for p in shifted])


def test_expert_parallelism_waits_for_the_busiest_gpu() -> None:
    qwen = ModelSpec.from_hf_config(QWEN3_MOE, name="qwen3-30b-a3b")
    assert qwen.busiest_experts(16, 1) == qwen.expected_experts(16)
    # against routing itself: each token takes 8 distinct experts of 128, 16 on each of 8 GPUs
    rng = np.random.default_rng(7)
    for tokens in (1, 8, 64):
        picks = np.argsort(rng.random((4000, tokens, 128)), axis=2)[:, :, :8].reshape(4000, -1)
        touched = np.zeros((4000, 128), dtype=bool)
        np.put_along_axis(touched, picks, True, axis=1)
        busiest = touched.reshape(4000, 8, 16).sum(axis=2).max(axis=1).mean()
        assert qwen.busiest_experts(tokens, 8) == pytest.approx(busiest, rel=0.03)
        assert qwen.busiest_experts(tokens, 8) > qwen.expected_experts(tokens) / 8
    assert qwen.busiest_experts(4096, 8) == pytest.approx(16)  # every expert: no imbalance left
    h200 = load_hardware_spec("h200-sxm")
    sliced, split = (
        CostModel(CostModelConfig(qwen, h200, tp=8, kind="full", expert_parallel=ep)) for ep in (False, True)
    )
    # one token's 8 experts: an even split would read 1 a GPU, the busiest reads ~2.3; the step
    # (memory-bound) waits for those bytes. A large step reads every expert either way.
    assert qwen.busiest_experts(1, 8) > 2.0
    extra = qwen.decoder_weight_bytes(2, 1, 8) - qwen.decoder_weight_bytes(2, 1)
    assert split.decode_step_s(1, 512) - sliced.decode_step_s(1, 512) == pytest.approx(
        extra / (h200.mem_bandwidth_bytes_per_s * 8)
    )
    assert extra > 0.1 * qwen.decoder_weight_bytes(2, 1)
    assert split.prefill_time_s(8192) == pytest.approx(sliced.prefill_time_s(8192), rel=1e-6)
    plan = StepPlan((*synthetic_plan(9, 300).chunks, *synthetic_plan(0, 0, 100, 200).chunks))
    assert np.array_equal(
        split.steady_durations(plan, 20), [split.step_time_s(p) for p in shifted_plans(plan, 20)]
    )
    sixty = ModelSpec.from_hf_config({**QWEN3_MOE, "num_experts": 60}, name="sixty")  # as Qwen2-MoE's
    with pytest.raises(ValueError, match="60 experts do not split evenly over tp=8"):
        CostModelConfig(sixty, h200, tp=8, expert_parallel=True)
    dense = ModelSpec.from_hf_config(
        {**MIXTRAL, "architectures": ["MistralForCausalLM"], "model_type": "mistral"}
    )
    with pytest.raises(ValueError, match="is dense"):
        CostModelConfig(dense, h200, tp=2, expert_parallel=True)
    # Vidur's tables are dense and a profile measured its own server: neither prices a split
    mixtral = ModelSpec.from_hf_config(MIXTRAL, name="mixtral")
    vidur = CostChoice("measured", mixtral, "a100-80gb", 2, gpu_tables="vidur", expert_parallel=True)
    with pytest.raises(ValueError, match="Vidur's GPU tables are of dense models"):
        pick_cost_model(vidur)
    with pytest.raises(ValueError, match="a profile measured its server"):
        pick_cost_model(CostChoice(profile="p.json", expert_parallel=True))


def test_expert_parallelism_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "config.json"
    config.write_text(json.dumps(QWEN3_MOE))
    argv = ["explain", "--model", str(config), "--hardware", "h200-sxm", "--tp", "8", "--cost-model", "full"]
    assert main([*argv, "--expert-parallel"]) == 0
    out = capsys.readouterr().out
    assert "on 8 x h200-sxm, experts split whole over them (EP)" in out
    assert "the busiest of 8 GPUs holding 16 each" in out
    config.write_text(json.dumps({**QWEN3_MOE, "num_experts": 60}))
    assert main([*argv, "--expert-parallel"]) == 2
    assert capsys.readouterr().err.strip().endswith("60 experts do not split evenly over tp=8 GPUs")
    assert (
        main(["explain", "--model", "llama-3-8b", "--tp", "2", "--cost-model", "full", "--expert-parallel"])
        == 2
    )
    assert "is dense" in capsys.readouterr().err


def test_vidur_and_the_engine_refuse_a_mixture_of_experts(tmp_path: Path) -> None:
    qwen = ModelSpec.from_hf_config(QWEN3_MOE, name="qwen3-30b-a3b")
    with pytest.raises(ValueError, match="Vidur's tables are of dense models"):
        pick_cost_model(CostChoice(kind="measured", model=qwen, hardware="a100-80gb", gpu_tables="vidur"))
    # auto leaves Vidur's tables to dense models: the roofline, or aiconfigurator-core's tables
    assert (
        pick_cost_model(CostChoice(model=qwen, hardware="a100-80gb", gpu_tables="vidur")).source == "roofline"
    )
    pytest.importorskip("torch")
    from stallfree.engine.model import LlamaModel

    with pytest.raises(ValueError, match="the simulator prices but the engine does not run"):
        LlamaModel(qwen)


def test_unsupported_moe_layouts_are_one_line() -> None:
    deepseek = {**QWEN2_MOE, "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3"}
    with pytest.raises(ValueError, match="moe_layer_freq"):
        ModelSpec.from_hf_config({**deepseek, "n_routed_experts": 64, "moe_layer_freq": 2})
    with pytest.raises(ValueError, match="experts per token"):
        ModelSpec.from_hf_config({**QWEN3_MOE, "num_experts_per_tok": 200})
    with pytest.raises(ValueError, match="use_sliding_window"):
        ModelSpec.from_hf_config({**QWEN2_MOE, "use_sliding_window": True})


# Qwen2-57B-A14B's published architecture: shared experts beside the routed ones
QWEN2_MOE: dict[str, Any] = {
    "architectures": ["Qwen2MoeForCausalLM"],
    "model_type": "qwen2_moe",
    "hidden_act": "silu",
    "hidden_size": 3584,
    "intermediate_size": 18944,
    "num_hidden_layers": 28,
    "num_attention_heads": 28,
    "num_key_value_heads": 4,
    "num_experts": 64,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 2560,
    "shared_expert_intermediate_size": 20480,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "vocab_size": 151936,
    "max_position_embeddings": 32768,
    "rope_theta": 1000000.0,
    "sliding_window": 65536,
    "use_sliding_window": False,
    "tie_word_embeddings": False,
}


def test_shared_experts_and_dense_layers_count() -> None:
    qwen2 = ModelSpec.from_hf_config(QWEN2_MOE, name="qwen2-57b-a14b")
    assert qwen2.num_params / 1e9 == pytest.approx(57.4, abs=0.1)  # "A14B": the shared expert is active
    assert qwen2.num_active_params / 1e9 == pytest.approx(14.2, abs=0.1)
    assert ModelSpec.from_hf_config(qwen2.to_hf_config(), name="qwen2-57b-a14b") == qwen2
    # every other layer dense (decoder_sparse_step 2): its MLP is intermediate_size wide, all of it active
    half = ModelSpec.from_hf_config({**QWEN2_MOE, "decoder_sparse_step": 2}, name="half")
    assert (half.moe_dense_layers, half.num_moe_layers) == (14, 14)
    dense_mlp, moe_mlp = 3 * 3584 * 18944, qwen2.moe_mlp_params
    assert qwen2.num_params - half.num_params == 14 * (moe_mlp - dense_mlp)
    idle = (64 - 8) * qwen2.expert_params
    assert half.num_params - half.num_active_params == 14 * idle
    assert half.decoder_weight_bytes(1, 1) == pytest.approx(half.num_active_non_embedding_params)


def test_windowed_attention_counts_only_the_window() -> None:
    from stallfree.costs.roofline import window_keys

    for before, n, window in ((0, 7, 4), (3, 1, 4), (10, 5, 4), (2, 9, 6), (100, 1, 128), (0, 300, 128)):
        brute = sum(min(p + 1, window) for p in range(before, before + n))
        assert int(window_keys(before, n, window)) == brute
    mistral = ModelSpec.from_hf_config({**MIXTRAL, "sliding_window": 4096}, name="mixtral-window")
    assert (mistral.sliding_window, mistral.num_sliding_layers) == (4096, 32)
    hw = load_hardware_spec("h200-sxm")
    windowed = CostModel(CostModelConfig(mistral, hw, kind="full"))
    unbounded = CostModel(CostModelConfig(ModelSpec.from_hf_config(MIXTRAL, name="m"), hw, kind="full"))
    # within the window the two agree; far past it the windowed model reads 4K tokens a row, not 32K
    assert windowed.decode_step_s(64, 2000) == unbounded.decode_step_s(64, 2000)
    assert windowed.decode_step_s(64, 32000) < 0.6 * unbounded.decode_step_s(64, 32000)
    assert windowed.decode_step_s(64, 32000) == windowed.decode_step_s(64, 8000)
    plan = StepPlan((*synthetic_plan(9, 4000).chunks, *synthetic_plan(0, 0, 512, 3000).chunks))
    shifted = shifted_plans(plan, 30)
    assert np.array_equal(windowed.steady_durations(plan, 30), [windowed.step_time_s(p) for p in shifted])
    pytest.importorskip("torch")
    from stallfree.engine.model import LlamaModel

    dense = {
        **MIXTRAL,
        "architectures": ["MistralForCausalLM"],
        "model_type": "mistral",
        "sliding_window": 64,
    }
    with pytest.raises(ValueError, match="the simulator prices but the engine does not run"):
        LlamaModel(ModelSpec.from_hf_config(dense, name="mistral-window"))


def test_explain_says_why_the_ridge_moved(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    config = tmp_path / "qwen3-30b-a3b" / "config.json"
    config.parent.mkdir()
    config.write_text(json.dumps(QWEN3_MOE))
    argv = ["explain", "--model", str(config), "--hardware", "h200-sxm", "--tp", "1", "--cost-model", "full"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "mixture of experts           8 of 128 experts a token (11% of the weights)" in out


@pytest.mark.skipif(
    importlib.util.find_spec("aiconfigurator_core") is None, reason="aiconfigurator-core not installed"
)
def test_the_configs_aiconfigurator_ships_read_or_refuse_in_one_line() -> None:
    from stallfree.costs.choice import resolve_model

    for model_id, total, active in (
        ("Qwen/Qwen3-30B-A3B", 30.5, 3.3),
        ("Qwen/Qwen3-235B-A22B", 235.1, 22.2),
        ("mistralai/Mixtral-8x7B-v0.1", 46.7, 12.9),
        ("Qwen/Qwen3-8B", 8.2, 8.2),
        ("meta-llama/Meta-Llama-3.1-70B", 70.6, 70.6),
    ):
        spec = resolve_model(model_id)
        assert spec.num_params / 1e9 == pytest.approx(total, abs=0.1), model_id
        assert spec.num_active_params / 1e9 == pytest.approx(active, abs=0.1), model_id
    short = pick_cost_model(CostChoice(model="qwen3-30b-a3b", hardware="h200-sxm", framework="sglang"))
    assert short.model.is_moe and short.source == "aiconfigurator" and short.model.name == "qwen3-30b-a3b"
    for model_id in (
        "deepseek-ai/DeepSeek-V3.2",  # sparse attention
        "google/gemma-4-26B-A4B",
        "nvidia/Nemotron-H-56B-Base-8K",  # hybrid Mamba
    ):
        with pytest.raises(ValueError) as refused:
            resolve_model(model_id)
        assert "\n" not in str(refused.value)


@pytest.mark.skipif(
    importlib.util.find_spec("aiconfigurator_core") is None, reason="aiconfigurator-core not installed"
)
@pytest.mark.parametrize(
    ("model_id", "total", "active", "layout"),
    [
        # published: 671B total, 37B active; MLA caches 576 values a token and layer
        ("deepseek-ai/DeepSeek-V3", 671.0, 37.6, {"moe_dense_layers": 3, "kv_lora_rank": 512}),
        ("deepseek-ai/DeepSeek-R1", 671.0, 37.6, {"moe_shared_intermediate_size": 2048}),
        ("moonshotai/Kimi-K2-Instruct", 1026.4, 32.9, {"moe_dense_layers": 1}),  # "1T, 32B active"
        # published 116.8B / 5.1B active less embeddings (0.58B here): half the layers a 128-token window
        ("openai/gpt-oss-120b", 116.8, 5.7, {"sliding_window": 128, "num_sliding_layers": 18}),
        ("openai/gpt-oss-20b", 20.9, 4.2, {"num_sliding_layers": 12}),
        # 17B active; chunked local attention (8K) on 3 layers of 4; Maverick alternates dense layers
        ("meta-llama/Llama-4-Scout-17B-16E-Instruct", 107.8, 17.2, {"num_sliding_layers": 36}),
        ("meta-llama/Llama-4-Maverick-17B-128E-Instruct", 400.7, 17.2, {"moe_dense_layers": 24}),
    ],
)
def test_2026_architectures_read_as_published(
    model_id: str, total: float, active: float, layout: dict[str, int]
) -> None:
    from stallfree.costs.choice import resolve_model

    spec = resolve_model(model_id)
    assert spec.num_params / 1e9 == pytest.approx(total, abs=0.1)
    assert spec.num_active_params / 1e9 == pytest.approx(active, abs=0.1)
    assert {key: getattr(spec, key) for key in layout} == layout
    assert ModelSpec.from_hf_config(spec.to_hf_config(), name=spec.name) == spec
    if spec.is_mla:
        assert spec.kv_bytes_per_token(2) == 61 * 576 * 2
        assert spec.kv_bytes_per_token_on(8, 2) == 8 * spec.kv_bytes_per_token(2)  # a whole latent a GPU


@pytest.mark.skipif(
    importlib.util.find_spec("aiconfigurator_core") is None, reason="aiconfigurator-core not installed"
)
def test_quantized_checkpoints_are_sized_as_servers_load_them() -> None:
    from stallfree.costs.choice import resolve_model

    # DeepSeek-V3's fp8 decoder (its embedding and LM head bf16): ~673 GB, not 1.34 TB;
    # gpt-oss-120b's MXFP4 experts (4.25 bits a weight, the rest bf16): ~65 GB, as its checkpoint
    deepseek, gpt_oss = resolve_model("deepseek-ai/DeepSeek-V3"), resolve_model("openai/gpt-oss-120b")
    assert deepseek.weight_bytes(2) / 1e9 == pytest.approx(672.9, abs=0.5)
    assert gpt_oss.weight_bytes(2) / 1e9 == pytest.approx(65.2, abs=0.5)
    # --dtype fp8 does not size an MXFP4 expert up, and an unquantised model is dtype x params
    assert gpt_oss.decoder_bytes_per_param(1) == (4.25 / 8, 1)
    llama = resolve_model("meta-llama/Meta-Llama-3.1-8B")
    assert llama.weight_bytes(2) == 2 * llama.num_params
