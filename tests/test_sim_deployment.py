"""One Deployment value: checked once, kept as YAML, the same runs from a file as from flags."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import yaml

from stallfree.cli import main
from stallfree.core.serving import ServingConfig
from stallfree.costs import CostChoice
from stallfree.costs.kv_transfer import PoolShape
from stallfree.sim import Deployment, ReplicaGroup, Speculation
from stallfree.sim.disagg import Disaggregation
from stallfree.sim.speculative import Acceptance
from stallfree.tune.trial import TrialSpec
from tests.test_sim_driver import _deployed

MISTRAL = CostChoice(kind="full", model="mistral-7b", hardware="a100-80gb")
DRAFTS = Speculation(Acceptance((0.8, 0.6)), "eagle")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"replicas": 0}, "replicas must be positive"),
        ({"router": "random"}, "unknown router"),
        ({"gpu_memory_utilization": 1.5}, "gpu_memory_utilization"),
        ({"route_delay_ms": -1.0}, "route_delay_ms"),
        ({"replicas": 2, "fleet": (ReplicaGroup(1, "h100-sxm"),)}, "replicas or a fleet"),
        ({"serving": ServingConfig(num_speculative_tokens=2)}, "needs an acceptance rate"),
        ({"speculation": DRAFTS}, "applies with num_speculative_tokens"),
        ({"disaggregate": Disaggregation(PoolShape(1, 1)), "replicas": 2}, "its pools"),
        (
            {
                "disaggregate": Disaggregation(PoolShape(1, 1)),
                "serving": ServingConfig(policy="prefill-first"),
            },
            "chunked",
        ),
    ],
)
def test_a_deployment_that_cannot_run_is_refused_when_made(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Deployment(**fields)  # type: ignore[arg-type]


def test_replica_groups_parse_and_print_as_the_flag_says() -> None:
    groups = ReplicaGroup.parse_fleet("4xh100-sxm:tp2, 2xa100-80gb")
    assert groups == (ReplicaGroup(4, "h100-sxm", 2), ReplicaGroup(2, "a100-80gb", 1))
    assert ",".join(map(str, groups)) == "4xh100-sxm:tp2,2xa100-80gb"
    assert Deployment(fleet=groups).num_replicas == 6 and Deployment(fleet=groups).num_gpus == 10
    for bad in ("4h100", "0xh100-sxm", "2xh100-sxm:tp0", ""):
        with pytest.raises(ValueError):
            ReplicaGroup.parse_fleet(bad)


@pytest.mark.parametrize("name", sorted(_deployed()))
def test_every_part_survives_a_trip_through_yaml(name: str) -> None:
    deployment = _deployed()[name][2]
    text = yaml.safe_dump(deployment.to_dict(), sort_keys=False)
    assert Deployment.from_dict(yaml.safe_load(text)) == deployment


def test_a_file_missing_parts_takes_their_defaults_and_unknown_keys_are_refused() -> None:
    assert Deployment.from_dict({}) == Deployment()
    assert Deployment.from_dict({"serving": {"max_num_batched_tokens": 256}, "replicas": 3}) == Deployment(
        serving=ServingConfig(max_num_batched_tokens=256), replicas=3
    )
    for data, message in (
        ({"replica": 2}, "unknown setting"),
        ({"serving": {"budget": 2}}, "deployment serving: unknown setting"),
        ({"costs": "h100"}, "expected a mapping"),
        ({"disaggregate": {"kv_link": "ib-400"}}, "pools as xPyD"),
        ({"speculation": {"acceptance_rates": "0.7"}}, "list of numbers"),
        ({"serving": {"max_num_seqs": "many"}}, "deployment"),
    ):
        with pytest.raises(ValueError, match=message):
            Deployment.from_dict(data)


def test_trial_keys_are_those_of_the_trials_before_deployments() -> None:
    """Written by commit 8a4c512 (TrialSpec's flat fields), so a resumed sweep finds its trials."""
    serving = ServingConfig(max_num_batched_tokens=512)
    spec = TrialSpec.of(MISTRAL, serving)
    drafted = spec.with_deployment(
        serving=dataclasses.replace(serving, num_speculative_tokens=2),
        speculation=Speculation(Acceptance((0.8, 0.6)), "eagle"),
    )
    pools = Disaggregation(PoolShape(1, 2, 2, 1), "ib-400", 2048)
    keys = {
        "plain": TrialSpec.of(MISTRAL).key(),
        "budget": dataclasses.replace(spec, qps=3.5, lengths="arxiv").key(),
        "fleet": spec.with_deployment(replicas=4, router="cache-aware", route_delay_ms=2.0).key(),
        "spec": drafted.key(),
        "disagg": spec.with_deployment(costs=dataclasses.replace(MISTRAL, tp=2), disaggregate=pools).key(),
    }
    assert keys == {
        "plain": "ff8b207fa1397690",
        "budget": "df010d304032e917",
        "fleet": "c3af0f3a74ec3e41",
        "spec": "361f41e02c5c699d",
        "disagg": "b0925a225ea9b733",
    }


FLAGS = ["--num-requests", "60", "--cost-model", "full", "--json", "--lengths", "fixed:400,40", "--qps", "8"]


def _simulate(argv: list[str], capsys: pytest.CaptureFixture[str]) -> dict[str, object]:
    assert main(["simulate", *argv, *FLAGS]) == 0
    out = json.loads(capsys.readouterr().out)
    for summary in out["policies"].values():
        del summary["sim_wall_s"]
    return out


@pytest.mark.parametrize(
    "deployment",
    [
        ["--replicas", "3", "--router", "least-requests", "--token-budget", "256", "--route-delay-ms", "2"],
        ["--fleet", "1xh100-sxm:tp2,2xa100-80gb", "--router", "power-of-two"],
        ["--disaggregate", "1P2D", "--kv-link", "roce-200", "--prefill-token-budget", "1024", "--tp", "2"],
        ["--speculative-tokens", "3", "--acceptance-rate", "0.7", "--draft", "eagle", "--dtype", "fp8"],
        ["--autoscale", "keda:running=6", "--min-replicas", "2", "--max-replicas", "5", "--startup-s", "3"],
    ],
)
def test_a_deployment_written_runs_again_from_its_file(
    deployment: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "deployment.yaml"
    by_flags = _simulate([*deployment, "--deployment-out", str(path)], capsys)
    by_file = _simulate(["--deployment", str(path)], capsys)
    assert by_file == by_flags


def test_a_flag_beside_the_file_wins(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "d.yaml"
    path.write_text(yaml.safe_dump(Deployment(costs=MISTRAL, replicas=2).to_dict()))
    out = _simulate(["--deployment", str(path), "--replicas", "3"], capsys)
    assert out["scenario"]["model"] == "mistral-7b" and out["scenario"]["replicas"] == 3  # type: ignore[index]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("replicas: [", "not YAML"),
        ("replica: 2\n", "unknown setting(s) replica"),
        ("router: random\n", "unknown router"),
    ],
)
def test_a_bad_file_is_one_line(
    text: str, message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    assert main(["simulate", "--deployment", str(path), "--num-requests", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and message in err, err
    assert main(["simulate", "--deployment", str(tmp_path / "missing.yaml")]) == 2
    assert "No such file" in capsys.readouterr().err


def test_tune_writes_its_answer_as_a_deployment_simulate_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "best.yaml"
    argv = ["tune", "--model", "mistral-7b", "--cost-model", "full", "--budgets", "256,512", "--json"]
    argv += [
        "--num-requests",
        "60",
        "--lengths",
        "fixed:400,40",
        "--workers",
        "1",
        "--deployment-out",
        str(path),
    ]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    best = Deployment.from_dict(yaml.safe_load(path.read_text()))
    chunked = out["policies"]["chunked"]
    assert out["deployment"] == best.to_dict()
    assert (best.serving.policy, best.serving.max_num_batched_tokens) == ("chunked", chunked["best_budget"])
    assert best.costs.model == "mistral-7b" and best.serving.max_num_seqs == chunked["max_num_seqs"]
    ran = _simulate(["--deployment", str(path)], capsys)
    assert list(ran["policies"]) == ["chunked"]
    assert ran["scenario"]["token_budget"] == chunked["best_budget"]  # type: ignore[index]
