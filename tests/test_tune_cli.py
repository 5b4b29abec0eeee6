"""``stallfree tune`` end to end on a small workload, and its bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stallfree.cli import main

SMALL = ["--lengths", "fixed:768,32", "--num-requests", "150", "--workers", "1", "--no-progress"]


def test_small_real_tune_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(
        ["tune", *SMALL, "--budgets", "256,1024", "--slo-tbt-p99-ms", "60", "--json", "--plot", str(tmp_path)]
    )
    out = json.loads(capsys.readouterr().out)
    assert code == 0
    assert out["slos"] == {"tbt_p99_ms": 60.0, "sched_delay_p50_s": 2.0}
    assert set(out["policies"]) == {"chunked", "prefill-first"}
    chunked, prefill_first = out["policies"]["chunked"], out["policies"]["prefill-first"]
    assert chunked["best_budget"] in (256, 1024)
    # 768-token prompts prefilled whole stall every decode: stall-free batching holds more load.
    assert chunked["capacity_qps"] > prefill_first["capacity_qps"]
    assert "--max-num-batched-tokens" in chunked["commands"]["vllm"]
    assert "--chunked-prefill-size" in chunked["commands"]["sglang"]
    for policy, entry in out["policies"].items():
        best = [p for p in entry["curve"] if p["token_budget"] == entry["best_budget"]]
        assert best and best[0]["capacity_qps"] == max(p["capacity_qps"] for p in entry["curve"])
        # The capacity is a QPS that was tried and met every SLO.
        passing = [t["qps"] for t in out["trials"] if t["policy"] == policy and t["passed"]]
        assert entry["capacity_qps"] == max(
            t["qps"]
            for t in out["trials"]
            if t["policy"] == policy and t["passed"] and t["token_budget"] == entry["best_budget"]
        )
        assert entry["capacity_qps"] <= max(passing)
    for t in out["trials"]:
        metrics = t["metrics"]
        assert t["passed"] == (metrics["p99_itl_ms"] <= 60 and metrics["median_scheduling_delay_ms"] <= 2000)
        assert metrics["completed"] == 150
    assert sorted(Path(p).name for p in out["figures"]) == [
        "capacity.png",
        "capacity.svg",
        "tbt_vs_qps.png",
        "tbt_vs_qps.svg",
    ]


def test_table_and_an_slo_no_budget_meets(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["tune", *SMALL, "--budgets", "256", "--policy", "chunked", "--slo-tbt-p99-ms", "1"])
    out = capsys.readouterr().out
    assert code == 1
    assert "no budget meets the SLOs" in out
    assert "closest: budget 256 at" in out and "P99 TBT" in out and "(SLO 1 ms)" in out
    assert "each trial 150 requests" in out
    # without draft lengths searched the table is as it was before drafts existed: no drafts column
    header = f"  {'policy':<16}{'budget':>8}{'max seqs':>10}{'capacity (QPS)':>16}{'trials':>8}"
    assert header in out.splitlines()


def test_default_tbt_slo_is_sarathi_strict(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["tune", *SMALL, "--budgets", "512", "--policy", "chunked"])
    out = capsys.readouterr().out
    assert code == 0
    assert "strict: 5 x a 32-sequence decode step" in out
    assert (
        "vllm serve mistralai/Mistral-7B-v0.3 --max-num-batched-tokens 512 --max-num-seqs 256 --enable-chunked-prefill"
        in out
    )


def test_without_the_prefix_cache_the_commands_turn_it_off(capsys: pytest.CaptureFixture[str]) -> None:
    """Mooncake's rows in order share prefixes: with the cache the trials find them, without it
    the printed flags must turn the servers' own caches off (both cache by default)."""
    argv = ["tune", "--lengths", "mooncake-synthetic", "--num-requests", "200", "--workers", "1"]
    argv += ["--budgets", "512", "--policy", "chunked", "--slo-tbt-p99-ms", "1000", "--json", "--no-progress"]
    runs = {}
    for flag in ("--enable-prefix-caching", "--no-enable-prefix-caching"):
        assert main([*argv, flag]) == 0
        runs[flag] = json.loads(capsys.readouterr().out)
    on, off = runs["--enable-prefix-caching"], runs["--no-enable-prefix-caching"]
    assert on["prefix_caching"] is True and off["prefix_caching"] is False
    assert "--no-enable-prefix-caching" not in on["policies"]["chunked"]["commands"]["vllm"]
    assert off["policies"]["chunked"]["commands"]["vllm"].endswith(" --no-enable-prefix-caching")
    assert "--disable-radix-cache" in off["policies"]["chunked"]["commands"]["sglang"]
    # the same first trial, its prompts partly cached only with the cache on
    first_on, first_off = on["trials"][0]["metrics"], off["trials"][0]["metrics"]
    assert first_on["median_ttft_ms"] < first_off["median_ttft_ms"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--budgets", "12x"], "--budgets"),
        (["--policy", "fastest"], "unknown policy 'fastest'"),
        (["--model", "no-such-model"], "no-such-model"),
        (["--lengths", "missing.csv"], "missing.csv"),
        (["--address", "127.0.0.1:6379"], "--address applies to --backend ray only"),
        (["--precision", "2"], "--precision must be below 1"),
        (["--backend", "ray", "--address", "127.0.0.1:1"], "no Ray cluster answers at 127.0.0.1:1"),
        (["--backend", "ray", "--address", "nonsense"], "bad Ray address"),
        (
            ["--budgets", "128", "--max-num-seqs", "256", "--policy", "chunked", "--model", "llama-3-70b"],
            "fit",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tune", *SMALL, *argv]) == 2
    err = capsys.readouterr().err
    assert message in err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_auto_cost_model_is_resolved_in_the_result(capsys: pytest.CaptureFixture[str]) -> None:
    from stallfree.costs.choice import CostChoice
    from stallfree.tune.trial import decode_step_ms

    one = [*SMALL, "--budgets", "512", "--policy", "chunked"]
    assert main(["tune", *one, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cost_model"] == "measured" and out["cost_model_note"] == "Vidur's A100 tables; auto"
    # The strict SLO is 5 x the decode step of the model that ran, here the measured one.
    step_ms = decode_step_ms(CostChoice(kind="measured", model="mistral-7b", hardware="a100-80gb"), 32, 4096)
    assert out["slos"]["tbt_p99_ms"] == round(5 * step_ms, 1)

    assert main(["tune", *one, "--cost-model", "full", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["cost_model"] == "full" and out["cost_model_note"] is None

    assert main(["tune", *one, "--hardware", "l40s", "--slo-tbt-p99-ms", "200"]) == 0
    text = capsys.readouterr().out
    assert "mistral-7b on 1 x l40s (cost model full (no measured table for l40s; auto); ridge" in text
