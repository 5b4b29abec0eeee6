"""``stallfree specs``: the preset listing, a pair's figures, and one-line errors."""

from __future__ import annotations

import json

import pytest

from stallfree.cli import main
from stallfree.costs.choice import CostChoice
from stallfree.sim import Deployment, simulate
from stallfree.specs import HARDWARE_PRESETS, MODEL_PRESETS
from stallfree.workload import AllAtOnce, FixedLengths, Workload


def test_lists_every_preset(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["specs"]) == 0
    out = capsys.readouterr().out
    for name in (*MODEL_PRESETS, *HARDWARE_PRESETS):
        assert name in out


def test_seed_pair_json(capsys: pytest.CaptureFixture[str]) -> None:
    """Llama-3-70B on 4 x A100-40GB: the seed's 23 ms decode step, ~9,000 tokens/s, ridge ~200.

    KV capacity: 4 x 40 GiB x 0.9 = 154.6 GB, minus 141.1 GB of weights and ~0.26 GB of activations
    for a 512-token step = 13.2 GB, / 320 KiB = ~40.4K tokens: the KV cache ``simulate`` sizes.
    """
    assert main(["specs", "--model", "llama-3-70b", "--hardware", "a100-40gb", "--tp", "4", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["model"]["num_params"] / 1e9 == pytest.approx(70.6, abs=0.05)
    assert report["model"]["kv_bytes_per_token"] == 327_680
    roofline = report["roofline"]
    assert roofline["decode_step_s"]["16"] == pytest.approx(0.023, rel=0.03)
    assert roofline["prefill_tokens_per_s"] == pytest.approx(9000, rel=0.03)
    assert roofline["ridge_tokens"] == pytest.approx(200, rel=0.02)
    assert roofline["kv_capacity_tokens"] == pytest.approx(40_400, rel=0.01)
    sim = simulate(
        Workload(AllAtOnce(), FixedLengths(16, 4)),
        Deployment(costs=CostChoice(kind="full", model="llama-3-70b", hardware="a100-40gb", tp=4)),
        num_requests=1,
    )
    assert roofline["kv_capacity_tokens"] == sim.kv.num_tokens  # one capacity for one deployment


def test_full_cost_model_decode_grows_with_streams(capsys: pytest.CaptureFixture[str]) -> None:
    assert (
        main(["specs", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--cost-model", "full", "--json"])
        == 0
    )
    steps = json.loads(capsys.readouterr().out)["roofline"]["decode_step_s"]
    assert steps["1"] < steps["16"] < steps["64"]


def test_text_report_for_a_model_alone(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["specs", "--model", "llama-3-8b", "--dtype", "fp32"]) == 0
    out = capsys.readouterr().out
    assert "8.03 B" in out
    assert "32.1 GB" in out  # 8.03e9 params x 4 bytes


@pytest.mark.parametrize(
    "argv",
    [
        ["specs", "--model", "gpt-5"],
        ["specs", "--hardware", "tpu"],
        ["specs", "--model", "llama-3-70b", "--hardware", "a100-40gb", "--tp", "3"],
        ["specs", "--model", "/nonexistent/config.json"],
        ["specs", "--model", "llama-3-8b", "--hardware", "mi300x", "--cost-model", "measured"],  # no table
        [
            "specs",
            "--model",
            "llama-3-8b",
            "--hardware",
            "a100-80gb",
            "--cost-model",
            "measured",
            "--tp",
            "3",
        ],
    ],
)
def test_bad_input_is_one_line_exit_2(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("stallfree specs: error:")
    assert err.count("\n") == 1


def test_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["specs", "--help"])
    assert info.value.code == 0
    assert "ridge" in capsys.readouterr().out


def test_gpu_measured_model_json(capsys: pytest.CaptureFixture[str]) -> None:
    """Llama-3-8B on an A100: its own table, measured layers, modelled attention, and the step
    figures of the roofline section from the measured model (slower than the roofline)."""
    pair = ["specs", "--model", "llama-3-8b", "--hardware", "a100-80gb", "--json"]
    assert main([*pair, "--cost-model", "measured"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["roofline"]["cost_model"] == "full"  # the roofline beside the tables
    m = report["measured"]
    assert (
        m["cost_model"] == "measured" and m["gpu_table"] == "a100" and m["table_model"] == "Meta-Llama-3-8B"
    )
    assert m["table_is_this_shape"] and m["linear_layers"].startswith("measured: Vidur's a100 table")
    assert m["attention"].startswith("modelled") and m["all_reduce"] == "none (tp=1)"
    by_tokens = m["by_tokens_per_step"]
    assert list(by_tokens) == ["1", "64", "256", "512", "2048", "8192"]
    for entry in by_tokens.values():
        assert 0 < entry["flops_per_s"] < 312e12 and 0.3 < entry["table_efficiency"] < 1
    assert by_tokens["1"]["step_s"] < by_tokens["8192"]["step_s"]
    assert main([*pair, "--cost-model", "full"]) == 0
    roofline = json.loads(capsys.readouterr().out)["roofline"]
    assert m["decode_step_s"]["16"] > roofline["decode_step_s"]["16"]
    assert m["prefill_tokens_per_s"] < roofline["prefill_tokens_per_s"]
    assert (
        m["kv_capacity_tokens"] == roofline["kv_capacity_tokens"]
        and m["ridge_tokens"] == roofline["ridge_tokens"]
    )


def test_gpu_measured_model_text_names_a_borrowed_curve(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "specs",
        "--model",
        "llama-3-8b",
        "--hardware",
        "h100-sxm",
        "--tp",
        "2",
        "--cost-model",
        "measured",
    ]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "measured    tp=2, Vidur's h100 operator tables (shipped)" in out
    assert "derived: h100 efficiency curve" in out and "Llama-2-7b-hf at tp=2" in out
    assert "all-reduce           measured: Vidur's h100 all-reduce, 2 GPUs" in out
    assert "attention            modelled, FlashAttention-style" in out
    assert "TFLOP/s a GPU" in out and "decode step x16" in out


def test_measured_without_a_table_names_the_hardware(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["specs", "--model", "llama-3-8b", "--hardware", "mi300x", "--cost-model", "measured"]) == 2
    err = capsys.readouterr().err
    assert "needs --profile FILE" in err and "mi300x has none" in err
