"""``--device`` that torch cannot use: one line and exit 2 before any model loads."""

from __future__ import annotations

import pytest
import torch

from stallfree.cli import main


@pytest.mark.parametrize(
    "command", [["generate", "--prompt", "hi"], ["serve", "--port", "0"], ["explain", "--engine", "torch"]]
)
@pytest.mark.parametrize("device", ["tpu", "cuda", "cuda:7"])
def test_unusable_device_is_one_line_exit_2(
    command: list[str], device: str, capsys: pytest.CaptureFixture[str]
) -> None:
    if device.startswith("cuda") and torch.cuda.is_available() and torch.cuda.device_count() > 7:
        pytest.skip("this machine has that CUDA device")
    assert main([*command, "--model", "random:tiny", "--device", device]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--device {device}:" in err and "Traceback" not in err
