"""``--device`` checked before a model loads: one line and exit 2, never a torch traceback."""

from __future__ import annotations

from stallfree.cli.common import UsageError


def check_device(name: str | None) -> None:
    """Raise :class:`UsageError` unless torch can place tensors on ``name`` (None: the default)."""
    if name is None:
        return
    import torch

    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f"--device {name}: not a device torch knows; use cpu or cuda") from None
    if device.type == "cpu":
        return
    if device.type != "cuda":
        raise UsageError(f"--device {name}: the engine runs on cpu or cuda only")
    if torch.version.cuda is None:
        raise UsageError(
            f"--device {name}: this torch build ({torch.__version__}) has no CUDA; install a CUDA build of "
            "torch into the venv or use --device cpu"
        )
    if not torch.cuda.is_available():
        raise UsageError(f"--device {name}: no CUDA device is visible to torch")
    if device.index is not None and device.index >= torch.cuda.device_count():
        raise UsageError(f"--device {name}: only {torch.cuda.device_count()} CUDA device(s) are visible")
