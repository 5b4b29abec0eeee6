"""A hardware JSON file is shown by its ``name``; weights are in GB (1e9 B) wherever a user reads them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from stallfree.cli import main

SPEC = {
    "name": "my-gpu",
    "peak_flops_per_s": 5e14,
    "mem_bandwidth_bytes_per_s": 3e12,
    "mem_capacity_bytes": 8.6e10,
    "interconnect_bandwidth_bytes_per_s": 3e11,
}


@pytest.fixture
def hardware_file(tmp_path: Path) -> str:
    path = tmp_path / "some-file-name.json"
    path.write_text(json.dumps(SPEC))
    return str(path)


@pytest.mark.parametrize(
    "argv",
    [
        ["simulate", "--model", "llama-3-8b", "--num-requests", "5"],
        ["simulate", "--model", "llama-3-8b", "--num-requests", "5", "--json"],
        ["explain", "--model", "llama-3-8b", "--tp", "1"],
        ["explain", "--model", "llama-3-8b", "--tp", "1", "--json"],
        ["specs", "--model", "llama-3-8b"],
    ],
)
def test_header_names_the_hardware_not_its_file(
    argv: list[str], hardware_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--hardware", hardware_file]) == 0
    out = capsys.readouterr().out
    assert "my-gpu" in out
    if "--json" in argv:
        scenario = json.loads(out).get("scenario", {})
        assert scenario.get("hardware") == "my-gpu"
    else:
        assert "some-file-name" not in out


def test_weights_are_the_same_gb_in_specs_and_in_the_does_not_fit_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["specs", "--model", "llama-3-70b", "--hardware", "a100-40gb"]) == 0
    specs_out = capsys.readouterr().out
    shown = re.search(r"weights \(bf16\)\s+([\d.]+) GB", specs_out)
    assert shown is not None
    assert main(["simulate", "--model", "llama-3-70b", "--hardware", "a100-40gb", "--num-requests", "5"]) == 2
    error = capsys.readouterr().err
    assert f"weights {shown.group(1)} GB" in error and "GiB" not in error
