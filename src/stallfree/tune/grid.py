"""The YAML grid of ``stallfree sweep``: parsed and checked into a frozen :class:`Grid`.

Every field is checked here, before anything runs, and a bad one is named in a one-line
``ValueError`` (``grid.yaml: field 'tp': ...``). A list field also takes a single value.
Example::

    models: [mistral-7b]            # presets or HF config.json paths
    hardware: [a100-80gb]
    tp: [1]                         # default [1]
    policies: [chunked, prefill-first]
    budgets: [256, 512, 1024]       # or auto (powers of two + ridge multiples, per model/hardware/TP)
    max_num_seqs: 256               # at most, fewer under a smaller chunked budget
    workload: {lengths: sharegpt, arrival: poisson, num_requests: 1000, seed: 0}
    cost_model: auto                # default; or full, weights-only, measured (+ profile: FILE)
    qps: [0.5, 1, 2]                # fixed-rate trials, and/or:
    capacity: {slos: {tbt_p99_ms: 100, sched_delay_p50_s: 2}, precision: 0.05}
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from stallfree.core.policy import POLICIES
from stallfree.costs.roofline import COST_MODEL_KINDS, cost_model_kind
from stallfree.tune.slo import Slos
from stallfree.tune.trial import ARRIVALS

_FIELDS = (
    "models",
    "hardware",
    "tp",
    "policies",
    "budgets",
    "max_num_seqs",
    "workload",
    "cost_model",
    "profile",
    "gpu_memory_utilization",
    "qps",
    "capacity",
)
_WORKLOAD_FIELDS = ("lengths", "arrival", "burstiness", "num_requests", "seed")
_CAPACITY_FIELDS = ("slos", "precision", "qps_start")


@dataclass(frozen=True, slots=True)
class CapacityGrid:
    slos: Slos
    precision: float = 0.05
    qps_start: float | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class Grid:
    models: tuple[str, ...]
    hardware: tuple[str, ...]
    tp: tuple[int, ...]
    policies: tuple[str, ...]
    budgets: tuple[int, ...] | None  # None: auto
    max_num_seqs: int
    lengths: str
    arrival: str
    burstiness: float
    num_requests: int
    seed: int
    cost_model: str  # a roofline kind, measured (GPU tables), measured:<profile>, or auto (per hardware)
    gpu_memory_utilization: float
    qps: tuple[float, ...]
    capacity: CapacityGrid | None


def load_grid(path: str | Path) -> Grid:
    """Read and check a grid file; every problem is one ``ValueError`` naming the field."""
    import yaml

    where = str(path)
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise ValueError(f"cannot read grid {where}: {error.strerror or error}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ValueError(f"{where}: not valid YAML{at}") from None
    return parse_grid(data, where)


def parse_grid(data: Any, where: str = "grid") -> Grid:
    if data is None or data == {}:
        raise ValueError(
            f"{where}: the grid is empty; it needs models, hardware, policies and qps or capacity"
        )
    if not isinstance(data, dict):
        raise ValueError(f"{where}: the grid must be a mapping of fields, got {type(data).__name__}")
    _check_known(data, _FIELDS, where, "field")
    workload = data.get("workload", {}) or {}
    if not isinstance(workload, dict):
        raise ValueError(f"{where}: field 'workload' must be a mapping of {', '.join(_WORKLOAD_FIELDS)}")
    _check_known(workload, _WORKLOAD_FIELDS, where, "field 'workload' has field")
    budgets_raw = data.get("budgets", "auto")
    grid = Grid(
        models=_strings(data, "models", where),
        hardware=_strings(data, "hardware", where),
        tp=_ints(data, "tp", where, default=[1]),
        policies=_strings(data, "policies", where),
        budgets=None if budgets_raw == "auto" else _ints({"budgets": budgets_raw}, "budgets", where),
        max_num_seqs=_int(data.get("max_num_seqs", 256), "max_num_seqs", where),
        lengths=_string(workload.get("lengths", "sharegpt"), "workload.lengths", where),
        arrival=_choice(workload.get("arrival", "poisson"), ARRIVALS, "workload.arrival", where),
        burstiness=_float(workload.get("burstiness", 1.0), "workload.burstiness", where),
        num_requests=_int(workload.get("num_requests", 1000), "workload.num_requests", where),
        seed=_int(workload.get("seed", 0), "workload.seed", where, minimum=0),
        cost_model=_cost_model(data, where),
        gpu_memory_utilization=_float(
            data.get("gpu_memory_utilization", 0.9), "gpu_memory_utilization", where
        ),
        qps=tuple(_float(q, "qps", where) for q in _list(data, "qps", where, default=[])),
        capacity=_capacity(data.get("capacity"), where),
    )
    for policy in grid.policies:
        if policy not in POLICIES:
            raise ValueError(
                f"{where}: field 'policies': unknown policy {policy!r}; choose from {', '.join(POLICIES)}"
            )
    if not grid.qps and grid.capacity is None:
        raise ValueError(f"{where}: give field 'qps' (fixed rates) or field 'capacity' (searches), or both")
    if not 0 < grid.gpu_memory_utilization <= 1:
        raise ValueError(f"{where}: field 'gpu_memory_utilization' must be in (0, 1]")
    return grid


def _capacity(raw: Any, where: str) -> CapacityGrid | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError(f"{where}: field 'capacity' must be a mapping of {', '.join(_CAPACITY_FIELDS)}")
    _check_known(raw, _CAPACITY_FIELDS, where, "field 'capacity' has field")
    slos_raw = raw.get("slos")
    if not isinstance(slos_raw, dict) or not slos_raw:
        raise ValueError(
            f"{where}: field 'capacity.slos' must map SLO names to limits, e.g. {{tbt_p99_ms: 100}}"
        )
    limits = {str(k): _float(v, f"capacity.slos.{k}", where) for k, v in slos_raw.items()}
    try:
        slos = Slos.from_mapping(limits)
    except ValueError as error:
        raise ValueError(f"{where}: field 'capacity.slos': {error}") from None
    precision = _float(raw.get("precision", 0.05), "capacity.precision", where)
    if precision >= 1:
        raise ValueError(f"{where}: field 'capacity.precision' must be below 1, got {precision}")
    start = raw.get("qps_start")
    return CapacityGrid(
        slos, precision, None if start is None else _float(start, "capacity.qps_start", where)
    )


def _check_known(data: dict[Any, Any], known: tuple[str, ...], where: str, what: str) -> None:
    for key in data:
        if key not in known:
            raise ValueError(f"{where}: unknown {what} {key!r} (known: {', '.join(known)})")


def _list(data: dict[str, Any], name: str, where: str, default: list[Any] | None = None) -> list[Any]:
    if name not in data:
        if default is None:
            raise ValueError(f"{where}: field '{name}' is missing")
        return default
    value = data[name]
    values = value if isinstance(value, list) else [value]
    if not values or value is None:
        raise ValueError(f"{where}: field '{name}' is empty")
    return values


def _strings(data: dict[str, Any], name: str, where: str) -> tuple[str, ...]:
    return tuple(_string(v, name, where) for v in _list(data, name, where))


def _ints(data: dict[str, Any], name: str, where: str, default: list[Any] | None = None) -> tuple[int, ...]:
    return tuple(_int(v, name, where) for v in _list(data, name, where, default))


def _string(value: Any, name: str, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: field '{name}' must be a non-empty string, got {value!r}")
    return value.strip()


def _int(value: Any, name: str, where: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{where}: field '{name}' must be a whole number >= {minimum}, got {value!r}")
    return value


def _float(value: Any, name: str, where: str) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and value > 0)
    ):
        raise ValueError(f"{where}: field '{name}' must be a positive number, got {value!r}")
    return float(value)


def _cost_model(data: dict[str, Any], where: str) -> str:
    """A roofline kind; ``measured`` with a ``profile`` file (``measured:<path>`` in the trial spec;
    a profile implies measured, as ``--profile`` does) or without one (a GPU preset's shipped tables,
    checked per hardware); or ``auto`` (the default), resolved per hardware by the sweep."""
    kind = cost_model_kind(_string(data.get("cost_model", "auto"), "cost_model", where))
    profile = data.get("profile")
    if profile is not None:
        return f"measured:{_string(profile, 'profile', where)}"
    return _choice(kind, (*COST_MODEL_KINDS, "measured", "auto"), "cost_model", where)


def _choice(value: Any, choices: tuple[str, ...], name: str, where: str) -> str:
    if value not in choices:
        raise ValueError(f"{where}: field '{name}' must be one of {', '.join(choices)}, got {value!r}")
    return str(value)
