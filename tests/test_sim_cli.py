"""``stallfree simulate`` on the command line: tables, JSON, output files, one-line errors."""

from __future__ import annotations

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from stallfree.cli import main

SMALL = ["--num-requests", "40", "--qps", "4"]


def test_policies_side_by_side_in_one_table(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *SMALL, "--policy", "prefill-first,decode-first,chunked"]) == 0
    out = capsys.readouterr().out
    header = next(line for line in out.splitlines() if "chunked" in line and "prefill-first" in line)
    assert header.split() == ["prefill-first", "decode-first", "chunked"]
    assert "ITL p99 (ms)" in out
    assert "llama-3-8b on 1 x a100-80gb (cost model: measured (Vidur's A100 tables; auto))" in out


@pytest.mark.parametrize(
    ("argv", "kind", "note"),
    [
        ([], "measured", "Vidur's A100 tables; auto"),  # the default hardware is an A100 preset
        (["--hardware", "h100-sxm"], "measured", "Vidur's H100 tables, Llama-2-7b-hf's curve; auto"),
        (["--hardware", "l40s"], "full", "no measured table for l40s; auto"),
        (["--hardware", "l40s", "--cost-model", "auto"], "full", "no measured table for l40s; auto"),
        (["--cost-model", "full"], "full", None),  # a kind given is used as given
        (["--cost-model", "seed"], "weights-only", None),
        (["--cost-model", "measured"], "measured", None),
    ],
)
def test_auto_cost_model_resolves_and_the_json_records_the_kind(
    argv: list[str], kind: str, note: str | None, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["simulate", *SMALL, *argv, "--json"]) == 0
    scenario = json.loads(capsys.readouterr().out)["scenario"]
    assert scenario["cost_model"] == kind and scenario["cost_model_note"] == note


def test_auto_header_says_why_and_explicit_full_is_unchanged(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *SMALL, "--hardware", "l40s"]) == 0
    assert (
        "llama-3-8b on 1 x l40s (cost model: full (no measured table for l40s; auto));"
        in capsys.readouterr().out
    )
    assert main(["simulate", *SMALL, "--cost-model", "full"]) == 0
    assert "llama-3-8b on 1 x a100-80gb (cost model: full);" in capsys.readouterr().out


def test_auto_prices_steps_as_the_kind_it_names(capsys: pytest.CaptureFixture[str]) -> None:
    def summary(*argv: str) -> dict[str, object]:
        assert main(["simulate", *SMALL, "--json", *argv]) == 0
        return dict(json.loads(capsys.readouterr().out)["policies"]["chunked"])

    def drop_wall(s: dict[str, object]) -> dict[str, object]:
        return {k: v for k, v in s.items() if k != "sim_wall_s"}

    assert drop_wall(summary()) == drop_wall(summary("--cost-model", "measured"))
    assert drop_wall(summary("--hardware", "l40s")) == drop_wall(
        summary("--hardware", "l40s", "--cost-model", "full")
    )
    assert drop_wall(summary()) != drop_wall(summary("--cost-model", "full"))


def test_auto_with_a_profile_is_the_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from stallfree.specs.step_profile import save_profile
    from tests.test_profile_measured import synthetic_profile

    profile = save_profile(synthetic_profile(), tmp_path / "p.json")
    assert main(["simulate", *SMALL, "--model", "llama-3-8b", "--profile", str(profile), "--json"]) == 0
    scenario = json.loads(capsys.readouterr().out)["scenario"]
    assert scenario["cost_model"] == "measured" and scenario["cost_model_note"] == f"profile {profile}; auto"


def test_measured_on_hardware_without_a_table_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *SMALL, "--hardware", "mi300x", "--cost-model", "measured"]) == 2
    err = capsys.readouterr().err
    assert "needs --profile FILE" in err and "mi300x has none" in err and "Traceback" not in err


def test_json_has_vllm_keys_per_policy(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(
            [
                "simulate",
                *SMALL,
                "--policy",
                "chunked,prefill-first",
                "--json",
                "--goodput",
                "ttft:500",
                "tpot:50",
            ]
        )
        == 0
    )
    body = json.loads(capsys.readouterr().out)
    assert set(body["policies"]) == {"chunked", "prefill-first"}
    for summary in body["policies"].values():
        for key in (
            "completed",
            "duration",
            "request_throughput",
            "output_throughput",
            "total_token_throughput",
        ):
            assert key in summary
        for metric in ("ttft", "tpot", "itl", "e2el"):
            for stat in ("mean", "median", "std", "p90", "p99"):
                assert f"{stat}_{metric}_ms" in summary
        assert summary["completed"] == 40 and summary["request_goodput"] is not None
        assert {"max_itl_ms", "num_preemptions", "rejected", "mean_scheduling_delay_ms"} <= summary.keys()
    assert body["scenario"]["num_requests"] == 40


def test_single_policy_json_has_the_same_shape(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["simulate", *SMALL, "--json", "--cost-model", "seed"]) == 0
    body = json.loads(capsys.readouterr().out)
    assert set(body) == {"scenario", "policies"} and list(body["policies"]) == ["chunked"]
    assert body["policies"]["chunked"]["policy"] == "chunked"
    assert body["scenario"]["cost_model"] == "weights-only"  # the alias resolved


def test_one_budget_flag_for_every_policy(capsys: pytest.CaptureFixture[str]) -> None:
    """vLLM's --max-num-batched-tokens caps every policy's step; --token-budget is the same flag."""
    args = ["simulate", "--lengths", "fixed:3000,20", "--num-requests", "6", "--qps", "50", "--json"]
    runs = {}
    for flag in ("--max-num-batched-tokens", "--token-budget"):
        assert main([*args, "--policy", "chunked,prefill-first", flag, "1024"]) == 0
        runs[flag] = json.loads(capsys.readouterr().out)["policies"]
    assert runs["--max-num-batched-tokens"] == {
        k: {**v, "sim_wall_s": runs["--max-num-batched-tokens"][k]["sim_wall_s"]}
        for k, v in runs["--token-budget"].items()
    }
    assert main([*args, "--policy", "prefill-first"]) == 0
    whole = json.loads(capsys.readouterr().out)["policies"]["prefill-first"]
    capped = runs["--token-budget"]["prefill-first"]
    # 3,000-token prompts batched whole under 1,024: one prompt a step, not several.
    assert capped["num_steps"] > whole["num_steps"] or capped["mean_ttft_ms"] > whole["mean_ttft_ms"]


@pytest.mark.parametrize(
    ("extra", "num"),
    [([], 5), (["--workload", "all-at-once"], 5), ([], 1), (["--policy", "prefill-first,chunked"], 1)],
)
def test_all_rejected_has_no_latencies(
    extra: list[str], num: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """Later arrivals, all at once, or one request: the same answer (exit 0, nulls, the note)."""
    args = ["simulate", "--lengths", "fixed:20000,100", "--num-requests", str(num), *extra]
    assert main([*args, "--json"]) == 0
    for summary in json.loads(capsys.readouterr().out)["policies"].values():
        assert summary["completed"] == 0 and summary["rejected"] == num
        for key in (
            "mean_ttft_ms",
            "p99_ttft_ms",
            "mean_tpot_ms",
            "median_itl_ms",
            "max_itl_ms",
            "p99_e2el_ms",
        ):
            assert summary[key] is None, key
        assert summary["rejected_reasons"] == {
            "prompt (20000) + max_tokens (100) exceeds max_model_len (8192)": num
        }
    assert main(args) == 0
    out = capsys.readouterr().out
    assert re.search(r"TTFT mean \(ms\) +-", out, re.M) and re.search(r"ITL max \(ms\) +-", out, re.M)
    assert (
        f"rejected {num}" in out and "prompt (20000) + max_tokens (100) exceeds max_model_len (8192)" in out
    )
    assert "(N)" not in out and "no request completed, so it has no latencies" in out


def test_replaying_a_trace_with_outputs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "trace.csv"
    trace.write_text("arrived_at,num_prefill_tokens,num_decode_tokens\n0.0,3000,20\n0.1,50,30\n0.2,1500,10\n")
    requests, steps, plots = tmp_path / "req.csv", tmp_path / "steps.json", tmp_path / "fig"
    args = [
        "simulate",
        "--trace",
        str(trace),
        "--policy",
        "chunked,prefill-first",
        "--requests-out",
        str(requests),
    ]
    assert main([*args, "--trace-out", str(steps), "--plot", str(plots)]) == 0
    assert "3 requests: arrivals replayed from" in capsys.readouterr().out
    with (tmp_path / "req.chunked.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [r["num_prompt_tokens"] for r in rows] == ["3000", "50", "1500"]
    assert (tmp_path / "req.prefill-first.csv").exists()
    events = json.loads(steps.read_text())["traceEvents"]
    slices = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in slices} == {1, 2}
    assert all(e["dur"] > 0 for e in slices)
    names = {p.name for p in plots.iterdir()}
    for figure in ("itl_cdf", "ttft_cdf", "batch_composition", "kv_usage"):
        assert {f"{figure}.png", f"{figure}.svg"} <= names


def error_line(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    assert main(["simulate", *args]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1, err
    return err


def test_missing_trace_file(capsys: pytest.CaptureFixture[str]) -> None:
    assert "trace file not found: nowhere.csv" in error_line(capsys, "--trace", "nowhere.csv")


def test_trace_with_wrong_columns_names_them(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text("arrived_at,prompt,num_decode_tokens\n0,1,1\n")
    assert "missing column(s) num_prefill_tokens" in error_line(capsys, "--trace", str(bad))


@pytest.mark.parametrize("qps", ["0", "-2"])
def test_qps_must_be_positive(qps: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert "qps must be a positive number" in error_line(capsys, "--qps", qps)


def test_budget_smaller_than_the_running_batch(capsys: pytest.CaptureFixture[str]) -> None:
    assert "smaller than max_num_seqs 64" in error_line(
        capsys, "--token-budget", "32", "--max-num-seqs", "64"
    )


def test_unknown_policy(capsys: pytest.CaptureFixture[str]) -> None:
    err = error_line(capsys, "--policy", "chunked,fifo")
    assert "unknown policy 'fifo'; choose from: chunked, prefill-first, decode-first" in err


def test_model_that_does_not_fit(capsys: pytest.CaptureFixture[str]) -> None:
    assert "does not fit" in error_line(capsys, "--model", "llama-3-70b", "--hardware", "a100-40gb")


def test_simulate_runs_without_torch() -> None:
    """The simulator side never imports torch: block it and run a small simulation."""
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from stallfree.cli import main\n"
        "assert main(['simulate', '--num-requests', '20', '--json']) == 0\n"
        "assert 'torch' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_negative_step_overhead(capsys: pytest.CaptureFixture[str]) -> None:
    assert "--step-overhead-ms must be >= 0" in error_line(capsys, "--step-overhead-ms", "-1")


def test_no_arguments_lists_the_commands(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    err = capsys.readouterr().err
    assert "simulate" in err and "bench" in err and "tune" in err and "usage: stallfree" in err


def test_a_command_imports_its_own_module_and_help_lists_them_all() -> None:
    """`stallfree simulate` builds its own parser only (a short run does not wait for the other
    commands' imports); with no command, or an unknown one, every command is listed."""
    code = (
        "import sys, io, contextlib\n"
        "from stallfree.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['simulate', '--num-requests', '2', '--json'])\n"
        "print(sorted(m for m in ('explain', 'tune', 'serve', 'bench') if 'stallfree.cli.' + m in sys.modules))\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert run.stdout.strip() == "[]"
    stallfree = str(Path(sys.executable).parent / "stallfree")
    listed = subprocess.run([stallfree, "nonsense"], capture_output=True, text=True)
    assert listed.returncode == 2 and "'explain'" in listed.stderr and "'save-model'" in listed.stderr
