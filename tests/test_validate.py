"""``stallfree validate``: one small workload through the real engine (random:tiny) and the
measured simulator; per-step errors come from the engine's real steps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from stallfree.cli import main
from stallfree.costs.choice import CostChoice
from stallfree.costs.measured import plan_features
from stallfree.engine.random_models import random_spec
from stallfree.specs.step_profile import (
    SamplingPoint,
    Stats,
    StepPoint,
    StepProfile,
    model_dims,
    save_profile,
)
from stallfree.workload.bench_result import load_bench_result


def tiny_profile(path: Path, settings: dict[str, object] | None = None) -> Path:
    """A synthetic profile of random:tiny (costs made up, the model real): no measuring needed."""
    spec = random_spec("tiny")
    points = []
    for n in (1, 2, 4, 8):
        points.append(((64,) * n, ()))
    for tokens in (8, 32, 64):
        points += [
            ((), ((tokens, 0, False),)),
            ((), ((tokens, 32, True),)),
            ((16,) * 2, ((tokens, 16, False),)),
        ]
    steps = []
    for decodes, chunks in points:
        f = plan_features([(1, c, True) for c in decodes] + list(chunks))
        seconds = 1e-3 + 2e-5 * f.num_tokens + 1e-4 * f.num_samples + 1e-7 * f.kv_tokens + 1e-9 * f.pairs
        kind = "mixed" if decodes and chunks else "decode" if decodes else "prefill"
        steps.append(StepPoint(kind, decodes, chunks, Stats((seconds,))))
    profile = StepProfile(
        fingerprint={
            "model": "random:tiny",
            "model_name": spec.name,
            "dtype": "float32",
            "dtype_bytes": 4,
            "device": "cpu",
        },
        model=model_dims(spec, 4),
        settings=settings or {},
        steps=tuple(steps),
        sampling=(SamplingPoint("greedy", 1, Stats((1e-5,))), SamplingPoint("greedy", 8, Stats((2e-5,)))),
        model_config=spec.to_hf_config(),
    )
    return save_profile(profile, path)


def test_validate_runs_both_sides_on_the_same_requests(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = tiny_profile(tmp_path / "tiny.json")
    args = ["validate", "--profile", str(profile), "--qps", "20", "--lengths", "fixed:40,5"]
    args += ["--num-requests", "6", "--policy", "chunked,prefill-first", "--token-budget", "16"]
    assert main([*args, "--max-num-seqs", "4", "--json", "--plot", str(tmp_path / "plots")]) == 0
    body = json.loads(capsys.readouterr().out)
    for policy in ("chunked", "prefill-first"):
        result = body["policies"][policy]
        assert result["completed"] == {"measured": 6, "predicted": 6, "requests": 6}
        steps = result["per_step"]
        # chunked at 16 tokens a step: each 40-token prompt takes >= 3 steps, then 4 more decodes.
        assert steps["num_steps"] >= (7 if policy == "chunked" else 5)
        assert steps["median_abs_error"] >= 0 and steps["measured_step_s_total"] > 0
        ttft = result["metrics"]["median_ttft_ms"]
        assert ttft["measured"] > 0 and ttft["predicted"] > 0
        assert ttft["ratio"] == pytest.approx(ttft["predicted"] / ttft["measured"])
        delay = result["metrics"]["median_scheduling_delay_ms"]  # the engine's scheduler is in the process
        assert delay["measured"] >= 0 and delay["predicted"] >= 0
        # the simulation again with each kind of step at the speed this run's steps ran
        decode, prompt = result["run_step_scales"]
        assert decode == pytest.approx(1 / (1 + steps["decode_only"]["median_error"]))
        assert prompt == pytest.approx(1 / (1 + steps["with_prompt_tokens"]["median_error"]))
        assert ttft["at_run_speed"] > 0 and ttft["at_run_speed_ratio"] == pytest.approx(
            ttft["at_run_speed"] / ttft["measured"]
        )
    assert body["policies"]["chunked"]["max_num_seqs"] == 4
    assert set(body["ordering"]) >= {"median_ttft_ms", "p99_itl_ms"}
    assert all(Path(p).is_file() for p in body["outputs"])


def test_multi_turn_sessions_hit_the_same_blocks_in_the_engine_and_the_simulator(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Each turn repeats the conversation so far, the engine's own answers included: with sessions
    and turns far enough apart that each request is answered before the next arrives (a second
    apart, nearly regular: gamma shape 400), the engine's prefix cache (the core's block manager)
    hits exactly the tokens the simulator's does, on a busy machine too."""
    profile = tiny_profile(tmp_path / "tiny.json")
    args = ["validate", "--profile", str(profile), "--sessions", "3", "--turns", "3", "--qps", "1"]
    args += ["--burstiness", "400", "--system-prompt-tokens", "24", "--think-time-s", "3"]
    args += ["--lengths", "fixed:10,6"]
    assert main([*args, "--token-budget", "16", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["scenario"]["sessions"].startswith("3 sessions x 3 turns, system prompt 24 tokens")
    result = body["policies"]["chunked"]
    assert result["completed"] == {"measured": 9, "predicted": 9, "requests": 9}
    hits = result["metrics"]["prefix_cache_hit_rate"]
    # 16-token blocks: a session's first turn finds the system prompt's whole block (but the first
    # session's); a later turn the whole blocks of the conversation before its new message (the
    # answer's last token has no KV): 39 and 55 tokens; of 3 x (34 + 50 + 66) prompt tokens
    assert hits["measured"] == hits["predicted"] == pytest.approx((2 * 16 + 3 * (32 + 48)) / (3 * 150))
    assert main([*args, "--no-enable-prefix-caching"]) == 0
    assert "prefix cache hits" not in capsys.readouterr().out


def write_bench_result(path: Path) -> Path:
    data = {
        "duration": 3.0,
        "arrival_times": [0.5, 0.0, 1.0],
        "input_lens": [30, 20, 10],
        "output_lens": [3, 2, 4],
        "ttfts": [0.1, 0.2, 0.05],
        "itls": [[0.02, 0.03], [0.04], [0.01, 0.01, 0.02]],
    }
    path.write_text(json.dumps(data))
    return path


def test_a_bench_result_gives_back_its_requests_and_measurements(tmp_path: Path) -> None:
    result = load_bench_result(write_bench_result(tmp_path / "r.json"))
    assert result.arrays.arrival_time_s.tolist() == [0.0, 0.5, 1.0]
    assert result.arrays.num_prompt_tokens.tolist() == [20, 30, 10]
    assert result.arrays.max_tokens.tolist() == [2, 3, 4]
    first = result.records[1]
    assert first.first_token_s == pytest.approx(0.6) and first.finish_s == pytest.approx(0.65)
    assert result.itl.num_samples == 6
    assert {r.priority for r in result.arrays.iter_requests()} == {0}
    # a classes run's priorities come back with their requests, for --scheduling-policy priority
    path = write_bench_result(tmp_path / "p.json")
    path.write_text(json.dumps(json.loads(path.read_text()) | {"priorities": [10, 0, 5]}))
    assert [r.priority for r in load_bench_result(path).arrays.iter_requests()] == [0, 10, 5]
    (tmp_path / "old.json").write_text(json.dumps({"input_lens": [1], "output_lens": [1]}))
    with pytest.raises(ValueError, match="arrival_times"):
        load_bench_result(tmp_path / "old.json")
    # how its requests sampled: the server's default temperature is 1
    for sampling, mode in (
        ({"temperature": 0.0}, "greedy"),
        ({}, "temperature"),
        ({"temperature": 0.7, "top_p": 0.9}, "top-p"),
    ):
        path = write_bench_result(tmp_path / "s.json")
        path.write_text(json.dumps(json.loads(path.read_text()) | {"sampling": sampling}))
        assert load_bench_result(path).sampling_mode == mode


def test_validate_takes_a_bench_result_as_the_measured_side(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = tiny_profile(tmp_path / "tiny.json")
    bench = write_bench_result(tmp_path / "r.json")
    args = ["validate", "--profile", str(profile), "--measured", str(bench), "--num-blocks", "64"]
    assert main([*args, "--token-budget", "32", "--max-num-seqs", "8", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)["policies"]["chunked"]
    assert result["completed"] == {"measured": 3, "predicted": 3, "requests": 3}
    assert result["per_step"] is None and result["run_step_scales"] is None  # no step log: no run speed
    assert "at_run_speed" not in result["metrics"]["median_ttft_ms"]
    assert result["metrics"]["median_ttft_ms"]["measured"] == pytest.approx(100.0)
    # a client cannot see when the server first scheduled a request: predicted only
    delay = result["metrics"]["median_scheduling_delay_ms"]
    assert delay["measured"] is None and delay["predicted"] >= 0


def write_classes_result(path: Path) -> Path:
    """A classes run's result: three batch prompts at priority 10, then a chat at 0."""
    saved = {"priority": 0, "qps": 1.0, "slos_ms": {"ttft": 150.0}}
    data = {
        "duration": 2.0,
        "arrival_times": [0.0, 0.0, 0.0, 0.001],
        "input_lens": [40, 40, 40, 10],
        "output_lens": [4, 4, 4, 4],
        "ttfts": [0.1, 0.2, 0.3, 0.05],
        "itls": [[0.01, 0.01, 0.01], [0.02, 0.02, 0.02], [0.03, 0.03, 0.03], [0.04, 0.04, 0.04]],
        "priorities": [10, 10, 10, 0],
        "traffic_classes": ["batch", "batch", "batch", "chat"],
        "classes": {"chat": saved, "batch": saved | {"priority": 10, "slos_ms": {}}},
    }
    path.write_text(json.dumps(data))
    return path


def test_validate_scores_a_classes_run_per_class_on_both_sides(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A classes run (bench --scenario classes): three batch prompts at priority 10 and a chat at 0
    just after them, one sequence at a time. Each class is scored measured and predicted; the
    priorities ride with the requests, so under --scheduling-policy priority the chat is predicted
    to jump the two waiting batch prompts, and under fcfs to wait behind them."""
    profile = tiny_profile(tmp_path / "tiny.json")
    bench = write_classes_result(tmp_path / "classes.json")
    args = ["validate", "--profile", str(profile), "--measured", str(bench), "--num-blocks", "64"]
    args += ["--token-budget", "16", "--max-num-seqs", "1", "--json"]
    chat_ttft = {}
    for policy in ("fcfs", "priority"):
        assert main([*args, "--scheduling-policy", policy]) == 0
        classes = json.loads(capsys.readouterr().out)["policies"]["chunked"]["classes"]
        chat, batch = classes["by_class"]["chat"], classes["by_class"]["batch"]
        assert (chat["priority"], batch["priority"]) == (0, 10)
        assert chat["completed"] == {"measured": 1, "predicted": 1}
        assert batch["completed"] == {"measured": 3, "predicted": 3}
        ttft = batch["metrics"]["median_ttft_ms"]
        assert ttft["measured"] == pytest.approx(200.0)
        assert ttft["ratio"] == pytest.approx(ttft["predicted"] / ttft["measured"])
        assert chat["metrics"]["median_itl_ms"]["measured"] == pytest.approx(40.0)
        # goodput by each class's own SLOs: the chat's first token in 50 ms, within its 150
        assert chat["metrics"]["request_goodput"]["measured"] == pytest.approx(0.5)
        assert batch["metrics"]["request_goodput"]["measured"] is None  # no SLOs: no goodput
        assert classes["order_by_median_ttft"]["measured"] == ["chat", "batch"]
        chat_ttft[policy] = chat["metrics"]["median_ttft_ms"]["predicted"]
        order = classes["order_by_median_ttft"]["predicted"]
        assert order == (["chat", "batch"] if policy == "priority" else ["batch", "chat"])
    assert chat_ttft["priority"] < chat_ttft["fcfs"] / 2
    assert main([*args[:-1], "--scheduling-policy", "priority"]) == 0
    out = capsys.readouterr().out
    assert "classes by median TTFT: measured chat < batch, predicted chat < batch (same)" in out
    assert "priority scheduling" in out
    bench.write_text(json.dumps(json.loads(bench.read_text()) | {"traffic_classes": ["batch", "chat"]}))
    assert main(args) == 2
    assert "per-request arrays of different lengths" in capsys.readouterr().err
    bench = write_classes_result(tmp_path / "classes.json")
    bench.write_text(json.dumps(json.loads(bench.read_text()) | {"classes": {"chat": {"qps": 1.0}}}))
    assert main(args) == 2
    assert "a class without its priority, rate or SLOs" in capsys.readouterr().err


def test_simulate_replays_a_bench_result(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bench = write_bench_result(tmp_path / "r.json")
    assert main(["simulate", "--replay", str(bench), "--model", "llama-3-8b", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    summary = body["policies"]["chunked"]
    assert summary["completed"] == 3
    assert summary["total_input_tokens"] == 60 and summary["total_output_tokens"] == 9
    assert body["scenario"]["workload"] == f"replayed from {bench}"
    # a classes run's: scored per class too (and plotted per class)
    bench = write_classes_result(tmp_path / "classes.json")
    args = ["simulate", "--replay", str(bench), "--model", "llama-3-8b", "--scheduling-policy", "priority"]
    assert main([*args, "--json", "--plot", str(tmp_path / "plots")]) == 0
    classes = json.loads(capsys.readouterr().out)["policies"]["chunked"]["classes"]
    assert {name: c["completed"] for name, c in classes.items()} == {"chat": 1, "batch": 3}
    assert classes["chat"]["slos_ms"] == {"ttft": 150.0}


def test_validate_sizes_chunks_by_time_on_both_sides(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--step-budget-ms: the engine and the simulator both cut prompts by the profile's predicted
    step time (the tiny profile: 1 ms + 20 us a token, so a 1.6 ms target holds ~25 tokens), and the
    report counts the steps over the target on each side. The engine scales the profile by its own
    measured steps, so the prompt is long enough (400 tokens) to need cutting on a machine several
    times faster than this one (40 tokens fitted 1.6 ms on one, a scale of 0.7)."""
    profile = tiny_profile(tmp_path / "tiny.json")
    args = ["validate", "--profile", str(profile), "--qps", "20", "--lengths", "fixed:400,3"]
    args += ["--num-requests", "4", "--max-num-seqs", "4", "--json"]
    steps = {}
    for extra in ([], ["--step-budget-ms", "1.6"]):
        assert main([*args, *extra]) == 0
        body = json.loads(capsys.readouterr().out)
        steps[bool(extra)] = body["policies"]["chunked"]
    timed = steps[True]["time_budget"]
    assert steps[False]["time_budget"] is None
    assert timed["step_budget_ms"] == 1.6
    # a 400-token prompt no longer fits one step: more steps on both sides than with 512 tokens
    assert timed["num_steps"]["measured"] > steps[False]["per_step"]["num_steps"]
    assert timed["num_steps"]["predicted"] > steps[False]["per_step"]["num_steps"]
    assert timed["steps_over"]["predicted"] == 0
    assert timed["engine_predictor"]["final_scale"] > 0 and timed["engine_predictor"]["mean_abs_error"] >= 0
    assert 0 <= timed["steps_over"]["measured"] <= timed["num_steps"]["measured"]
    assert main([*args[:-1], "--step-budget-ms", "1.6"]) == 0
    out = capsys.readouterr().out
    assert "time budget 1.6 ms" in out and "steps over the 1.6 ms target: measured" in out


def test_validate_refuses_a_time_budget_for_prefill_first(tmp_path: Path) -> None:
    profile = tiny_profile(tmp_path / "tiny.json")
    args = ["validate", "--profile", str(profile), "--policy", "prefill-first", "--step-budget-ms", "5"]
    assert main([*args, "--num-requests", "2"]) == 2


def test_a_profile_sizes_the_kv_cache_as_the_engine_does_not_from_the_hardware(tmp_path: Path) -> None:
    from stallfree.core import ceil_div
    from stallfree.core.serving import ServingConfig
    from stallfree.sim import Deployment, simulate
    from stallfree.workload import WorkloadOptions, workload_from_options

    profile = str(tiny_profile(tmp_path / "tiny.json"))
    workload = workload_from_options(WorkloadOptions(arrival="all-at-once", lengths="fixed:40,5"))
    context = random_spec("tiny").max_position_embeddings
    for seqs, model_len in ((4, None), (8, 256)):
        serving = ServingConfig(max_num_seqs=seqs, max_model_len=model_len)
        result = simulate(
            workload,
            Deployment(costs=CostChoice(kind="full", profile=profile), serving=serving),
            num_requests=3,
        )
        assert result.summary["num_kv_blocks"] == seqs * ceil_div(model_len or context, 16)
    fixed = simulate(
        workload,
        Deployment(costs=CostChoice(kind="full", profile=profile), serving=ServingConfig(num_blocks=100)),
        num_requests=3,
    )
    assert fixed.summary["num_kv_blocks"] == 100


def test_tune_trials_with_a_profile_take_the_engine_sizing_or_num_blocks(tmp_path: Path) -> None:
    from stallfree.tune.trial import TrialSpec, run_trial

    profile = tiny_profile(tmp_path / "tiny.json")
    spec = TrialSpec.of(
        CostChoice(kind="measured", model="random:tiny", profile=str(profile)),
        lengths="fixed:40,5",
        num_requests=3,
    ).with_serving(4)
    context = random_spec("tiny").max_position_embeddings
    assert run_trial(spec)["num_kv_blocks"] == 4 * -(-context // 16)
    assert run_trial(spec.with_serving(4, num_blocks=40))["num_kv_blocks"] == 40


def test_simulate_with_a_profile_names_the_profiled_machine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile = tiny_profile(tmp_path / "tiny.json")
    args = ["simulate", "--profile", str(profile), "--lengths", "fixed:40,5", "--num-requests", "3"]
    assert main(args) == 0
    header = capsys.readouterr().out.splitlines()[:2]
    assert "x cpu (" in header[0] and "profiled" in header[0] and "a100" not in header[0]
    assert "as the profiled engine allocates them" in header[1]
    assert main([*args, "--num-blocks", "40"]) == 0
    assert "KV cache: 40 blocks of 16 tokens (--num-blocks)" in capsys.readouterr().out


def test_validate_times_the_profiles_reference_step_again_after_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = {
        "reference_step_s": [0.004, 0.006],
        "reference_prompt_step_s": [0.03, 0.05],
        "max_num_seqs": 4,
    }
    profile = tiny_profile(tmp_path / "tiny.json", settings)
    args = ["validate", "--profile", str(profile), "--qps", "20", "--lengths", "fixed:400,3"]
    assert main([*args, "--num-requests", "3", "--max-num-seqs", "4", "--json"]) == 0
    machine = json.loads(capsys.readouterr().out)["policies"]["chunked"]["machine"]
    assert machine["decode"]["profiled_s"] == pytest.approx(0.005) and machine["decode"]["after_run_s"] > 0
    assert machine["prompt"]["profiled_s"] == pytest.approx(0.04) and machine["prompt"]["after_run_s"] > 0
    assert main([*args, "--num-requests", "3", "--max-num-seqs", "4"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if "machine:" in x)
    assert "reference steps took decode " in line and "ms after the run vs 40.0 profiled (" in line
    # an older profile, with the decode reference step only
    old = tiny_profile(tmp_path / "old.json", {"reference_step_s": [0.004, 0.006], "max_num_seqs": 4})
    rest = [*args[3:], "--num-requests", "3", "--max-num-seqs", "4", "--json"]
    assert main(["validate", "--profile", str(old), *rest]) == 0
    assert list(json.loads(capsys.readouterr().out)["policies"]["chunked"]["machine"]) == ["decode"]


def test_step_noise_adds_a_prediction_with_the_profiled_machines_variation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # the reference step ran at 0.5x-1.5x its median speed: each simulated step draws such a factor
    profile = tiny_profile(
        tmp_path / "tiny.json", {"reference_step_s": [0.002, 0.004, 0.006], "max_num_seqs": 4}
    )
    args = ["validate", "--profile", str(profile), "--qps", "20", "--lengths", "fixed:40,8"]
    args += ["--num-requests", "6"]
    assert main([*args, "--max-num-seqs", "4", "--step-noise", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    q = body["step_noise"]  # p1, p10, median, p90, p99 of the factors 0.5, 1 and 1.5
    assert 0.5 <= q[0] < 0.55 and q[2] == pytest.approx(1.0) and 1.45 < q[4] <= 1.5
    m = body["policies"]["chunked"]["metrics"]["max_itl_ms"]
    assert m["with_noise"] != m["predicted"] and m["with_noise_ratio"] == pytest.approx(
        m["with_noise"] / m["measured"]
    )
    assert main([*args, "--max-num-seqs", "4", "--step-noise"]) == 0
    out = capsys.readouterr().out
    assert (
        "with noise" in out
        and f"(p1 {q[0]:.2f}, p10 {q[1]:.2f}, median 1.00, p90 {q[3]:.2f}, p99 {q[4]:.2f})" in out
    )


def test_simulate_step_noise_needs_a_profile_and_says_so_in_its_header(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["simulate", "--lengths", "fixed:40,5", "--num-requests", "3", "--step-noise"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--step-noise needs --profile" in err
    profile = tiny_profile(tmp_path / "tiny.json", {"reference_step_s": [0.002, 0.004, 0.006]})
    assert main([*args, "--profile", str(profile)]) == 0
    assert "steps varied as the profiled machine's" in capsys.readouterr().out.splitlines()[0]


def test_validate_predicts_a_fleet_run_through_the_same_router(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A bench result taken through a router in front of two replicas: the prediction routes the
    same requests to two simulated replicas, and the measured hit rate is the replicas' counters."""
    profile = tiny_profile(tmp_path / "tiny.json")
    bench = write_bench_result(tmp_path / "r.json")
    data = json.loads(bench.read_text())
    counters = [
        {"prefix_cache_queries": 40, "prefix_cache_hits": 10},
        {"prefix_cache_queries": 20, "prefix_cache_hits": 5},
    ]
    data["fleet"] = {
        "num_replicas": 2,
        "replicas": [{"url": f"u{i}", "counters": c} for i, c in enumerate(counters)],
    }
    bench.write_text(json.dumps(data))
    args = ["validate", "--profile", str(profile), "--measured", str(bench), "--num-blocks", "64"]
    args += ["--token-budget", "32", "--max-num-seqs", "8"]
    assert main([*args, "--replicas", "2", "--router", "round-robin", "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert body["scenario"]["fleet"] == "2 replicas behind round-robin"
    result = body["policies"]["chunked"]
    assert result["completed"] == {"measured": 3, "predicted": 3, "requests": 3}
    assert result["metrics"]["prefix_cache_hit_rate"]["measured"] == pytest.approx(0.25)
    fleet_ttft = result["metrics"]["median_ttft_ms"]["predicted"]
    # one replica queues the 3 requests behind each other; two share them
    assert main([*args, "--json"]) == 0
    single = json.loads(capsys.readouterr().out)["policies"]["chunked"]
    assert single["metrics"]["median_ttft_ms"]["predicted"] >= fleet_ttft
    assert main([*args, "--replicas", "2"]) == 0
    assert "2 replicas behind round-robin, each as profiled" in capsys.readouterr().out
    # a replica's counters missing (down at the end): no measured hit rate rather than a wrong one
    data["fleet"]["replicas"][1]["counters"] = None
    bench.write_text(json.dumps(data))
    assert main([*args, "--replicas", "2", "--json"]) == 0
    hits = json.loads(capsys.readouterr().out)["policies"]["chunked"]["metrics"].get("prefix_cache_hit_rate")
    assert hits is None or hits["measured"] is None
