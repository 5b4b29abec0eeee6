"""``stallfree.validate`` as a library: options in, a frozen result out, which the command line
only prints (its ``--json`` is the result's ``to_json``) and ``plots/`` only draws; the command's
scheduler flags are ``ServingConfig``'s. A bench result is the measured side here: no engine run."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

pytest.importorskip("torch")

from stallfree.cli import main
from stallfree.cli.common import UsageError
from stallfree.cli.serving_args import add_serving_args, serving_configs
from stallfree.core import ScheduledChunk, StepPlan
from stallfree.core.serving import ServingConfig
from stallfree.plots.validate import plot_validation
from stallfree.server.step_log import write_step
from stallfree.validate import ValidationOptions, ValidationResult, format_report, validate
from tests.test_validate import tiny_profile, write_bench_result


def served_run(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A profile, a bench result, and a step log of four decode steps and one prompt step."""
    profile = tiny_profile(tmp_path / "tiny.json", {"reference_step_s": [0.002, 0.004, 0.006]})
    log = tmp_path / "steps.jsonl"
    with log.open("w") as out:
        for i in range(4):
            plan = StepPlan((ScheduledChunk("a", 20 + i, 1, 21 + i),))
            write_step(out, plan, i * 0.01, i * 0.01 + 0.002, 0.001)
        write_step(out, StepPlan((ScheduledChunk("b", 0, 30, 30),)), 0.05, 0.06, 0.009)
    return profile, write_bench_result(tmp_path / "r.json"), log


def test_the_result_is_typed_and_its_json_is_the_commands(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    profile, bench, log = served_run(tmp_path)
    serving = ServingConfig(max_num_batched_tokens=32, max_num_seqs=8, num_blocks=64)
    options = ValidationOptions(
        profile=str(profile), servings=(serving,), measured=str(bench), step_log=str(log), step_noise=True
    )
    result = validate(options)
    assert isinstance(result, ValidationResult)
    (run,) = result.policies
    assert run.policy == "chunked" and run.num_requests == 3 and len(run.measured.ttft_s) == 3
    assert run.per_step is not None and run.per_step.all_steps.num_steps == 5
    assert run.per_step.decode_only.num_steps == 4 and run.per_step.with_prompt_tokens.num_steps == 1
    assert run.run_step_scales == run.per_step.run_step_scales
    assert run.with_noise is not None and run.at_run_speed is not None
    assert [name for name, _ in run.extra_predictions()] == ["with_noise", "at_run_speed"]
    assert result.step_noise is not None and len(result.step_noise) == 5 and result.ordering() is None
    args = ["validate", "--profile", str(profile), "--measured", str(bench), "--step-log", str(log)]
    args += ["--num-blocks", "64", "--token-budget", "32", "--max-num-seqs", "8", "--step-noise"]
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == json.loads(json.dumps(result.to_json()))
    assert main(args) == 0
    assert capsys.readouterr().out == format_report(result) + "\n"


def test_options_refuse_what_cannot_run_in_the_commands_words(tmp_path: Path) -> None:
    served = ServingConfig(num_blocks=64)
    with pytest.raises(ValueError, match="--step-log goes with --measured"):
        ValidationOptions(profile="p.json", step_log="steps.jsonl")
    with pytest.raises(ValueError, match="--measured compares one run"):
        two = (served, ServingConfig(policy="prefill-first", num_blocks=64))
        ValidationOptions(profile="p.json", servings=two, measured="r.json")
    with pytest.raises(ValueError, match="--measured needs --num-blocks"):
        ValidationOptions(profile="p.json", measured="r.json")
    with pytest.raises(ValueError, match="a fleet is measured behind a real router: give --measured"):
        ValidationOptions(profile="p.json", replicas=2)
    with pytest.raises(ValueError, match="policy listed twice"):
        ValidationOptions(profile="p.json", servings=(served, served))


def test_the_scheduler_flags_are_serving_configs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No --max-num-seqs of its own: ServingConfig's default (256, at most a chunked budget), its
    rules (a budget below max_num_seqs is refused) and its other fields (--kv-watermark)."""
    profile, bench, _ = served_run(tmp_path)
    args = ["validate", "--profile", str(profile), "--measured", str(bench), "--num-blocks", "64", "--json"]
    for extra, seqs in ((["--token-budget", "32"], 32), (["--policy", "prefill-first"], 256)):
        assert main([*args, *extra, "--kv-watermark", "0.05"]) == 0
        (run,) = json.loads(capsys.readouterr().out)["policies"].values()
        assert run["max_num_seqs"] == seqs
    assert main([*args, "--token-budget", "8", "--max-num-seqs", "16"]) == 2
    assert "token budget 8 is smaller than max_num_seqs 16" in capsys.readouterr().err


def test_a_policy_list_gives_one_serving_config_each() -> None:
    parser = argparse.ArgumentParser()
    add_serving_args(parser, policy_list=True)
    both = serving_configs(parser.parse_args(["--policy", "chunked,prefill-first", "--step-budget-ms", "5"]))
    assert [(s.policy, s.step_budget_ms) for s in both] == [("chunked", 5.0), ("prefill-first", None)]
    with pytest.raises(UsageError, match="--step-budget-ms applies to the chunked policy only"):
        serving_configs(parser.parse_args(["--policy", "prefill-first", "--step-budget-ms", "5"]))
    with pytest.raises(UsageError, match="unknown policy 'fifo'"):
        serving_configs(parser.parse_args(["--policy", "chunked,fifo"]))


def test_the_figures_are_drawn_from_the_result(tmp_path: Path) -> None:
    profile, bench, _ = served_run(tmp_path)
    options = ValidationOptions(
        profile=str(profile), servings=(ServingConfig(num_blocks=64),), measured=str(bench)
    )
    paths = plot_validation(validate(options), tmp_path / "plots")
    assert [p.name for p in paths] == ["validate-itl-cdf.png", "validate-ttft-cdf.png"]
    assert all(p.stat().st_size > 0 for p in paths)


def test_the_command_line_only_parses_into_options() -> None:
    from stallfree.cli import build_parser
    from stallfree.cli.validate import validation_options

    assert validation_options(build_parser().parse_args(["validate", "--profile", "p.json"])) == (
        ValidationOptions(profile="p.json")
    )
    flags = ["--policy", "chunked,decode-first", "--token-budget", "64", "--qps", "2", "--step-noise"]
    options = validation_options(build_parser().parse_args(["validate", "--profile", "p.json", *flags]))
    assert options == ValidationOptions(
        profile="p.json",
        servings=(
            ServingConfig(max_num_batched_tokens=64),
            ServingConfig(policy="decode-first", max_num_batched_tokens=64),
        ),
        qps=2.0,
        step_noise=True,
    )


def test_a_cache_too_small_for_the_reference_step_leaves_out_the_machine_check_not_the_run() -> None:
    import dataclasses

    from stallfree.costs.measured import MeasuredCostModel
    from stallfree.engine.engine import LLMEngine
    from stallfree.validate.measured import _machine
    from tests.test_profile_measured import synthetic_profile

    profile = synthetic_profile()
    model = MeasuredCostModel(
        dataclasses.replace(profile, settings={"reference_step_s": [0.01], "max_num_seqs": 64})
    )
    engine = LLMEngine("random:tiny", dtype="float32", device="cpu", num_blocks=32, max_num_seqs=4)
    assert _machine(model, engine) is None  # 16 decodes at 256 tokens need 272 blocks


@pytest.mark.parametrize(
    ("fingerprint", "expected"),
    [
        ({"quantization": "bf16", "linear": "bf16-dot"}, "bf16"),
        ({"quantization": None, "linear": "panels"}, None),
        ({"linear": "bf16-dot"}, "bf16"),  # a profile from before the field: its matmuls say it
        ({"linear": "q8_0"}, "q8_0"),
        ({"linear": "onednn"}, None),
        ({}, None),
    ],
)
def test_validate_runs_the_weights_format_the_profile_ran(
    fingerprint: dict[str, object], expected: str | None
) -> None:
    from stallfree.validate.measured import profiled_quantization

    assert profiled_quantization(fingerprint) == expected
