"""Hardware specs: the roofline numbers of one accelerator, from presets or a JSON file.

Owns :class:`HardwareSpec` and :func:`load_hardware_spec`. Every figure is per GPU; tensor
parallelism multiplies them in the cost model, never here.

Invariants: every field is a positive finite number (latency may be zero).

Conventions: ``peak_flops_per_s`` is dense (no structured sparsity) BF16 tensor-core
throughput; bandwidths are decimal (1 TB/s = 1e12 B/s); ``mem_capacity_bytes`` is binary,
because vendors' "80 GB" of HBM is what ``nvidia-smi``/``rocm-smi`` report as ~80 GiB;
``interconnect_bandwidth_bytes_per_s`` is one GPU's unidirectional GPU-to-GPU bandwidth
(half the bidirectional datasheet figure: NVLink, Infinity Fabric, or PCIe when there is no
NVLink); ``interconnect_latency_s`` is a per-collective launch/sync latency estimate, not a
datasheet number.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, fields
from pathlib import Path

_GIB = float(2**30)
_MIB = float(2**20)
_TB = 1e12
_GB = 1e9


@dataclass(frozen=True, slots=True)
class HardwareSpec:
    """One accelerator's roofline: compute peak, memory bandwidth and size, interconnect."""

    name: str
    peak_flops_per_s: float
    mem_bandwidth_bytes_per_s: float
    mem_capacity_bytes: float
    interconnect_bandwidth_bytes_per_s: float
    interconnect_latency_s: float = 0.0

    def __post_init__(self) -> None:
        bad = [
            f.name
            for f in fields(self)
            if f.name not in ("name", "interconnect_latency_s") and not _is_positive(getattr(self, f.name))
        ]
        if not (_is_positive(self.interconnect_latency_s) or self.interconnect_latency_s == 0):
            bad.append("interconnect_latency_s")
        if bad:
            raise ValueError(f"hardware {self.name}: {', '.join(bad)} must be positive numbers")

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity at which compute and memory time are equal."""
        return self.peak_flops_per_s / self.mem_bandwidth_bytes_per_s


def _is_positive(value: object) -> bool:
    return (
        isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
    )


# Datasheet sources (checked against the vendor pages):
# - A100: NVIDIA A100 Tensor Core GPU datasheet: BF16 312 TFLOPS (624 sparse); 40GB HBM2 1,555 GB/s;
#   80GB HBM2e 2,039 GB/s (SXM); NVLink 600 GB/s bidirectional.
# - H100 SXM: NVIDIA H100 datasheet: BF16 1,979 TFLOPS *with sparsity* -> 989 dense; 80GB HBM3
#   3.35 TB/s; NVLink 900 GB/s bidirectional.
# - H200 SXM: NVIDIA H200 datasheet: BF16 989 TFLOPS dense; 141GB HBM3e 4.8 TB/s; NVLink 900 GB/s.
# - L40S: NVIDIA L40S datasheet: BF16 362.05 TFLOPS dense (733 sparse); 48GB GDDR6 864 GB/s;
#   no NVLink, PCIe Gen4 x16 64 GB/s bidirectional.
# - MI300X: AMD Instinct MI300X datasheet: BF16 1,307.4 TFLOPS dense; 192GB HBM3 5.3 TB/s;
#   Infinity Fabric 7 links x 128 GB/s = 896 GB/s bidirectional peer bandwidth.
# - B200, B300, GB200, GB300, RTX PRO 6000 (server): the figures of aiconfigurator-core 0.12's system
#   files (memory as nvidia-smi reports it; BF16 dense; NVLink 5 1.8 TB/s bidirectional; the RTX
#   PRO 6000 on PCIe Gen5 x16), which its measured tables were taken on.
HARDWARE_PRESETS: dict[str, HardwareSpec] = {
    spec.name: spec
    for spec in (
        HardwareSpec("a100-40gb", 312e12, 1.555 * _TB, 40 * _GIB, 300 * _GB, 10e-6),
        HardwareSpec("a100-80gb", 312e12, 2.039 * _TB, 80 * _GIB, 300 * _GB, 10e-6),
        HardwareSpec("h100-sxm", 989e12, 3.35 * _TB, 80 * _GIB, 450 * _GB, 8e-6),
        HardwareSpec("h200-sxm", 989e12, 4.8 * _TB, 141 * _GIB, 450 * _GB, 8e-6),
        HardwareSpec("b200-sxm", 2250e12, 7.7 * _TB, 180 * _GIB, 900 * _GB, 8e-6),
        HardwareSpec("b300-sxm", 2250e12, 7.75 * _TB, 275040 * _MIB, 900 * _GB, 8e-6),
        HardwareSpec("gb200", 2500e12, 8.0 * _TB, 189471 * _MIB, 900 * _GB, 8e-6),
        HardwareSpec("gb300", 2500e12, 8.0 * _TB, 284208 * _MIB, 900 * _GB, 8e-6),
        HardwareSpec("l40s", 362.05e12, 0.864 * _TB, 48 * _GIB, 32 * _GB, 20e-6),
        HardwareSpec("rtx-pro-6000", 467.8e12, 1.792 * _TB, 97887 * _MIB, 64 * _GB, 20e-6),
        HardwareSpec("mi300x", 1307.4e12, 5.3 * _TB, 192 * _GIB, 448 * _GB, 10e-6),
    )
}
HARDWARE_ALIASES = {"h200": "h200-sxm"}


def load_hardware_spec(name_or_path: str) -> HardwareSpec:
    """A preset name or a JSON file with :class:`HardwareSpec`'s field names."""
    name = HARDWARE_ALIASES.get(name_or_path, name_or_path)
    if name in HARDWARE_PRESETS:
        return HARDWARE_PRESETS[name]
    path = Path(name_or_path)
    if path.suffix != ".json" and not path.exists():
        raise ValueError(f"unknown hardware {name_or_path!r}; presets: {', '.join(HARDWARE_PRESETS)}")
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"hardware spec not found: {path}") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read hardware spec {path}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"hardware spec {path} is not a JSON object")
    return hardware_spec_from_dict(data, default_name=path.stem)


def hardware_spec_from_dict(data: dict[str, object], default_name: str = "custom") -> HardwareSpec:
    """Validate a JSON-style dict; missing, unknown or non-numeric fields are named in one line."""
    known = {f.name for f in fields(HardwareSpec)}
    required = known - {"name", "interconnect_latency_s"}
    name = data.get("name", default_name)
    problems = [f"missing {key}" for key in sorted(required - data.keys())]
    problems += [f"unknown field {key}" for key in sorted(data.keys() - known)]
    numbers: dict[str, float] = {}
    for key in sorted(known & data.keys() - {"name"}):
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            problems.append(f"{key} is not a number")
        else:
            numbers[key] = float(value)
    if not isinstance(name, str):
        problems.append("name is not a string")
    if problems:
        raise ValueError(f"hardware spec {default_name}: {'; '.join(problems)}")
    return HardwareSpec(name=str(name), **numbers)
