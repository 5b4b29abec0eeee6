"""Step profiles and the measured cost model: the fit recovers known costs; the profile file
round-trips; steady runs equal step-by-step pricing bit for bit."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from stallfree.core import ScheduledChunk, StepPlan
from stallfree.costs.choice import CostChoice
from stallfree.costs.measured import (
    Curve,
    MeasuredCostModel,
    StepFeatures,
    _knots,
    fit_forward,
    nnls,
    plan_features,
)
from stallfree.specs.step_profile import (
    SamplingPoint,
    Stats,
    StepPoint,
    StepProfile,
    load_profile,
    profile_from_dict,
    profile_to_dict,
    save_profile,
)
from tests.factories import shifted_plans

MODEL = {
    "num_params": 1000,
    "num_non_embedding_params": 800,
    "lm_head_params": 200,
    "num_layers": 2,
    "hidden_size": 16,
    "num_attention_heads": 2,
    "num_kv_heads": 1,
    "head_dim": 8,
    "intermediate_size": 32,
    "vocab_size": 64,
    "max_position_embeddings": 4096,
    "weight_bytes": 2000,
    "kv_bytes_per_token": 64,
}


def true_time(f: StepFeatures) -> float:
    """A machine with a soft knee: tokens cost 5 us each up to 32 a step, 40 us each after."""
    tokens = 5e-6 * min(f.num_tokens - 1, 31) + 4e-5 * max(0, f.num_tokens - 32)
    lm_head = (3e-4 if f.num_samples else 0.0) + 2e-5 * max(0, f.num_samples - 1)
    return (
        2e-3
        + tokens
        + lm_head
        + 1e-5 * f.num_decodes
        + 2e-7 * f.kv_tokens
        + 1e-4 * f.num_chunks
        + 3e-9 * f.pairs
        + 5e-7 * f.gather_tokens
    )


def synthetic_profile() -> StepProfile:
    points = []
    for ctx in (16, 256, 1024):
        for n in (1, 2, 4, 8, 16, 32, 64):
            points.append(("decode", (ctx,) * n, ()))
    for before in (0, 512, 1536):
        for tokens in (8, 16, 32, 64, 128, 256, 512):
            points.append(("prefill", (), ((tokens, before, False),)))
    for n in (1, 4, 16):
        for before in (0, 512):
            for tokens in (16, 48, 128, 256):
                points.append(("mixed", (300,) * n, ((tokens, before, tokens % 32 == 0),)))
    steps = []
    for kind, decodes, chunks in points:
        f = plan_features([(1, c, True) for c in decodes] + list(chunks))
        steps.append(StepPoint(kind, decodes, chunks, Stats((true_time(f),) * 3)))
    sampling = [
        SamplingPoint(mode, rows, Stats(((1e-5 + per_row * rows),) * 3))
        for mode, per_row in (("greedy", 1e-6), ("temperature", 5e-4), ("top-p", 1e-3))
        for rows in (1, 4, 16)
    ]
    return StepProfile(
        fingerprint={"model": "synthetic", "dtype_bytes": 2},
        model=MODEL,
        settings={},
        steps=tuple(steps),
        sampling=tuple(sampling),
    )


def test_nnls_matches_the_unconstrained_solution_when_it_is_positive_and_clips_otherwise() -> None:
    rng = np.random.default_rng(0)
    a = rng.random((40, 5))
    x = np.array([1.0, 2.0, 0.5, 3.0, 0.1])
    assert np.allclose(nnls(a, a @ x), x)
    clipped = nnls(a, a @ np.array([1.0, -2.0, 0.5, 3.0, 0.1]))
    assert (clipped >= 0).all() and clipped[1] == 0


def test_the_fit_recovers_a_known_machine() -> None:
    model = MeasuredCostModel(synthetic_profile())
    assert np.abs(model.fit_errors()).max() < 1e-6
    fw = model.forward
    assert fw.fixed_s == pytest.approx(2e-3, rel=1e-4)
    assert fw.per_kv_token_s == pytest.approx(2e-7, rel=1e-4)
    assert fw.per_pair_s == pytest.approx(3e-9, rel=1e-4)
    assert fw.per_gather_token_s == pytest.approx(5e-7, rel=1e-4)
    # The knee: 5 us a token below 32 tokens a step, 40 us above.
    assert fw.token_curve(32) - fw.token_curve(16) == pytest.approx(16 * 5e-6, rel=1e-3)
    assert fw.token_curve(512) - fw.token_curve(256) == pytest.approx(256 * 4e-5, rel=1e-3)
    assert model.sampling["temperature"].per_row_s == pytest.approx(5e-4, rel=1e-6)
    # A plan the profile never saw: 10 decodes at 700 tokens + a 37-token middle chunk at 200.
    chunks = [(1, 700, True)] * 10 + [(37, 200, False)]
    decodes = [ScheduledChunk(f"d{i}", 700, 1, 701) for i in range(10)]
    plan = StepPlan((*decodes, ScheduledChunk("p", 200, 37, 300)))
    expected = true_time(plan_features(chunks)) + 1e-5 + 1e-6 * 10  # + greedy sampling of 10 rows
    assert model.step_time_s(plan) == pytest.approx(expected, rel=1e-4)
    params = model.parameters()
    assert params["kv_read_bytes_per_s"] == pytest.approx(64 / 2e-7, rel=1e-3)
    assert params["fit_median_abs_error"] < 1e-6


def test_a_first_step_after_a_cache_hit_costs_its_measured_extra_and_nothing_else_moves() -> None:
    """A server's ``cached`` points (a prompt sent again with more tokens) took 0.3 s longer than
    the other points say, in two of three repeats: their mean extra is a term of its own, and the
    other terms are fitted as if the points were not there."""
    base = synthetic_profile()
    cached = []
    for tokens, before in ((40, 496), (130, 496), (36, 1008)):
        f = plan_features([(tokens, before, True)])
        t = true_time(f)
        cached.append(StepPoint("cached", (), ((tokens, before, True),), Stats((t + 0.3, t, t + 0.3))))
    with_hits = MeasuredCostModel(dataclasses.replace(base, steps=(*base.steps, *cached)))
    without = MeasuredCostModel(base)
    assert with_hits.forward.per_cache_hit_s == pytest.approx(0.2, rel=1e-3)
    assert dataclasses.replace(with_hits.forward, per_cache_hit_s=0.0) == without.forward
    first = ScheduledChunk("b", 496, 40, 536, after_cache_hit=True)
    decodes = tuple(ScheduledChunk(f"d{i}", 300, 1, 301) for i in range(4))
    plan = StepPlan((*decodes, first))
    later = StepPlan((*decodes, ScheduledChunk("b", 496, 40, 536)))
    assert with_hits.step_time_s(plan) - with_hits.step_time_s(later) == pytest.approx(0.2, rel=1e-6)
    assert with_hits.step_time_s(later) == without.step_time_s(later)
    # a steady run pays it on its first step only, bit for bit as each step priced alone
    runs = with_hits.steady_durations(plan, 5)
    assert list(runs) == [with_hits.step_time_s(p) for p in shifted_plans(plan, 5)]
    assert runs[0] - runs[1] > 0.19


def test_a_sampling_mode_prices_every_sampled_row() -> None:
    profile = synthetic_profile()
    greedy, top_p = MeasuredCostModel(profile), MeasuredCostModel(profile, sampling="top-p")
    plan = StepPlan(tuple(ScheduledChunk(f"d{i}", 100, 1, 101) for i in range(8)))
    assert top_p.step_time_s(plan) - greedy.step_time_s(plan) == pytest.approx(8 * (1e-3 - 1e-6), rel=1e-6)
    with pytest.raises(ValueError, match="sampling"):
        MeasuredCostModel(profile, sampling="beam")


def test_steady_durations_equal_step_time_of_each_shifted_plan_exactly() -> None:
    model = MeasuredCostModel(synthetic_profile())
    plan = StepPlan(
        (
            ScheduledChunk("a", 40, 1, 41),
            ScheduledChunk("b", 0, 1, 1),
            ScheduledChunk("c", 0, 30, 200),
            ScheduledChunk("d", 64, 17, 500),
        )
    )
    durations = model.steady_durations(plan, 6)
    for j in range(6):
        shifted = StepPlan(
            tuple(
                ScheduledChunk(
                    c.request_id,
                    c.num_computed_tokens + j * c.num_tokens,
                    c.num_tokens,
                    c.num_known_tokens + (j if c.num_tokens == 1 else 0),
                )
                for c in plan.chunks
            )
        )
        assert durations[j] == model.step_time_s(shifted)
    assert (np.diff(durations) >= 0).all()
    assert model.steady_durations(StepPlan(()), 3).tolist() == [0.0, 0.0, 0.0]


def test_curve_is_zero_at_its_first_knot_and_extrapolates_its_last_slope() -> None:
    curve = Curve((1, 2, 4), (1.0, 0.5))
    assert [curve(x) for x in (1, 2, 3, 4, 8)] == [0.0, 1.0, 1.5, 2.0, 4.0]
    assert sum(s * b for s, b in zip(curve.slopes, curve.basis(8), strict=True)) == curve(8)


def test_knots_sit_at_measured_values_apart_and_the_largest_ends_the_last_segment() -> None:
    assert _knots(1, [16, 64, 256, 1024]) == (1, 16, 64, 256, 1024)
    assert _knots(1, [16, 20, 64]) == (1, 16, 64)  # 20 is within 1.5 x of 16
    # a server profiled at a 512-token budget: 463 and 496 tokens make one segment, not a sliver
    # whose slope would come from two points' noise and price every step past them
    assert _knots(1, [15, 59, 102, 229, 463, 496]) == (1, 15, 59, 102, 229, 496)
    assert _knots(1, [15, 700]) == (1, 15, 700)
    assert _knots(1, [1, 1]) == (1, 2) and _knots(0, [0, 1, 2]) == (0, 1, 2)


def test_a_fit_needs_points() -> None:
    with pytest.raises(ValueError, match="at least 3"):
        fit_forward([])


def test_profile_round_trips_and_rejects_other_files(tmp_path: Path) -> None:
    profile = synthetic_profile()
    path = save_profile(profile, tmp_path / "p.json")
    again = load_profile(path)
    assert profile_to_dict(again) == profile_to_dict(profile)
    data = json.loads(path.read_text())
    assert data["schema"] == "stallfree-step-profile" and data["version"] == 1
    assert data["steps"][0]["median_s"] == data["steps"][0]["times_s"][0]
    with pytest.raises(ValueError, match="not a step profile"):
        profile_from_dict({"schema": "other"})
    data["version"] = 99
    with pytest.raises(ValueError, match="version"):
        profile_from_dict(data)


def test_explain_prices_the_scenario_with_the_measured_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from stallfree.cli import main

    path = save_profile(synthetic_profile(), tmp_path / "p.json")
    args = ["explain", "--profile", str(path), "--prompt-tokens", "512", "--context-tokens", "100"]
    assert main([*args, "--streams", "4", "--chunk-tokens", "64", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    model = MeasuredCostModel(synthetic_profile())
    assert body["decode_step_s"] == pytest.approx(model.decode_step_s(4, 100), rel=0.05)
    assert body["policies"]["prefill-first"]["max_gap_s"] > body["policies"]["chunked"]["max_gap_s"]


def test_simulate_with_the_measured_model_fast_path_equals_step_by_step() -> None:
    from stallfree.core.serving import ServingConfig
    from stallfree.sim import Deployment, simulate
    from stallfree.workload import UniformLengths, Workload, poisson

    workload = Workload(poisson(8.0), UniformLengths(20, 300, 2, 40))
    model = MeasuredCostModel(synthetic_profile())
    for policy in ("chunked", "prefill-first"):
        serving = ServingConfig(policy=policy, max_num_batched_tokens=64, max_num_seqs=16, num_blocks=300)
        runs = [
            simulate(
                workload,
                Deployment(costs=CostChoice(kind="full", model="llama-3-8b", profile=model), serving=serving),
                num_requests=80,
                fast=fast,
            )
            for fast in (True, False)
        ]
        assert runs[0].records == runs[1].records
        assert runs[0].summary["num_steps"] == runs[1].summary["num_steps"] > 80


def noisy_profile(spread: float) -> StepProfile:
    """synthetic_profile with each point's three repeats at (1 - spread, 1, 1 + spread) x its time,
    and a decode reference step that ran at 0.5x, 1x and 1.5x of its median speed."""
    base = synthetic_profile()
    steps = tuple(
        StepPoint(
            p.kind,
            p.decode_contexts,
            p.chunks,
            Stats(tuple(p.stats.median_s * k for k in (1 - spread, 1, 1 + spread))),
        )
        for p in base.steps
    )
    return StepProfile(
        base.fingerprint, base.model, {"reference_step_s": [0.01, 0.02, 0.03]}, steps, base.sampling
    )


def test_step_noise_is_the_profiles_repeats_times_its_reference_drift() -> None:
    factors = MeasuredCostModel(noisy_profile(0.1)).step_noise()
    assert sorted(set(np.round(factors, 9))) == sorted(
        {round(a * b, 9) for a in (0.9, 1, 1.1) for b in (0.5, 1, 1.5)}
    )
    assert np.median(factors) == pytest.approx(1.0)
    # identical repeats and no reference step: no noise
    assert set(MeasuredCostModel(synthetic_profile()).step_noise().tolist()) == {1.0}


def test_varied_steps_scale_by_kind_and_draw_each_step_a_factor_seeded() -> None:
    from stallfree.costs.measured import VariedSteps

    model = MeasuredCostModel(synthetic_profile())
    plan = StepPlan(tuple(ScheduledChunk(f"d{i}", 100, 1, 101) for i in range(4)))
    mixed = StepPlan((*plan.chunks, ScheduledChunk("p", 0, 64, 65)))
    noisy = VariedSteps(model, noise=np.array([0.5, 2.0]), seed=3)
    base = model.steady_durations(plan, 200)
    ratios = noisy.steady_durations(plan, 200) / base
    assert set(np.round(ratios, 12)) == {0.5, 2.0}
    assert noisy.step_time_s(plan) / model.step_time_s(plan) in (pytest.approx(0.5), pytest.approx(2.0))
    again = VariedSteps(model, noise=np.array([0.5, 2.0]), seed=3).steady_durations(plan, 200)
    assert np.array_equal(again / base, ratios)
    # a run's own speed: decode-only steps x2, steps with prompt tokens x3
    scaled = VariedSteps(model, decode=2.0, prompt=3.0)
    assert scaled.step_time_s(plan) == pytest.approx(2 * model.step_time_s(plan))
    assert scaled.step_time_s(mixed) == pytest.approx(3 * model.step_time_s(mixed))
    assert np.allclose(scaled.steady_durations(mixed, 5), 3 * model.steady_durations(mixed, 5))
    with pytest.raises(ValueError, match="positive"):
        VariedSteps(model, noise=np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match="positive"):
        VariedSteps(model, decode=0.0)


def test_simulate_with_step_noise_widens_the_itl_tail_not_its_median() -> None:
    from stallfree.core.serving import ServingConfig
    from stallfree.sim import Deployment, simulate
    from stallfree.workload import FixedLengths, Workload, poisson

    workload = Workload(poisson(4.0), FixedLengths(200, 40))
    serving = ServingConfig(policy="chunked", max_num_batched_tokens=64, max_num_seqs=16, num_blocks=2000)
    model = MeasuredCostModel(noisy_profile(0.3))
    runs = [
        simulate(
            workload,
            Deployment(costs=CostChoice(kind="full", model="llama-3-8b", profile=model), serving=serving),
            num_requests=150,
            step_noise=noise,
        )
        for noise in (False, True)
    ]
    steady, noisy = (r.summary for r in runs)
    assert noisy["p99_itl_ms"] > 1.15 * steady["p99_itl_ms"]  # factors up to 1.95x
    assert noisy["median_itl_ms"] == pytest.approx(steady["median_itl_ms"], rel=0.25)
    with pytest.raises(ValueError, match="need a profile"):
        simulate(
            workload,
            Deployment(costs=CostChoice(kind="full", model="llama-3-8b"), serving=serving),
            num_requests=5,
            step_noise=True,
        )


def decode_only_points() -> list[tuple[StepFeatures, float]]:
    """Decode batches alone: a fixed cost and a per-row cost that grow together (10 ms + 1 ms a row),
    so the points cannot tell the fixed cost from the per-row and per-token terms."""
    return [
        (plan_features([(1, ctx, True)] * n), 1e-2 + 1e-3 * n)
        for n in (1, 2, 4, 8, 16, 32)
        for ctx in (16, 256)
    ]


def test_floors_keep_terms_the_points_cannot_separate_from_falling_to_zero() -> None:
    free = fit_forward(decode_only_points())
    floored = fit_forward(decode_only_points(), fixed_floor_s=8e-3, lm_head_floor_s=1e-3)
    assert floored.fixed_s >= 8e-3 and floored.sample_curve.slopes[0] >= 1e-3
    for fit in (free, floored):  # the decode batches are priced as well either way
        assert all(fit(f) == pytest.approx(t, rel=1e-6) for f, t in decode_only_points())
    # ... but the free fit hands the LM head's cost to the per-row term (every decode row samples):
    # a prompt chunk that samples would be priced as if the LM head cost nothing
    assert free.sample_curve.slopes[0] == 0
    last_chunk, middle_chunk = plan_features([(16, 0, True)]), plan_features([(16, 0, False)])
    assert floored(last_chunk) - floored(middle_chunk) >= 1e-3


def test_the_floors_come_from_the_linear_layers_and_the_smallest_step() -> None:
    from stallfree.costs.measured import BLACK_BOX_FIXED_SHARE, FLOOR_SHARE, LM_HEAD_STREAM_SHARE, fit_floors
    from stallfree.specs.step_profile import LinearPoint

    profile = synthetic_profile()
    assert fit_floors(profile) == (0.0, 0.0)  # no linear points: nothing measured to bound by
    with_linear = dataclasses.replace(profile, linear=(LinearPoint(1, Stats((1e-3,) * 3)),))
    fixed, lm_head = fit_floors(with_linear)
    assert fixed == pytest.approx(FLOOR_SHARE * 1e-3)  # below the smallest step (2.3 ms)
    # the LM head's 200 parameters streamed at the 800 layer parameters' 1 ms rate, up to 2x faster
    assert lm_head == pytest.approx(LM_HEAD_STREAM_SHARE * 1e-3 * 200 / 800)
    model = MeasuredCostModel(with_linear)
    assert model.forward.fixed_s >= fixed and model.forward.sample_curve.slopes[0] >= lm_head
    assert model.fit_problems() == []
    # a server's black-box profile has no linear points: its smallest step bounds the fixed cost
    server = dataclasses.replace(profile, fingerprint={**profile.fingerprint, "kind": "server"})
    smallest = min(p.stats.median_s for p in profile.steps)
    assert fit_floors(server) == (pytest.approx(BLACK_BOX_FIXED_SHARE * smallest), 0.0)
    assert MeasuredCostModel(server).forward.fixed_s >= BLACK_BOX_FIXED_SHARE * smallest


def test_a_fit_that_misses_its_points_is_refused_and_a_refused_profile_never_loads() -> None:
    profile = synthetic_profile()
    rng = np.random.default_rng(0)
    noisy = tuple(
        dataclasses.replace(p, stats=Stats((p.stats.median_s * float(rng.choice([0.3, 3.0])),) * 3))
        for p in profile.steps
    )
    problems = MeasuredCostModel(dataclasses.replace(profile, steps=noisy)).fit_problems()
    assert any("misses its own step points" in p for p in problems)
    rejected = dataclasses.replace(profile, settings={"rejected": problems})
    with pytest.raises(ValueError, match="rejected when it was measured"):
        MeasuredCostModel(rejected)


def test_explain_says_when_a_prompt_is_priced_beyond_the_profiles_steps(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from stallfree.cli import main

    path = save_profile(synthetic_profile(), tmp_path / "p.json")  # steps of at most 512 prompt tokens
    args = ["explain", "--profile", str(path), "--streams", "4", "--context-tokens", "100", "--json"]
    assert main([*args, "--prompt-tokens", "512", "--sweep", "64"]) == 0
    assert not json.loads(capsys.readouterr().out)["warnings"]
    assert main([*args, "--prompt-tokens", "4096", "--sweep", "64"]) == 0
    (warning,) = json.loads(capsys.readouterr().out)["warnings"]
    assert "at most 512 prompt tokens" in warning and "4,096-token step is priced beyond them" in warning


def test_explain_says_when_later_chunks_are_priced_without_a_chunk_after_context(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from stallfree.cli import main

    profile = synthetic_profile()
    whole = [p for p in profile.steps if all(before == 0 for _, before, _ in p.chunks)]
    assert len(whole) < len(profile.steps)  # the engine's profile times chunks after context
    args = ["explain", "--streams", "4", "--context-tokens", "100", "--prompt-tokens", "512", "--json"]
    for steps, warned in ((profile.steps, False), (tuple(whole), True)):
        path = save_profile(dataclasses.replace(profile, steps=steps), tmp_path / f"{warned}.json")
        assert main([*args, "--profile", str(path), "--chunk-tokens", "128", "--sweep", "128"]) == 0
        warnings = json.loads(capsys.readouterr().out)["warnings"]
        assert any("no chunk after earlier context" in w for w in warnings) == warned
        assert main([*args, "--profile", str(path), "--chunk-tokens", "512", "--sweep", "512"]) == 0
        assert not json.loads(capsys.readouterr().out)["warnings"]  # one chunk: nothing after context


def test_specs_names_the_terms_the_points_never_showed_apart() -> None:
    from stallfree.costs.measured_report import format_parameters as profile_figures_text

    params = MeasuredCostModel(synthetic_profile()).parameters()
    assert "no cost beyond the other terms" not in profile_figures_text(params)  # every term > 0
    params["per_decode_s"] = 0.0
    params["lm_head_per_row_s_by_segment"][1] = 0.0
    lo, hi = params["lm_head_knots"][1:3]
    line = profile_figures_text(params).splitlines()[-1]
    assert line == f"  no cost beyond the other terms (0 above): per decode row, LM head rows {lo}-{hi}"


def test_a_verifying_chunk_is_priced_as_its_server_runs_it() -> None:
    """stallfree's engine: a decode row a draft position, each with its logits; a server such as
    vLLM: one sequence reading its KV once, one request's sampling; its draft tokens through the
    linear layers either way."""
    engine = MeasuredCostModel(synthetic_profile())
    profile = synthetic_profile()
    vllm = MeasuredCostModel(
        dataclasses.replace(profile, fingerprint={**profile.fingerprint, "server": "vllm"})
    )
    verify = StepPlan((ScheduledChunk("v", 300, 5, 301, num_draft_tokens=4),))
    rows = StepPlan(tuple(ScheduledChunk(f"r{i}", 300 + i, 1, 301 + i) for i in range(5)))
    assert engine.drafts_as_rows and not vllm.drafts_as_rows
    assert engine.step_time_s(verify) == pytest.approx(engine.step_time_s(rows), rel=1e-12)
    # four more tokens through the linear layers and four more KV tokens read, one decode, one sample
    assert plan_features(verify.chunks, drafts_as_rows=False) == StepFeatures(5, 1, 1, 0, 305, 0, 0)
    assert vllm.step_time_s(verify) < engine.step_time_s(verify)
