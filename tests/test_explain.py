"""`stallfree explain` end to end: the seed's figures are the acceptance test."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stallfree.cli import main


def explain_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:  # type: ignore[type-arg]
    assert main(["explain", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)


def test_defaults_reproduce_the_seed(capsys: pytest.CaptureFixture[str]) -> None:
    out = explain_json(capsys)
    assert out["scenario"]["model"] == "llama-3.1-70b" and out["scenario"]["tp"] == 4
    assert out["decode_step_s"] == pytest.approx(0.023, rel=0.05)  # "about 23 milliseconds"
    assert out["ridge_tokens"] == pytest.approx(200, rel=0.05)  # "roughly two hundred tokens"
    assert out["prefill_alone_s"] == pytest.approx(1.84, rel=0.02)  # 16K at ~9,000 tokens/s
    pf, ch = out["policies"]["prefill-first"], out["policies"]["chunked"]
    assert pf["max_gap_s"] == pytest.approx(1.84, rel=0.03)  # "1.84 s of silence"
    assert pf["median_gap_s"] == pytest.approx(out["decode_step_s"], rel=1e-6)
    assert ch["max_gap_s"] == pytest.approx(0.030, rel=0.05)  # "30 milliseconds"
    assert ch["ttft_vs_alone"] == pytest.approx(1.06, abs=0.01)  # "six percent later"
    assert pf["ttft_vs_alone"] == pytest.approx(1.0)


def test_64k_prompt_stalls_about_seven_seconds(capsys: pytest.CaptureFixture[str]) -> None:
    out = explain_json(capsys, "--prompt-tokens", "65536", "--sweep", "256")
    assert out["prefill_alone_s"] == pytest.approx(7.0, rel=0.07)
    assert out["policies"]["prefill-first"]["max_gap_s"] > 7.0


def test_sweep_shows_both_halves_of_the_trade(capsys: pytest.CaptureFixture[str]) -> None:
    out = explain_json(capsys)
    sweep = {row["chunk_tokens"]: row for row in out["sweep"]}
    ridge = out["ridge_tokens"]
    below = [r for c, r in sweep.items() if c < ridge]
    above = [r for c, r in sweep.items() if c > 2 * ridge]
    # Below the ridge the chunk rides free (gap == decode step) but the prompt crawls.
    assert all(r["max_gap_s"] == pytest.approx(out["decode_step_s"]) for r in below)
    assert sweep[16]["ttft_vs_alone"] > 10
    # Above it every chunk makes the step compute-bound: the gap grows with the chunk.
    gaps = [r["max_gap_s"] for r in above]
    assert gaps == sorted(gaps) and gaps[-1] > 20 * out["decode_step_s"]


def test_full_cost_model_charges_later_chunks_more(capsys: pytest.CaptureFixture[str]) -> None:
    seed = explain_json(capsys, "--sweep", "256")
    full = explain_json(capsys, "--cost-model", "full", "--sweep", "256")
    assert seed["prompt_chunks"]["last_vs_first"] == pytest.approx(1.0)
    assert full["prompt_chunks"]["last_vs_first"] > 1.1
    assert full["prefill_alone_s"] > seed["prefill_alone_s"]


def test_a_cached_prefix_leaves_only_the_tail_to_compute(capsys: pytest.CaptureFixture[str]) -> None:
    """The prompt's first 12,000 tokens were cached by earlier traffic (11,993 is not a whole
    number of 16-token blocks: 11,984 are found): prefill-first's stall and chunked's chunks
    shrink to the 4,400-token tail, which sits after that context (the full model charges it)."""
    args = ("--cost-model", "full", "--sweep", "256")
    whole = explain_json(capsys, *args)
    cached = explain_json(capsys, *args, "--cached-prefix-tokens", "11993")
    assert sum(cached["prompt_chunks"]["chunk_tokens"]) == 16384 - 11984
    assert cached["prompt_chunks"]["num_steps"] == -(-(16384 - 11984) // 256)
    pf, pf_whole = cached["policies"]["prefill-first"], whole["policies"]["prefill-first"]
    assert 0.2 * pf_whole["max_gap_s"] < pf["max_gap_s"] < 0.5 * pf_whole["max_gap_s"]
    assert cached["prefill_alone_s"] < 0.5 * whole["prefill_alone_s"]
    assert cached["policies"]["chunked"]["ttft_vs_alone"] == pytest.approx(
        whole["policies"]["chunked"]["ttft_vs_alone"], rel=0.1
    )
    assert main(["explain", "--cached-prefix-tokens", "16384"]) == 2
    assert "below the prompt" in capsys.readouterr().err


def test_a_prefix_in_a_lower_tier_loads_first_while_the_streams_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The same cached prefix, now in host memory over PCIe 5 (64 GB/s a GPU): the prompt reaches
    the scheduler once its KV has loaded, so its TTFT grows by the load (rounded up to a step
    boundary); the streams never wait for it."""
    args = ("--model", "llama-3.1-8b", "--hardware", "h100-sxm", "--tp", "2", "--cost-model", "full")
    args += ("--prompt-tokens", "60000", "--cached-prefix-tokens", "50000", "--sweep", "256")
    in_gpu = explain_json(capsys, *args)
    in_host = explain_json(capsys, *args, "--cached-prefix-link", "pcie5")
    kv_per_gpu = 50000 * 2 * 32 * 8 * 128 * 2 / 2  # K and V, 32 layers, 8 KV heads of 128, bf16, TP 2
    load_s = 10e-6 + kv_per_gpu / 64e9
    assert in_host["scenario"]["cached_prefix_load_s"] == pytest.approx(load_s)
    assert "cached_prefix_load_s" not in in_gpu["scenario"]
    step_s = in_gpu["decode_step_s"] * 3  # the longest step a chunk rides in is a few decode steps
    for name in ("prefill-first", "chunked"):
        host, gpu = in_host["policies"][name], in_gpu["policies"][name]
        assert load_s <= host["ttft_s"] - gpu["ttft_s"] <= load_s + max(step_s, gpu["max_gap_s"])
        assert host["max_gap_s"] == pytest.approx(gpu["max_gap_s"], rel=1e-3)  # contexts a few tokens longer
    assert main(["explain", "--cached-prefix-link", "pcie5"]) == 2
    assert "give --cached-prefix-tokens" in capsys.readouterr().err
    assert main(["explain", "--cached-prefix-tokens", "100", "--cached-prefix-link", "pcie9"]) == 2
    assert "unknown shared store link 'pcie9'" in capsys.readouterr().err


def test_table_and_figures(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "--plot", str(tmp_path), "--sweep", "64,256,1024"]) == 0
    text = capsys.readouterr().out
    assert "prefill-first" in text and "chunked (256-token chunks)" in text and "<- ridge" in text
    for name in ("timeline.png", "timeline.svg", "sweep.png", "sweep.svg"):
        assert (tmp_path / name).stat().st_size > 1000


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "gpt-9"], "unknown model"),
        (["--hardware", "tpu"], "a100-40gb"),
        (["--tp", "3"], "does not divide"),
        (["--chunk-tokens", "0"], "must be positive"),
        (["--prompt-tokens", "-5"], "must be positive"),
        (["--model", "/nonexistent/config.json"], "config"),
        (["--context-tokens", "99999999"], "too large to simulate"),  # was a hang
        (["--streams", "100000"], "too large to simulate"),
        (["--prompt-tokens", "40000000"], "too large to simulate"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = main(["explain", *args])
    except SystemExit as exc:  # argument-type errors exit from the parser itself
        code = exc.code  # type: ignore[assignment]
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and message in err
    assert "Traceback" not in err


def test_non_decoder_config_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "config.json"
    cfg.write_text(json.dumps({"model_type": "bert", "architectures": ["BertModel"], "hidden_size": 768}))
    assert main(["explain", "--model", str(cfg)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_streams_that_do_not_fit_the_kv_cache_together_are_refused() -> None:
    from stallfree.core import CacheConfig, make_policy
    from stallfree.costs.roofline import CostModel, CostModelConfig
    from stallfree.explain import RooflineTimer, Scenario, run_scenario
    from stallfree.specs import load_hardware_spec, load_model_spec

    class SmallCache(RooflineTimer):
        def cache_config(self) -> CacheConfig:
            return CacheConfig(block_size=16, num_blocks=64, watermark=0.0)  # 1,024 tokens

    cost = CostModel(CostModelConfig(load_model_spec("llama-3-8b"), load_hardware_spec("a100-80gb")))
    scenario = Scenario(prompt_tokens=256, streams=4, context_tokens=200, chunk_tokens=64)
    run_scenario(scenario, make_policy("chunked", chunk_tokens=64), SmallCache(cost))  # 4 x 200 fits
    with pytest.raises(ValueError, match="cannot hold 8 streams"):
        run_scenario(
            Scenario(prompt_tokens=256, streams=8, context_tokens=200, chunk_tokens=64),
            make_policy("chunked", chunk_tokens=64),
            SmallCache(cost),
        )


@pytest.mark.parametrize(
    "args",
    [
        ["--model", "llama-3.1-405b", "--tp", "8", "--hardware", "h100-sxm"],
        ["--model", "llama-3-70b", "--hardware", "a100-40gb", "--tp", "1"],
    ],
)
def test_weights_that_do_not_fit_are_refused(args: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "do not fit" in err


def test_what_a_server_could_not_run_is_said_not_hidden(capsys: pytest.CaptureFixture[str]) -> None:
    """Past the model's context, or past the KV cache: the arithmetic stays, with a warning."""
    out = explain_json(capsys, "--prompt-tokens", "200000", "--sweep", "256")
    assert any("131,072-token context" in w for w in out["warnings"])
    assert any(w.startswith("chunked needs") for w in out["warnings"])
    assert out["prefill_alone_s"] > 20  # still computed
    roomy = explain_json(capsys, "--hardware", "h100-sxm", "--tp", "8", "--sweep", "256")
    assert roomy["warnings"] == []
    assert main(["explain", "--prompt-tokens", "200000", "--sweep", "256"]) == 0
    assert "warning: a 200,000-token prompt" in capsys.readouterr().out


def test_ridge_marker_sits_on_the_nearest_sweep_point(capsys: pytest.CaptureFixture[str]) -> None:
    """H100 x 8: the ridge is ~295 tokens, nearest 256 (not 512, the next power of two up)."""
    assert main(["explain", "--hardware", "h100-sxm", "--tp", "8"]) == 0
    marked = [line for line in capsys.readouterr().out.splitlines() if "<- ridge" in line]
    assert len(marked) == 1 and marked[0].split()[0] == "256"


def test_the_size_limit_leaves_long_contexts_that_run_in_seconds() -> None:
    from stallfree.explain.scenario import DEFAULT_SWEEP, Scenario, check_size

    check_size(Scenario(context_tokens=1_000_000), 16, DEFAULT_SWEEP)
    check_size(Scenario(prompt_tokens=1_000_000), 16, DEFAULT_SWEEP)
    with pytest.raises(ValueError, match="too large"):
        check_size(Scenario(prompt_tokens=1_000_000), 16, (1, *DEFAULT_SWEEP))


# The options object: what the command line and the page both build, and run_explain runs.


def test_the_flags_defaults_are_the_options_defaults() -> None:
    from stallfree.cli import build_parser
    from stallfree.cli.explain import explain_options
    from stallfree.explain import ExplainOptions

    assert explain_options(build_parser().parse_args(["explain"])) == ExplainOptions()
    flags = ["--engine", "torch", "--tp", "2", "--sweep", "16,32", "--cost-model", "seed"]
    options = explain_options(build_parser().parse_args(["explain", *flags]))
    assert options == ExplainOptions(engine="torch", tp=2, sweep=(16, 32))  # the alias resolved


def test_run_explain_is_the_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    from stallfree.explain import ExplainOptions, run_explain

    args = ("--cost-model", "full", "--sweep", "64,256", "--streams", "8")
    options = ExplainOptions(cost_model="full", sweep=(64, 256), streams=8)
    assert run_explain(options).to_json() == explain_json(capsys, *args)


@pytest.mark.parametrize(
    ("flags", "fields"),
    [
        (["--prompt-tokens", "0"], {"prompt_tokens": 0}),
        (["--streams", "-3"], {"streams": -3}),
        (["--tp", "0"], {"tp": 0}),
        (["--sweep", "64,0"], {"sweep": (64, 0)}),
        (["--step-budget-ms", "0"], {"step_budget_ms": 0.0}),
        (["--engine", "tpu"], {"engine": "tpu"}),
        (["--engine", "torch", "--framework", "vllm"], {"engine": "torch", "framework": "vllm"}),
        (["--engine", "torch", "--step-budget-ms", "5"], {"engine": "torch", "step_budget_ms": 5.0}),
        (["--engine", "torch", "--speculative-tokens", "2"], {"engine": "torch", "speculative_tokens": 2}),
        (["--speculative-tokens", "-1"], {"speculative_tokens": -1}),
        (
            ["--speculative-tokens", "2", "--acceptance-rate", "1.2"],
            {"speculative_tokens": 2, "acceptance_rate": "1.2"},
        ),
        (
            ["--speculative-tokens", "2", "--step-budget-ms", "40"],
            {"speculative_tokens": 2, "step_budget_ms": 40.0},
        ),
    ],
)
def test_options_refuse_what_the_cli_refuses_in_its_words(
    flags: list[str], fields: dict[str, object], capsys: pytest.CaptureFixture[str]
) -> None:
    from stallfree.explain import ExplainOptions

    try:
        code = main(["explain", *flags])
    except SystemExit as exc:  # argument-type errors exit from the parser itself
        code = exc.code  # type: ignore[assignment]
    said = capsys.readouterr().err.strip().removeprefix("stallfree explain: error: ")
    with pytest.raises(ValueError) as refused:
        ExplainOptions(**fields)  # type: ignore[arg-type]
    assert code == 2 and str(refused.value) == said


def test_an_unfit_deployment_is_a_value_error_not_a_cli_error() -> None:
    """The library says it as a ValueError: the page answers 400, the command line exit 2."""
    from stallfree.explain import ExplainOptions, run_explain

    with pytest.raises(ValueError, match="do not fit on 1 x a100-40gb"):
        run_explain(ExplainOptions(tp=1))


def test_drafts_spend_the_prompts_budget_under_vllms_rule_and_stall_under_sglangs(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    args = (
        "--speculative-tokens",
        "4",
        "--acceptance-rate",
        "0.7",
        "--sweep",
        "256",
        "--plot",
        str(tmp_path),
    )
    out = explain_json(capsys, *args)
    assert (tmp_path / "drafts.png").exists() and str(tmp_path / "drafts.svg") in out["figures"]
    pol, spec = out["policies"], out["speculative"]
    plain, vllm, sglang = pol["chunked"], pol["chunked + 4 drafts (vllm)"], pol["chunked + 4 drafts (sglang)"]
    decode_s = out["decode_step_s"]
    # The arithmetic: 16 streams x (1 + 4) of a 272-token step leave 192 for the prompt.
    assert spec["token_budget"] == 16 + 256 and spec["sweep"][-1]["prompt_tokens_per_step"] == pytest.approx(
        192, abs=2
    )
    # Below the ridge the weights' read prices the step: drafts ride free, the streams get the
    # expected tokens per step (1 + 0.7 + 0.49 + 0.343 + 0.24), the prompt fewer tokens per step.
    tokens_per_step = 1 + sum(0.7**i for i in range(1, 5))
    assert vllm["stream_tokens_per_s"] / plain["stream_tokens_per_s"] == pytest.approx(
        tokens_per_step, rel=0.1
    )
    assert vllm["max_gap_s"] == pytest.approx(plain["max_gap_s"])
    ttfts = [p["ttft_s"] for p in spec["sweep"]]
    speeds = [p["stream_tokens_per_s"] for p in spec["sweep"]]
    assert ttfts == sorted(ttfts) and speeds == sorted(speeds) and ttfts[-1] > 1.25 * ttfts[0]
    assert spec["sweep"][0]["ttft_s"] == pytest.approx(plain["ttft_s"])  # 0 drafts: the chunked run
    # SGLang's rule: the prompt runs in steps of its own, the streams wait for all of it.
    assert sglang["max_gap_s"] > 0.95 * out["prefill_alone_s"] > 50 * decode_s
    assert sglang["ttft_s"] < vllm["ttft_s"]


def test_disaggregated_the_streams_never_stall_but_the_gpus_double(
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = explain_json(capsys, "--disaggregate", "1P1D", "--kv-link", "ib-400", "--sweep", "256")
    d, decode_s = out["disaggregated"], out["decode_step_s"]
    assert d["gpus"] == 8 and d["aggregated_gpus"] == 4
    # the streams' steps hold decodes only (the prompt joins as one more decode): no stall
    assert d["median_gap_s"] == pytest.approx(decode_s) and d["max_gap_s"] < 1.1 * decode_s
    assert d["max_gap_s"] < out["policies"]["chunked"]["max_gap_s"]
    # the prompt's first token from its prefill group alone; its KV (5.37 GB, bf16) over 4 x 50 GB/s
    assert d["ttft_s"] == pytest.approx(out["prefill_alone_s"])
    assert d["kv_bytes"] == 5_368_709_120 and d["kv_transfer_s"] == pytest.approx(
        5e-6 + d["kv_bytes"] / 200e9
    )
    assert d["first_decode_token_s"] > d["ttft_s"] + d["kv_transfer_s"]
    text_argv = ["explain", "--disaggregate", "2P4D", "--sweep", "256"]
    assert main(text_argv) == 0
    assert "disaggregated 2P4D" in capsys.readouterr().out
