"""tune with speculative decoding: draft lengths searched beside budgets, and their launch lines."""

from __future__ import annotations

import dataclasses
import json

import pytest

from stallfree.cli import main
from stallfree.core.serving import ServingConfig
from stallfree.costs.choice import CostChoice
from stallfree.sim import Speculation
from stallfree.sim.speculative import Acceptance
from stallfree.tune.capacity import TuneConfig, serve_commands, tune_searches
from stallfree.tune.slo import Slos
from stallfree.tune.trial import TrialSpec

BASE = TrialSpec.of(
    CostChoice(kind="full", model="llama-3-8b", hardware="a100-80gb"),
    ServingConfig(max_num_batched_tokens=512),
    lengths="fixed:200,100",
    num_requests=50,
)
DRAFTS = Speculation(Acceptance((0.7, 0.5)))


def _drafted(spec: TrialSpec, k: int = 2, draft: str = "ngram") -> TrialSpec:
    serving = dataclasses.replace(spec.serving, num_speculative_tokens=k)
    return spec.with_deployment(serving=serving, speculation=dataclasses.replace(DRAFTS, draft=draft))


def test_chunked_gets_a_search_per_budget_and_draft_length_the_baseline_one_per_budget() -> None:
    config = TuneConfig(
        base=BASE,
        policies=("chunked", "prefill-first"),
        budgets=(256, 512),
        slos=Slos.from_mapping({"tbt_p99_ms": 100}),
        qps_start=1.0,
        speculative_tokens=(0, 2),
        speculation=DRAFTS,
    )
    shapes = sorted(
        (s.serving.policy, s.token_budget, s.serving.num_speculative_tokens) for s, _ in tune_searches(config)
    )
    assert shapes == [
        ("chunked", 256, 0),
        ("chunked", 256, 2),
        ("chunked", 512, 0),
        ("chunked", 512, 2),
        ("prefill-first", 256, 0),
        ("prefill-first", 512, 0),
    ]
    with pytest.raises(ValueError, match="acceptance rates"):
        TuneConfig(
            base=BASE,
            policies=("chunked",),
            budgets=(256,),
            slos=config.slos,
            speculative_tokens=(2,),
        )


def test_drafts_go_with_a_draft_length_and_name_the_trial() -> None:
    with pytest.raises(ValueError, match="needs an acceptance rate"):
        BASE.with_serving(256, num_speculative_tokens=2)
    with pytest.raises(ValueError, match="applies with num_speculative_tokens"):
        BASE.with_deployment(speculation=DRAFTS)
    drafted = _drafted(BASE)
    assert drafted.key() != BASE.key()
    assert drafted.key() != _drafted(BASE, draft="eagle").key() != _drafted(BASE, k=3).key()


def test_launch_lines_say_the_drafts_for_the_framework_whose_rule_was_simulated() -> None:
    vllm = serve_commands("llama-3-8b", 1, 512, 64, speculative=(3, "vllm"))
    assert list(vllm) == ["vllm"]
    config = vllm["vllm"].split("--speculative-config ", 1)[1].strip("'")
    assert json.loads(config) == {"method": "ngram", "num_speculative_tokens": 3}
    sglang = serve_commands("llama-3-8b", 1, 512, 64, speculative=(3, "sglang"))
    assert list(sglang) == ["sglang"]
    assert "--speculative-algorithm NGRAM --speculative-num-draft-tokens 4" in sglang["sglang"]


def test_tune_cli_tries_draft_lengths(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "tune",
        "--model",
        "llama-3-8b",
        "--hardware",
        "a100-80gb",
        "--policy",
        "chunked",
        "--budgets",
        "512",
    ]
    argv += ["--speculative-tokens", "0,3", "--acceptance-rate", "0.8", "--num-requests", "60", "--json"]
    argv += ["--lengths", "fixed:300,120", "--backend", "local", "--workers", "1", "--slo-tpot-p50-ms", "6"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    curve = out["policies"]["chunked"]["curve"]
    assert [p["num_speculative_tokens"] for p in curve] == [0, 3]
    assert out["speculative"]["acceptance_rates"] == pytest.approx([0.8, 0.64, 0.512])
    # A TPOT below one decode step: only drafts (2.95 tokens a verify step at 80%) meet it.
    assert curve[0]["capacity_qps"] == 0 < curve[1]["capacity_qps"]
    assert out["policies"]["chunked"]["best_speculative_tokens"] == 3
    assert '"num_speculative_tokens": 3' in out["policies"]["chunked"]["commands"]["vllm"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--speculative-tokens", "0,2"], "needs --acceptance-rate"),
        (["--acceptance-rate", "0.5"], "applies with --speculative-tokens"),
        (["--speculative-tokens", "2,2", "--acceptance-rate", "0.5"], "listed twice"),
        (["--speculative-tokens", "x", "--acceptance-rate", "0.5"], "--speculative-tokens"),
        (["--speculative-tokens", "2", "--acceptance-rate", "0.5", "--router", "round-robin"], "one-replica"),
    ],
)
def test_bad_draft_flags_are_one_line(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tune", *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err


def test_launch_lines_name_the_drafter() -> None:
    vllm = serve_commands("llama-3.1-70b", 4, 512, 64, speculative=(3, "vllm"), draft="model:llama-3-8b")
    config = json.loads(vllm["vllm"].split("--speculative-config ", 1)[1].strip("'"))
    assert config == {
        "method": "draft_model",
        "model": "meta-llama/Meta-Llama-3-8B",
        "num_speculative_tokens": 3,
    }
    eagle = serve_commands("llama-3.1-70b", 4, 512, 64, speculative=(3, "sglang"), draft="eagle")["sglang"]
    assert "--speculative-algorithm EAGLE --speculative-draft-model-path PATH/TO/EAGLE-HEAD" in eagle
    assert "--speculative-num-steps 3" in eagle and "--speculative-num-draft-tokens 4" in eagle
