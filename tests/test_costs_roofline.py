"""Roofline cost model: hand-worked arithmetic, the seed explainer's figures, the vectorised path."""

from __future__ import annotations

import pytest

from stallfree.core.plan import ScheduledChunk, StepPlan
from stallfree.costs import CostModel, CostModelConfig
from stallfree.specs import HardwareSpec, ModelSpec, load_hardware_spec, load_model_spec

# The tiny model of test_specs: 74,048 non-embedding params, 6,400-param LM head, 86,848 in all,
# 4 heads x 16 dims in 2 layers, 256 B of bf16 KV per token.
TINY = ModelSpec(
    name="tiny",
    hidden_size=64,
    num_layers=2,
    num_attention_heads=4,
    num_kv_heads=2,
    head_dim=16,
    intermediate_size=128,
    vocab_size=100,
    max_position_embeddings=256,
)
# Round numbers so the arithmetic can be done by hand.
TOY_GPU = HardwareSpec(
    name="toy",
    peak_flops_per_s=1e12,
    mem_bandwidth_bytes_per_s=1e9,
    mem_capacity_bytes=1e6,
    interconnect_bandwidth_bytes_per_s=1e9,
    interconnect_latency_s=1e-6,
)


def chunk(request_id: str, before: int, num_tokens: int, *, samples: bool = True) -> ScheduledChunk:
    known = before + num_tokens + (0 if samples else 1)
    return ScheduledChunk(request_id, before, num_tokens, known)


def decodes(num_seqs: int, context_len: int) -> tuple[ScheduledChunk, ...]:
    return tuple(chunk(f"d{i}", context_len, 1) for i in range(num_seqs))


def test_seed_kind_by_hand() -> None:
    """Seed arithmetic on the tiny model, 10 tokens, bf16, one GPU.

    FLOPs = 2 x 86,848 x 10 = 1,736,960 -> 1.73696e-6 s at 1e12 FLOP/s.
    bytes = 86,848 x 2 = 173,696 -> 1.73696e-4 s at 1e9 B/s: memory-bound, plus 1 ms overhead.
    Context, sampling and attention do not matter.
    """
    model = CostModel(CostModelConfig(TINY, TOY_GPU, overhead_s=1e-3))
    cost = model.step_cost(StepPlan((chunk("a", 100, 6, samples=False), chunk("b", 7, 4))))
    assert cost.flops == 1_736_960
    assert cost.bytes_moved == 173_696
    assert cost.compute_s == pytest.approx(1.73696e-6)
    assert cost.memory_s == pytest.approx(1.73696e-4)
    assert cost.comm_s == 0
    assert cost.duration_s == pytest.approx(1.73696e-4 + 1e-3)
    assert model.step_time_s(StepPlan((chunk("x", 0, 10),))) == cost.duration_s


def test_full_kind_attention_and_kv_by_hand() -> None:
    """One chunk of 4 tokens after 10 cached ones, which samples.

    query-key pairs: 4 x 10 earlier + (1 + 2 + 3 + 4) causal = 50.
    attention FLOPs: 4 x 4 heads x 16 dims x 2 layers x 50 = 25,600.
    linear FLOPs: 2 x 74,048 x 4 = 592,384; LM head 2 x 6,400 = 12,800; total 630,784.
    bytes: weights 74,048 x 2 = 148,096 + LM head 12,800 + KV 256 x (10 read + 4 written) = 164,480.
    """
    model = CostModel(CostModelConfig(TINY, TOY_GPU, kind="full"))
    cost = model.step_cost(StepPlan((chunk("a", 10, 4),)))
    assert cost.flops == 630_784
    assert cost.bytes_moved == 164_480
    assert cost.compute_s == pytest.approx(6.30784e-7)
    assert cost.memory_s == pytest.approx(1.6448e-4)
    assert cost.duration_s == pytest.approx(1.6448e-4)


def test_full_kind_lm_head_only_for_sampling_chunks() -> None:
    """The same chunk mid-prompt (no logit): 12,800 fewer FLOPs and 12,800 fewer bytes."""
    model = CostModel(CostModelConfig(TINY, TOY_GPU, kind="full"))
    sampling = model.step_cost(StepPlan((chunk("a", 10, 4),)))
    mid_prompt = model.step_cost(StepPlan((chunk("a", 10, 4, samples=False),)))
    assert sampling.flops - mid_prompt.flops == 12_800
    assert sampling.bytes_moved - mid_prompt.bytes_moved == 12_800


def test_full_kind_tensor_parallel_comm_by_hand() -> None:
    """TP 2 on the chunk above: compute and memory halve; two ring all-reduces per layer.

    each all-reduce: 4 tokens x 64 x 2 B = 512 B; ring factor 2 x (2 - 1) / 2 = 1
    -> 512 / 1e9 = 5.12e-7 s + 1e-6 s latency = 1.512e-6 s; x 2 per layer x 2 layers = 6.048e-6 s.
    memory: 164,480 B / (2 x 1e9 B/s) = 8.224e-5 s.
    """
    model = CostModel(CostModelConfig(TINY, TOY_GPU, tp=2, kind="full"))
    cost = model.step_cost(StepPlan((chunk("a", 10, 4),)))
    assert cost.bytes_moved == 164_480
    assert cost.memory_s == pytest.approx(8.224e-5)
    assert cost.comm_s == pytest.approx(6.048e-6)
    assert cost.duration_s == pytest.approx(8.224e-5 + 6.048e-6)


def test_kv_heads_replicate_when_fewer_than_tp() -> None:
    """TP 4 with 2 KV heads: each KV head lives on 2 GPUs, so KV traffic doubles: 3,584 -> 7,168 B."""
    tp2 = CostModel(CostModelConfig(TINY, TOY_GPU, tp=2, kind="full")).step_cost(
        StepPlan((chunk("a", 10, 4),))
    )
    tp4 = CostModel(CostModelConfig(TINY, TOY_GPU, tp=4, kind="full")).step_cost(
        StepPlan((chunk("a", 10, 4),))
    )
    assert tp4.bytes_moved - tp2.bytes_moved == 3_584


def test_later_chunks_of_a_long_prompt_cost_more_in_full_kind() -> None:
    llama = load_model_spec("llama-3-70b")
    a100 = load_hardware_spec("a100-40gb")
    full = CostModel(CostModelConfig(llama, a100, tp=4, kind="full"))
    seed = CostModel(CostModelConfig(llama, a100, tp=4, kind="weights-only"))
    first = StepPlan((chunk("p", 0, 256, samples=False),))
    last = StepPlan((chunk("p", 65536 - 256, 256),))
    assert seed.step_time_s(first) == seed.step_time_s(last)
    assert full.step_time_s(last) > 1.5 * full.step_time_s(first)


def test_empty_plan_costs_nothing() -> None:
    model = CostModel(CostModelConfig(TINY, TOY_GPU, kind="full", overhead_s=1.0))
    assert model.step_time_s(StepPlan(())) == 0.0
    assert model.step_cost(StepPlan(())).duration_s == 0.0


def test_helpers_match_plans() -> None:
    for kind in ("weights-only", "full"):
        model = CostModel(CostModelConfig(TINY, TOY_GPU, tp=2, kind=kind, overhead_s=1e-4))
        assert model.decode_step_s(5, 30) == model.step_time_s(StepPlan(decodes(5, 30)))
        assert model.prefill_time_s(50) == model.step_time_s(StepPlan((chunk("p", 0, 50),)))


@pytest.mark.parametrize("kind", ["weights-only", "full"])
@pytest.mark.parametrize("tp", [1, 2])
def test_decode_stretch_equals_step_time(kind: str, tp: int) -> None:
    """Step k of a steady decode run: 3 sequences at 10, 13, 17 cached tokens, + k each."""
    model = CostModel(CostModelConfig(TINY, TOY_GPU, tp=tp, kind=kind, overhead_s=2e-5))  # type: ignore[arg-type]
    first = StepPlan((chunk("a", 10, 1), chunk("b", 13, 1), chunk("c", 17, 1)))
    durations = model.steady_durations(first, 6)
    assert durations.shape == (6,)
    for k, duration in enumerate(durations):
        plan = StepPlan((chunk("a", 10 + k, 1), chunk("b", 13 + k, 1), chunk("c", 17 + k, 1)))
        assert duration == model.step_time_s(plan)
    assert model.steady_durations(first, 0).shape == (0,)


def test_ridge_by_hand() -> None:
    """Seed: weights read in 173,696 / 1e9 s; each token costs 2 x 86,848 / 1e12 s -> ridge 1,000 tokens."""
    model = CostModel(CostModelConfig(TINY, TOY_GPU))
    assert model.ridge_tokens() == pytest.approx(1000)
    at_ridge = model.step_cost(StepPlan((chunk("p", 0, 1000),)))
    assert at_ridge.compute_s == pytest.approx(at_ridge.memory_s)


def test_seed_is_an_alias_of_weights_only() -> None:
    config = CostModelConfig(TINY, TOY_GPU, kind="seed")  # type: ignore[arg-type]
    assert config.kind == "weights-only"
    plan = StepPlan((chunk("p", 0, 100),))
    assert CostModel(config).step_time_s(plan) == CostModel(CostModelConfig(TINY, TOY_GPU)).step_time_s(plan)


@pytest.mark.parametrize(
    ("tp", "model", "message"),
    [
        (3, TINY, "attention heads"),
        (0, TINY, "positive"),
        (2, ModelSpec("odd", 96, 1, 6, 3, 16, 64, 10, 64), "KV heads"),
    ],
)
def test_config_rejects_bad_tp(tp: int, model: ModelSpec, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        CostModelConfig(model, TOY_GPU, tp=tp)


def test_config_rejects_bad_values() -> None:
    with pytest.raises(ValueError, match="dtype_bytes"):
        CostModelConfig(TINY, TOY_GPU, dtype_bytes=3)
    with pytest.raises(ValueError, match="kind"):
        CostModelConfig(TINY, TOY_GPU, kind="exact")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="overhead_s"):
        CostModelConfig(TINY, TOY_GPU, overhead_s=-1.0)


# -- the seed explainer: Llama-3-70B on 4 x A100-40GB, bf16, weights-only roofline ------------


@pytest.fixture(scope="module")
def seed_model() -> CostModel:
    return CostModel(CostModelConfig(load_model_spec("llama-3-70b"), load_hardware_spec("a100-40gb"), tp=4))


def test_seed_decode_step(seed_model: CostModel) -> None:
    """Reading 141.1 GB of weights at 4 x 1.555 TB/s: 141.1e9 / 6.22e12 = 22.7 ms ("about 23")."""
    assert seed_model.decode_step_s(16, 2048) == pytest.approx(0.023, rel=0.03)


def test_seed_prefill(seed_model: CostModel) -> None:
    """2 x 70.55e9 FLOPs per token at 4 x 312 TFLOP/s: 8,844 tokens/s ("about nine thousand").

    16,384 tokens -> 1.85 s (seed: 1.84 s); 65,536 -> 7.4 s (seed: "seven").
    """
    assert 16384 / seed_model.prefill_time_s(16384) == pytest.approx(9000, rel=0.03)
    assert seed_model.prefill_time_s(16384) == pytest.approx(1.84, rel=0.03)
    assert seed_model.prefill_time_s(65536) == pytest.approx(7.0, rel=0.07)


def test_seed_ridge(seed_model: CostModel) -> None:
    """peak / bandwidth = 312e12 / 1.555e12 = 200.6 tokens ("roughly two hundred")."""
    assert seed_model.ridge_tokens() == pytest.approx(200, rel=0.02)


def test_seed_chunked_step_and_prompt_delay(seed_model: CostModel) -> None:
    """272 tokens per step are compute-bound: 272 x 141.1e9 / 1.248e15 = 30.8 ms ("30 ms").

    The 16K prompt needs 64 such steps: 1.97 s against 1.85 s alone, 6% later ("six percent").
    """
    step = StepPlan((*decodes(16, 2048), chunk("p", 0, 256, samples=False)))
    step_s = seed_model.step_time_s(step)
    assert step_s == pytest.approx(0.030, rel=0.05)
    delay = 64 * step_s / seed_model.prefill_time_s(16384) - 1
    assert delay == pytest.approx(0.06, abs=0.01)
