"""``stallfree specs``: the preset listing, a pair's figures, and one-line errors."""

from __future__ import annotations

import json

import pytest

from stallfree.cli import main
from stallfree.sim import simulate
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
        model="llama-3-70b",
        hardware="a100-40gb",
        tp=4,
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
