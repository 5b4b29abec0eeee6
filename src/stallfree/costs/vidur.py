"""GPU cost model priced from Vidur's measured operator tables (shipped as package data).

Owns :class:`GpuMeasuredCostModel`, :func:`gpu_family` and :func:`load_gpu_table`. numpy only.

A step of ``T`` tokens (``S`` of them sampled, ``K`` query-key pairs, ``C`` earlier-context
tokens) on ``tp`` GPUs costs::

    layers x (linear(T) + other(T))     measured: the four linear layers and the norms, RoPE,
                                         activation and residual add of one decoder layer, median
                                         of Vidur's profile, interpolated log-log piecewise linear
                                         in T (a soft knee, no max()); past the last point
                                         (32K or 4K tokens) time grows in proportion to T
  + embedding(T)                         measured, once a step
  + LM head(S)                           roofline of the S sampled rows' vocab x hidden GEMM,
                                         divided by the table's achieved efficiency at S tokens
  + attention(K, C)                      MODELLED, FlashAttention-style (no table has it):
                                         max(4 x heads x head_dim x layers x K / (ATTENTION_FLOPS_
                                         EFFICIENCY x peak), KV bytes read and written /
                                         (ATTENTION_BANDWIDTH_EFFICIENCY x bandwidth))
  + 2 x layers x all_reduce(T x hidden x dtype bytes)   measured (tp > 1), by buffer size; the
                                         roofline's ring formula where no table has that tp
  + overhead_s                           a fixed per-step constant, DEFAULT_OVERHEAD_S = 0 unless
                                         given: Vidur's default (``skip_cpu_overhead_modeling``)
                                         leaves the CPU's scheduling and sampling out too

Which table: the shipped GPU family of the hardware preset (``a100-*`` -> a100, ``h100-*`` ->
h100, ``a40`` -> a40) and the model's layer shape (hidden, intermediate, heads, KV heads)
at this tp (phi-2's ungated MLP has a shape of its own); a shape match counts as measured whatever the model's name (Mistral-7B's layers are
Llama-3-8B's). With no match, the GPU's efficiency curve (measured / roofline time of the linear
layers by tokens per step) is taken from the table whose per-GPU layer weights are nearest in
log ratio, and applied to this model's roofline; :attr:`GpuMeasuredCostModel.source` says which.

Invariant: :meth:`steady_durations` equals :meth:`step_time_s` on the shifted plans, bit for bit.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from typing import Any

import numpy as np
import numpy.typing as npt

from stallfree.core.plan import StepPlan, synthetic_plan
from stallfree.costs.roofline import plan_sums
from stallfree.specs.hardware import HardwareSpec
from stallfree.specs.model import ModelSpec

GPU_FAMILIES = ("a100", "h100", "a40")
# FlashAttention-2's forward pass reaches 50-73% of A100 peak (Dao, 2023); 0.6 is the middle.
ATTENTION_FLOPS_EFFICIENCY = 0.6
# KV reads stream like weights do: Vidur's A100 table puts weight streaming at ~70% of datasheet.
ATTENTION_BANDWIDTH_EFFICIENCY = 0.7
DEFAULT_OVERHEAD_S = 0.0
DESCRIBE_TOKENS = (1, 64, 256, 512, 2048, 8192)  # tokens per step that describe() reports
SHORT_RUN_STEPS = 32  # steady_durations prices runs up to this many steps one by one, not with numpy
FloatArray = npt.NDArray[np.float64]


def gpu_family(hardware_name: str) -> str | None:
    """The shipped table for a hardware preset's name (``a100-80gb`` -> ``a100``), or None."""
    name = hardware_name.lower()
    for family in GPU_FAMILIES:
        if name == family or name.startswith(family + "-"):
            return family
    return None


@functools.cache
def load_gpu_table(family: str) -> dict[str, Any]:
    """The shipped table of one GPU family (``src/stallfree/data/gpu_profiles/<family>.json``)."""
    if family not in GPU_FAMILIES:
        raise ValueError(f"no GPU table for {family!r}; tables: {', '.join(GPU_FAMILIES)}")
    text = resources.files("stallfree").joinpath("data", "gpu_profiles", f"{family}.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


class _LogLog:
    """Piecewise-linear interpolation in (log x, log y); proportional to x past the last point."""

    def __init__(self, xs: list[float], ys: list[float]) -> None:
        if len(xs) != len(ys) or not xs or any(b <= a for a, b in itertools.pairwise(xs)):
            raise ValueError("a table needs increasing x and as many y")
        self.xs, self.ys = xs, ys
        self._lx: list[float] = np.log(np.asarray(xs, dtype=np.float64)).tolist()
        self._ly: list[float] = np.log(np.maximum(np.asarray(ys, dtype=np.float64), 1e-9)).tolist()

    def __call__(self, x: float) -> float:
        if x <= 0:
            return 0.0
        if x >= self.xs[-1]:
            return self.ys[-1] * x / self.xs[-1]
        if x <= self.xs[0]:
            return self.ys[0]
        # np.interp's arithmetic on one point, without its per-call cost (a few µs): the segment
        # lx[j] <= t < lx[j + 1], a point on a knot gives the knot's value.
        t, lx, ly = math.log(x), self._lx, self._ly
        j = bisect_right(lx, t) - 1
        if j >= len(lx) - 1:
            y = ly[-1]
        elif j < 0 or t == lx[j]:
            y = ly[max(j, 0)]
        else:
            y = (ly[j + 1] - ly[j]) / (lx[j + 1] - lx[j]) * (t - lx[j]) + ly[j]
        return float(np.exp(y))  # numpy's exp, as before (libm's may differ in the last bit)


@dataclass(frozen=True, slots=True)
class _Table:
    """One layer shape at one tp: per-layer linear + other ops, embedding, and the reference's
    roofline linear time (for the efficiency ratio)."""

    model: str
    layer: _LogLog
    linear: _LogLog
    embedding: _LogLog
    roofline_linear_s: Callable[[float], float]  # tokens -> s, the reference's linear layers here


def _layer_weights(hidden: int, intermediate: int, heads: int, kv_heads: int, gated: bool) -> int:
    head_dim = hidden // heads
    attn = hidden * (heads + 2 * kv_heads) * head_dim + heads * head_dim * hidden
    return attn + (3 if gated else 2) * hidden * intermediate


class GpuMeasuredCostModel:
    """Step durations of ``model`` on ``tp`` x ``hardware`` (a100, h100 or a40 family) from the
    shipped Vidur tables; attention modelled (see the module docstring); stateless after init."""

    def __init__(
        self,
        model: ModelSpec,
        hardware: HardwareSpec,
        tp: int = 1,
        dtype_bytes: int = 2,
        overhead_s: float = DEFAULT_OVERHEAD_S,
    ) -> None:
        family = gpu_family(hardware.name)
        if family is None:
            raise ValueError(
                f"no measured GPU table for hardware {hardware.name!r}; tables: a100-*, h100-*, a40 "
                "(or give a stallfree profile)"
            )
        if model.is_moe:
            raise ValueError(
                f"Vidur's tables are of dense models; {model.name} is a mixture of experts "
                '(aiconfigurator-core\'s tables price it: pip install "stallfree[gpu]")'
            )
        if model.num_attention_heads % tp:
            raise ValueError(f"tp={tp} does not divide {model.name}'s attention heads")
        if not (math.isfinite(overhead_s) and overhead_s >= 0):
            raise ValueError(f"overhead_s must be >= 0, got {overhead_s!r}")
        self.model, self.hardware, self.tp, self.dtype_bytes = model, hardware, tp, dtype_bytes
        self.family, self.overhead_s = family, overhead_s
        data = load_gpu_table(family)
        self._peak = hardware.peak_flops_per_s * tp
        self._bw = hardware.mem_bandwidth_bytes_per_s * tp
        shape = (model.hidden_size, model.intermediate_size, model.num_attention_heads, model.num_kv_heads)
        self._weights = model.num_non_embedding_params / model.num_layers  # one layer, all GPUs
        table, exact, ref_tp = self._pick(data, shape, tp)
        self._table = table
        self.measured = exact
        self.table_model = table.model  # the table's own model: this one's layer shape, or the nearest
        if exact:
            self.source = f"measured: Vidur's {family} table for {table.model} (same layer shape), tp={tp}"
        else:
            self.source = (
                f"derived: {family} efficiency curve (measured / roofline, by tokens per step) of "
                f"{table.model} at tp={ref_tp}, applied to {model.name}'s roofline"
            )
        nets = data.get("all_reduce", {})
        net = nets.get(str(tp)) if tp > 1 else None
        self._all_reduce = _LogLog(net["bytes"], net["ms"]) if net else None
        self.all_reduce_source = (
            "none (tp=1)"
            if tp == 1
            else f"measured: Vidur's {family} all-reduce, {tp} GPUs"
            if net
            else f"roofline ring all-reduce ({family} has no {tp}-GPU table)"
        )
        self._flops_per_key = model.attention_flops_per_key
        self._kv_bytes_per_token = model.kv_bytes_per_token_on(tp, dtype_bytes)
        self._attn_peak = self._peak * ATTENTION_FLOPS_EFFICIENCY
        self._attn_bw = self._bw * ATTENTION_BANDWIDTH_EFFICIENCY
        self._lm_flops_per_row = 2.0 * model.lm_head_params
        self._lm_bytes = float(model.lm_head_params * dtype_bytes)
        self._fixed_cache: dict[tuple[int, int], float] = {}

    # -- table choice --------------------------------------------------------------------

    def _pick(
        self, data: dict[str, Any], shape: tuple[int, int, int, int], tp: int
    ) -> tuple[_Table, bool, int]:
        shapes: list[dict[str, Any]] = data["shapes"]
        for s in shapes:
            key = (s["hidden_size"], s["intermediate_size"], s["num_attention_heads"], s["num_kv_heads"])
            if key == shape and str(tp) in s["tp"]:
                return self._table_of(s, tp), True, tp
        candidates = [(s, tp) for s in shapes if str(tp) in s["tp"]] or [
            (s, 1) for s in shapes if "1" in s["tp"]
        ]
        if not candidates:
            raise ValueError(f"the {self.family} table has no entries")
        mine = self._weights / self.tp

        def distance(item: tuple[dict[str, Any], int]) -> float:
            s, t = item
            w = _layer_weights(
                s["hidden_size"],
                s["intermediate_size"],
                s["num_attention_heads"],
                s["num_kv_heads"],
                s["gated_mlp"],
            )
            return abs(math.log(w / t / mine))

        s, t = min(candidates, key=distance)
        return self._table_of(s, t), False, t

    def _table_of(self, s: dict[str, Any], tp: int) -> _Table:
        entry = s["tp"][str(tp)]
        xs = [float(x) for x in entry["tokens"]]
        layer = [(a + b) * 1e-3 for a, b in zip(entry["linear_ms"], entry["other_ms"], strict=True)]
        w = _layer_weights(
            s["hidden_size"],
            s["intermediate_size"],
            s["num_attention_heads"],
            s["num_kv_heads"],
            s["gated_mlp"],
        )
        peak = self.hardware.peak_flops_per_s * tp
        bw = self.hardware.mem_bandwidth_bytes_per_s * tp
        dtype = self.dtype_bytes

        def roofline(tokens: float) -> float:
            return max(2.0 * w * tokens / peak, w * dtype / bw)

        return _Table(
            model=s["model"],
            layer=_LogLog(xs, layer),
            linear=_LogLog(xs, [x * 1e-3 for x in entry["linear_ms"]]),
            embedding=_LogLog(xs, [x * 1e-3 for x in entry["embedding_ms"]]),
            roofline_linear_s=roofline,
        )

    # -- pieces --------------------------------------------------------------------------

    def _slowdown(self, tokens: float) -> float:
        """Measured / roofline time of the table's linear layers at ``tokens`` a step (>= 1)."""
        t = self._table
        return t.linear(tokens) / t.roofline_linear_s(tokens)

    def layer_s(self, num_tokens: int) -> float:
        """One decoder layer's linear layers and other measured ops (no attention)."""
        t = self._table
        if self.measured:
            return t.layer(num_tokens)
        ratio = t.layer(num_tokens) / t.roofline_linear_s(num_tokens)
        mine = max(2.0 * self._weights * num_tokens / self._peak, self._weights * self.dtype_bytes / self._bw)
        return mine * ratio

    def lm_head_s(self, num_samples: int) -> float:
        if num_samples == 0:
            return 0.0
        roofline = max(self._lm_flops_per_row * num_samples / self._peak, self._lm_bytes / self._bw)
        return roofline * self._slowdown(num_samples)

    def all_reduce_s(self, num_tokens: int) -> float:
        if self.tp == 1:
            return 0.0
        size = num_tokens * self.model.hidden_size * self.dtype_bytes
        if self._all_reduce is not None:
            one = self._all_reduce(size) * 1e-3
        else:
            hw = self.hardware
            ring = 2.0 * (self.tp - 1) / self.tp
            one = ring * size / hw.interconnect_bandwidth_bytes_per_s + hw.interconnect_latency_s
        return 2 * self.model.num_layers * one

    def _fixed_s(self, num_tokens: int, num_samples: int) -> float:
        """Everything but attention and the overhead: depends on tokens and samples only (cached)."""
        key = (num_tokens, num_samples)
        cached = self._fixed_cache.get(key)
        if cached is None:
            cached = (
                self.model.num_layers * self.layer_s(num_tokens)
                + self._table.embedding(num_tokens)
                + self.lm_head_s(num_samples)
                + self.all_reduce_s(num_tokens)
            )
            self._fixed_cache[key] = cached
        return cached

    # -- the cost-model interface ---------------------------------------------------------

    def step_time_s(self, plan: StepPlan) -> float:
        num_tokens, num_samples, num_keys, num_context, _ = plan_sums(plan)
        if num_tokens == 0:
            return 0.0
        attention = self._attention_s(num_keys, num_context + num_tokens)
        return self._fixed_s(num_tokens, num_samples) + attention + self.overhead_s

    def _attention_s(self, num_keys: int, num_kv: int) -> float:
        """A step's attention: ``num_keys`` query-key pairs, ``num_kv`` tokens of KV read or written."""
        return max(
            self._flops_per_key * num_keys / self._attn_peak,
            self._kv_bytes_per_token * num_kv / self._attn_bw,
        )

    def steady_durations(self, plan: StepPlan, num_steps: int) -> FloatArray:
        """Element ``j`` equals :meth:`step_time_s` of ``plan`` shifted by ``j`` steps, exactly.
        A short run (most are ~10 steps) is priced step by step: there numpy's cost a call (~1 µs,
        a dozen calls) outweighs its speed."""
        if num_steps < 0:
            raise ValueError(f"num_steps must be >= 0, got {num_steps}")
        num_tokens, num_samples, num_keys, num_context, square = plan_sums(plan)
        if num_tokens == 0:
            return np.zeros(num_steps)
        if num_steps <= SHORT_RUN_STEPS:  # step_time_s, step by step
            fixed = self._fixed_s(num_tokens, num_samples)
            return np.array(
                [
                    fixed
                    + self._attention_s(num_keys + square * j, num_context + num_tokens * (j + 1))
                    + self.overhead_s
                    for j in range(num_steps)
                ]
            )
        steps = np.arange(num_steps, dtype=np.int64)
        keys = num_keys + square * steps
        context = num_context + num_tokens * steps
        attention = np.maximum(
            self._flops_per_key * keys / self._attn_peak,
            self._kv_bytes_per_token * (context + num_tokens) / self._attn_bw,
        )
        durations: FloatArray = self._fixed_s(num_tokens, num_samples) + attention + self.overhead_s
        return durations

    # -- helpers for explain / tune -------------------------------------------------------

    def ridge_tokens(self) -> float:
        """The roofline's ridge (weights only), as :meth:`CostModel.ridge_tokens`."""
        return (self._weights * self.dtype_bytes / self._bw) / (2.0 * self._weights / self._peak)

    def decode_step_s(self, num_seqs: int, context_len: int) -> float:
        return self.step_time_s(synthetic_plan(num_seqs, context_len))

    def prefill_time_s(self, num_tokens: int) -> float:
        return self.step_time_s(synthetic_plan(0, 0, num_tokens))

    def describe(self) -> dict[str, Any]:
        """What is measured and what is modelled, and achieved figures by tokens per step (one
        prompt chunk of that many tokens, no earlier context), for ``stallfree specs``."""
        by_tokens: dict[str, dict[str, float]] = {}
        for n in DESCRIBE_TOKENS:
            step_s = self.prefill_time_s(n)
            by_tokens[str(n)] = {
                "layer_s": self.layer_s(n),
                "step_s": step_s,
                # linear-layer FLOPs over the whole step's time, per GPU (datasheet: peak_flops_per_s)
                "flops_per_s": 2.0 * self.model.num_non_embedding_params * n / step_s / self.tp,
                "table_efficiency": 1 / self._slowdown(n),
            }
        return {
            "cost_model": "measured",
            "source": f"Vidur's {self.family} operator tables (shipped)",
            "gpu_table": self.family,
            "table_model": self.table_model,
            "table_is_this_shape": self.measured,
            "linear_layers": self.source,
            "all_reduce": self.all_reduce_source,
            "attention": (
                f"modelled, FlashAttention-style: {ATTENTION_FLOPS_EFFICIENCY:.0%} of peak FLOP/s, "
                f"{ATTENTION_BANDWIDTH_EFFICIENCY:.0%} of bandwidth for KV reads/writes"
            ),
            "lm_head": "modelled: roofline / the table's efficiency at the sampled rows",
            "ridge": "the roofline's, weights only",
            "overhead_s": self.overhead_s,
            "by_tokens_per_step": by_tokens,
        }
