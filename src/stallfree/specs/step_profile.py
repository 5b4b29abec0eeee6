"""The step-profile file: real step costs measured on one machine, read by the measured cost model.

``stallfree profile`` (:mod:`stallfree.engine.step_timing`) writes it; the simulator's measured
cost model (:mod:`stallfree.costs.measured`) reads it. This module owns the schema only (stdlib,
no numpy, no torch), so both sides agree on one definition.

Schema ``stallfree-step-profile`` version 1, one JSON object:

``fingerprint``  where it was measured: ``model`` (as given), ``model_name``, ``dtype``,
                 ``dtype_bytes``, ``device``, ``device_name`` (CPU model or GPU name),
                 ``threads``, ``torch``, ``stallfree``, ``date`` (UTC, ISO 8601), ``hostname``.
                 ``kind`` (:data:`FINGERPRINT_KINDS`; absent: ``engine``): ``server`` for a
                 black-box profile of a running server (:mod:`stallfree.bench.profile`), which
                 has ``base_url``, ``server`` and ``server_version`` (where it says), the
                 ``scheduler`` settings as the user gave them and ``device`` ``"server"``
                 instead of dtype, threads and torch; its steps are full server steps (no
                 sampling, linear or overhead points) and its ``model`` dims are zeros unless a
                 model config was given.
``model``        the model's dimensions (:data:`MODEL_FIELDS`), so a reader needs no spec.
``model_config`` the model's ``config.json`` dict (:meth:`ModelSpec.to_hf_config`), so the
                 simulator can rebuild the exact spec (``random:`` models have no file).
``settings``     ``block_size``, ``num_blocks``, ``max_num_seqs``, ``repeats``, ``quick``,
                 ``busy_fraction`` (the share of the machine's CPU other processes may use
                 before a point is re-measured), ``max_attempts``, ``elapsed_s``,
                 ``num_busy_points``; the reference steps timed throughout (:data:`REFERENCES`:
                 ``reference_step_s``, a decode batch, and ``reference_prompt_step_s``, a
                 prompt; older profiles have the first only), ``reference_drift`` and
                 ``reference_prompt_drift`` (slowest / fastest - 1), ``drift_scale_range`` (the
                 factors the points' times were multiplied by; ``[1, 1]``: not corrected).
``steps``        forward passes of synthetic plans (no sampling): each describes its plan as
                 ``decode_contexts`` (cached tokens of each decoding sequence before its
                 token) and ``chunks`` (``[num_tokens, num_computed_tokens, samples]`` per
                 prompt chunk), with a ``kind`` label (``decode``, ``prefill``, ``mixed``;
                 ``cached``: a server's first step after a prefix-cache hit).
``sampling``     the sampler alone: ``mode`` (``greedy``, ``temperature``, ``top-p``) x ``rows``.
``linear``       the model's linear layers alone (every decoder layer's matmuls, no LM head)
                 at ``num_tokens`` rows: what weight streaming and matmul FLOP/s achieve.
``overhead``     real engine steps (pure decodes, greedy): ``rows`` sequences, the wall time
                 of ``LLMEngine.step`` minus its executor (scheduling, bookkeeping, detokenising).

Every measured entry carries :data:`STAT_FIELDS`: ``median_s``, ``q1_s``, ``q3_s``, ``iqr_s``,
``times_s`` (every repeat), ``other_cpu_s`` (CPU seconds other processes used while it ran, from
``/proc/stat`` minus our own process times; null where unreadable), ``wall_s``, ``attempts``
and ``busy`` (still busy after the last attempt).
Invariant: :func:`profile_from_dict` accepts exactly what :func:`profile_to_dict` writes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from stallfree.specs.model import ModelSpec

SCHEMA = "stallfree-step-profile"
VERSION = 1
SAMPLING_MODES = ("greedy", "temperature", "top-p")
# "cached": a server's prompt sent again with n more tokens (its first step after a prefix-cache
# hit): vLLM-CPU takes longer over that step than over a later chunk after the same context, so
# the measured model fits it a term of its own (fitted as one term, the long prompt's chunks came
# out 2.4x too dear)
STEP_KINDS = ("decode", "prefill", "mixed", "cached")
FINGERPRINT_KINDS = ("engine", "server")  # our engine in process; any server through its API
# settings key of each reference step's timings -> what it is
REFERENCES = {"reference_step_s": "decode", "reference_prompt_step_s": "prompt"}
MODEL_FIELDS = (
    "num_params",
    "num_non_embedding_params",
    "lm_head_params",
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "num_kv_heads",
    "head_dim",
    "intermediate_size",
    "vocab_size",
    "max_position_embeddings",
    "weight_bytes",
    "kv_bytes_per_token",
)
STAT_FIELDS = ("median_s", "q1_s", "q3_s", "iqr_s", "times_s", "other_cpu_s", "wall_s", "attempts", "busy")


@dataclass(frozen=True, slots=True)
class Stats:
    """Repeats of one measurement, robustly summarised."""

    times_s: tuple[float, ...]
    other_cpu_s: float | None = None
    wall_s: float = 0.0
    attempts: int = 1
    busy: bool = False

    def __post_init__(self) -> None:
        if not self.times_s or not all(math.isfinite(t) and t >= 0 for t in self.times_s):
            raise ValueError(f"times_s must be non-empty, finite and >= 0, got {self.times_s!r}")

    @property
    def median_s(self) -> float:
        return quantile(self.times_s, 0.5)

    @property
    def q1_s(self) -> float:
        return quantile(self.times_s, 0.25)

    @property
    def q3_s(self) -> float:
        return quantile(self.times_s, 0.75)

    @property
    def iqr_s(self) -> float:
        return self.q3_s - self.q1_s


@dataclass(frozen=True, slots=True)
class StepPoint:
    """One synthetic step's forward pass: decodes at ``decode_contexts`` + prompt ``chunks``.

    A chunk is ``(num_tokens, num_computed_tokens, samples)``.
    """

    kind: str
    decode_contexts: tuple[int, ...]
    chunks: tuple[tuple[int, int, bool], ...]
    stats: Stats

    def __post_init__(self) -> None:
        if self.kind not in STEP_KINDS:
            raise ValueError(f"step kind must be one of {', '.join(STEP_KINDS)}, got {self.kind!r}")
        if not self.decode_contexts and not self.chunks:
            raise ValueError("a step point needs a decode or a chunk")
        if any(c < 1 for c in self.decode_contexts):
            raise ValueError("a decode needs at least one cached token")
        if any(n < 1 or before < 0 for n, before, _ in self.chunks):
            raise ValueError("a chunk needs >= 1 token and >= 0 computed tokens")


@dataclass(frozen=True, slots=True)
class SamplingPoint:
    mode: str
    rows: int
    stats: Stats

    def __post_init__(self) -> None:
        if self.mode not in SAMPLING_MODES:
            raise ValueError(f"sampling mode must be one of {', '.join(SAMPLING_MODES)}, got {self.mode!r}")
        if self.rows < 1:
            raise ValueError(f"sampling rows must be positive, got {self.rows}")


@dataclass(frozen=True, slots=True)
class LinearPoint:
    num_tokens: int
    stats: Stats


@dataclass(frozen=True, slots=True)
class OverheadPoint:
    rows: int
    stats: Stats


@dataclass(frozen=True, slots=True)
class StepProfile:
    fingerprint: Mapping[str, Any]
    model: Mapping[str, int]
    settings: Mapping[str, Any]
    steps: tuple[StepPoint, ...]
    sampling: tuple[SamplingPoint, ...] = ()
    linear: tuple[LinearPoint, ...] = ()
    overhead: tuple[OverheadPoint, ...] = field(default=())
    model_config: Mapping[str, Any] | None = None

    def __post_init__(self) -> None:
        missing = [name for name in MODEL_FIELDS if name not in self.model]
        if missing:
            raise ValueError(f"profile model lacks {', '.join(missing)}")
        if not self.steps:
            raise ValueError("a profile needs at least one step point")

    def describe(self) -> str:
        fp = self.fingerprint
        partial = ", partial" if self.settings.get("partial") else ""
        if fp.get("kind") == "server":
            server = " ".join(str(fp[key]) for key in ("server", "server_version") if fp.get(key))
            return f"{fp.get('model', '?')} at {fp.get('base_url', '?')} ({server or 'a server'}, {fp.get('date', '?')}){partial}"
        return (
            f"{fp.get('model', '?')} {fp.get('dtype', '?')} on {fp.get('device', '?')} "
            f"({fp.get('device_name', '?')}, {fp.get('threads', '?')} threads, torch {fp.get('torch', '?')}, "
            f"{fp.get('date', '?')})" + (", partial" if self.settings.get("partial") else "")
        )


def machine_label(fingerprint: Mapping[str, Any]) -> str:
    """Where a profile's steps ran, for a header: ``cpu (AMD EPYC, profiled)``."""
    return f"{fingerprint.get('device', '?')} ({fingerprint.get('device_name', '?')}, profiled)"


def quantile(values: Sequence[float], q: float) -> float:
    """numpy's default (linear) quantile, without numpy."""
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _stats_to_dict(stats: Stats) -> dict[str, Any]:
    return {
        "median_s": stats.median_s,
        "q1_s": stats.q1_s,
        "q3_s": stats.q3_s,
        "iqr_s": stats.iqr_s,
        "times_s": list(stats.times_s),
        "other_cpu_s": stats.other_cpu_s,
        "wall_s": stats.wall_s,
        "attempts": stats.attempts,
        "busy": stats.busy,
    }


def _stats_from_dict(data: Mapping[str, Any], where: str) -> Stats:
    try:
        other = data.get("other_cpu_s")
        return Stats(
            times_s=tuple(float(t) for t in data["times_s"]),
            other_cpu_s=None if other is None else float(other),
            wall_s=float(data.get("wall_s", 0.0)),
            attempts=int(data.get("attempts", 1)),
            busy=bool(data.get("busy", False)),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"profile {where}: bad measurement ({exc})") from None


def profile_to_dict(profile: StepProfile) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "version": VERSION,
        "fingerprint": dict(profile.fingerprint),
        "model": dict(profile.model),
        "model_config": None if profile.model_config is None else dict(profile.model_config),
        "settings": dict(profile.settings),
        "steps": [
            {
                "kind": p.kind,
                "decode_contexts": list(p.decode_contexts),
                "chunks": [list(c) for c in p.chunks],
                **_stats_to_dict(p.stats),
            }
            for p in profile.steps
        ],
        "sampling": [{"mode": p.mode, "rows": p.rows, **_stats_to_dict(p.stats)} for p in profile.sampling],
        "linear": [{"num_tokens": p.num_tokens, **_stats_to_dict(p.stats)} for p in profile.linear],
        "overhead": [{"rows": p.rows, **_stats_to_dict(p.stats)} for p in profile.overhead],
    }


def profile_from_dict(data: Mapping[str, Any]) -> StepProfile:
    if not isinstance(data, Mapping) or data.get("schema") != SCHEMA:
        raise ValueError(f"not a step profile (expected schema {SCHEMA!r})")
    if data.get("version") != VERSION:
        raise ValueError(
            f"step profile version {data.get('version')!r}; this stallfree reads version {VERSION}"
        )
    try:
        steps = tuple(
            StepPoint(
                kind=str(s["kind"]),
                decode_contexts=tuple(int(c) for c in s["decode_contexts"]),
                chunks=tuple((int(n), int(before), bool(samples)) for n, before, samples in s["chunks"]),
                stats=_stats_from_dict(s, f"step {i}"),
            )
            for i, s in enumerate(data["steps"])
        )
        sampling = tuple(
            SamplingPoint(str(s["mode"]), int(s["rows"]), _stats_from_dict(s, f"sampling {i}"))
            for i, s in enumerate(data.get("sampling", ()))
        )
        linear = tuple(
            LinearPoint(int(s["num_tokens"]), _stats_from_dict(s, f"linear {i}"))
            for i, s in enumerate(data.get("linear", ()))
        )
        overhead = tuple(
            OverheadPoint(int(s["rows"]), _stats_from_dict(s, f"overhead {i}"))
            for i, s in enumerate(data.get("overhead", ()))
        )
        return StepProfile(
            fingerprint=dict(data["fingerprint"]),
            model={name: int(data["model"][name]) for name in MODEL_FIELDS},
            settings=dict(data.get("settings", {})),
            steps=steps,
            sampling=sampling,
            linear=linear,
            overhead=overhead,
            model_config=None if data.get("model_config") is None else dict(data["model_config"]),
        )
    except (KeyError, TypeError) as exc:
        raise ValueError(f"malformed step profile: missing or bad field {exc}") from None


def save_profile(profile: StepProfile, path: str | Path) -> Path:
    target = Path(path)
    if target.parent != Path():
        target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(json.dumps(profile_to_dict(profile), indent=1) + "\n")
    return target


def load_profile(path: str | Path) -> StepProfile:
    source = Path(path)
    try:
        data = json.loads(source.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source}: not JSON ({exc})") from None
    try:
        return profile_from_dict(data)
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from None


def model_dims(spec: ModelSpec, dtype_bytes: int) -> dict[str, int]:
    """The profile's ``model`` entry for ``spec`` with weights and KV of ``dtype_bytes`` each."""
    dims = {
        name: getattr(spec, name)
        for name in MODEL_FIELDS
        if name not in ("weight_bytes", "kv_bytes_per_token")
    }
    return {
        **dims,
        "weight_bytes": spec.weight_bytes(dtype_bytes),
        "kv_bytes_per_token": spec.kv_bytes_per_token(dtype_bytes),
    }
