"""Prometheus metrics of one server, in a registry of its own (several servers can share a process).

Latencies are measured on the engine thread at the moment a token is sampled, so they describe
the scheduler and the model, not how fast a client reads. The engine thread reports once per
step (:meth:`ServerMetrics.record_step`): per-token work there would hold the GIL the event loop
needs, so histograms are plain bucket counts behind one lock taken once per step and once per
scrape. Names and meanings follow vLLM's, under ``stallfree:`` (a virtual replica, which stands
in for a vLLM server, uses ``vllm:`` itself, so dashboards and autoscaling rules read it as one;
its own ``stallfree:virtual_step_late_seconds`` says how late its steps end against their price).
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.metrics_core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from stallfree.core import StepPlan

if TYPE_CHECKING:
    from stallfree.server.virtual import TrackingError

_LATENCY_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
    0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip


class _StepHistogram(Collector):
    """A histogram fed a step's values at a time; ``le`` buckets as Prometheus defines them."""

    def __init__(self, name: str, doc: str, model_name: str, bounds_s: Sequence[float]) -> None:
        self._name, self._doc, self._model_name = name, doc, model_name
        self._bounds_s = tuple(bounds_s)
        self._counts = [0] * (len(self._bounds_s) + 1)  # the last one is +Inf
        self._sum_s = 0.0
        self._lock = threading.Lock()

    def observe_many(self, values_s: Sequence[float]) -> None:
        if not values_s:
            return
        slots = [bisect.bisect_left(self._bounds_s, v) for v in values_s]
        total_s = sum(values_s)
        with self._lock:
            for slot in slots:
                self._counts[slot] += 1
            self._sum_s += total_s

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            counts, sum_s = list(self._counts), self._sum_s
        family = HistogramMetricFamily(self._name, self._doc, labels=["model_name"])
        family.add_metric([self._model_name], _cumulative(self._bounds_s, counts), sum_s)
        yield family


def _cumulative(bounds_s: Sequence[float], counts: Sequence[int]) -> list[tuple[str, float]]:
    """``le`` buckets (cumulative counts, ``+Inf`` last) from per-bucket counts."""
    cumulative, buckets = 0, []
    for bound, count in zip((*(str(b) for b in bounds_s), "+Inf"), counts, strict=True):
        cumulative += count
        buckets.append((bound, float(cumulative)))
    return buckets


class _StepLateness(Collector):
    """A virtual replica's step lateness, read from its :class:`TrackingError` at each scrape: the
    histogram ``stallfree:virtual_step_late_seconds`` and the worst, ``..._max_seconds``."""

    def __init__(self, tracking: TrackingError, bounds_s: Sequence[float], model_name: str) -> None:
        self._tracking, self._bounds_s, self._model_name = tracking, tuple(bounds_s), model_name

    def collect(self) -> Iterator[Metric]:
        tracking = self._tracking
        counts, sum_s, max_s = list(tracking.bucket_counts), tracking.total_late_s, tracking.max_late_s
        family = HistogramMetricFamily(
            "stallfree:virtual_step_late_seconds",
            "How late a virtual replica's steps ended against their priced end.",
            labels=["model_name"],
        )
        family.add_metric([self._model_name], _cumulative(self._bounds_s, counts), sum_s)
        yield family
        worst = GaugeMetricFamily(
            "stallfree:virtual_step_late_max_seconds",
            "The latest a virtual replica's step has ended against its priced end.",
            labels=["model_name"],
        )
        worst.add_metric([self._model_name], max_s)
        yield worst


class ServerMetrics:
    """Counters, gauges and histograms; every method is safe to call from any thread."""

    def __init__(self, model_name: str, prefix: str = "stallfree") -> None:
        self.registry = CollectorRegistry()
        labels = ("model_name",)

        def gauge(name: str, doc: str) -> Gauge:  # this model's child
            return Gauge(f"{prefix}:{name}", doc, labels, registry=self.registry).labels(model_name)

        def counter(name: str, doc: str) -> Counter:  # this model's child
            return Counter(f"{prefix}:{name}", doc, labels, registry=self.registry).labels(model_name)

        def histogram(name: str, doc: str) -> _StepHistogram:
            collector = _StepHistogram(f"{prefix}:{name}", doc, model_name, _LATENCY_BUCKETS_S)
            self.registry.register(collector)
            return collector

        self.num_requests_running = gauge("num_requests_running", "Requests in the running batch.")
        self.num_requests_waiting = gauge("num_requests_waiting", "Requests queued for admission.")
        self.kv_cache_usage = gauge("kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0-1).")
        self.kv_cache_used_blocks = gauge("kv_cache_used_blocks", "KV-cache blocks held by requests.")
        # What NVIDIA Dynamo's planner reads from its workers' forward-pass metrics (its load rule:
        # core.autoscale.DynamoLoadAutoscaler), so a live autoscaler can run that rule on a scrape.
        self.decode_kv_tokens = gauge(
            "decode_kv_tokens", "KV tokens of the decoding requests (Dynamo's sum_decode_kv_tokens)."
        )
        self.queued_prompt_tokens = gauge(
            "queued_prompt_tokens", "Prompt tokens of the requests waiting for their first chunk."
        )
        self.kv_capacity_tokens = gauge("kv_capacity_tokens", "KV-cache capacity in tokens.")
        self.preemptions = counter("num_preemptions", "Requests preempted (recomputed later).")
        # vLLM's names: prompt tokens looked up in the prefix cache at admission, and found there.
        self.prefix_cache_queries = counter(
            "prefix_cache_queries", "Prompt tokens looked up in the prefix cache."
        )
        self.prefix_cache_hits = counter("prefix_cache_hits", "Prompt tokens found in the prefix cache.")
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of requests that got a first token.")
        self.generation_tokens = counter("generation_tokens", "Tokens generated.")
        self.time_to_first_token = histogram("time_to_first_token_seconds", "Arrival to first sampled token.")
        self.inter_token_latency = histogram(
            "inter_token_latency_seconds", "Gap between two sampled tokens of a request."
        )
        self.e2e_request_latency = histogram(
            "e2e_request_latency_seconds", "Arrival to the last token of a request that finished."
        )
        # vLLM's spec-decode counters: verify steps a request ran, draft tokens, accepted ones,
        # and accepted ones by draft position.
        self.spec_decode_drafts = counter("spec_decode_num_drafts", "Draft runs verified.")
        self.spec_decode_draft_tokens = counter("spec_decode_num_draft_tokens", "Draft tokens verified.")
        self.spec_decode_accepted_tokens = counter(
            "spec_decode_num_accepted_tokens", "Draft tokens accepted."
        )
        self._spec_decode_per_position = Counter(
            f"{prefix}:spec_decode_num_accepted_tokens_per_pos",
            "Draft tokens accepted, by position in the draft.",
            ("model_name", "position"),
            registry=self.registry,
        )
        self._request_success = Counter(
            f"{prefix}:request_success",
            "Requests that ended, by finish reason.",
            ("model_name", "finished_reason"),
            registry=self.registry,
        )
        self._requests_shed = Counter(
            "stallfree:requests_shed",
            "Sheddable requests refused (429) while the waiting queue was past the shedding bound.",
            ("model_name",),
            registry=self.registry,
        )
        self._model_name = model_name

    def record_step(
        self,
        *,
        ttfts_s: Sequence[float],
        itls_s: Sequence[float],
        num_prompt_tokens: int,
        num_generated_tokens: int,
        e2es_s: Sequence[float] = (),
    ) -> None:
        """One engine step's tokens: first-token latencies, gaps, prompt tokens of the new starters,
        and the whole latency of the requests that finished."""
        self.time_to_first_token.observe_many(ttfts_s)
        self.inter_token_latency.observe_many(itls_s)
        self.e2e_request_latency.observe_many(e2es_s)
        if num_prompt_tokens:
            self.prompt_tokens.inc(num_prompt_tokens)
        if num_generated_tokens:
            self.generation_tokens.inc(num_generated_tokens)

    def record_drafts(self, plan: StepPlan, accepted: Mapping[str, int]) -> None:
        """A step's draft verifications: how many ran and how many of each were accepted."""
        for chunk in plan.chunks:
            if chunk.num_draft_tokens:
                self.spec_decode_drafts.inc()
                self.spec_decode_draft_tokens.inc(chunk.num_draft_tokens)
                kept = accepted.get(chunk.request_id, 0)
                if kept:
                    self.spec_decode_accepted_tokens.inc(kept)
                for position in range(kept):
                    self._spec_decode_per_position.labels(self._model_name, str(position)).inc()

    def request_shed(self) -> None:
        self._requests_shed.labels(self._model_name).inc()

    def request_finished(self, finish_reason: str) -> None:
        self._request_success.labels(self._model_name, finish_reason).inc()

    def update_engine(
        self,
        *,
        num_running: int,
        num_waiting: int,
        num_used_blocks: int,
        num_blocks: int | None,
        new_preemptions: int,
        new_prefix_queries: int = 0,
        new_prefix_hits: int = 0,
        load_tokens: tuple[int, int, int] = (0, 0, 0),
    ) -> None:
        """``load_tokens``: the decoding requests' KV tokens, the waiting ones' prompt tokens and
        the KV capacity in tokens."""
        self.num_requests_running.set(num_running)
        decode_kv, queued, capacity = load_tokens
        self.decode_kv_tokens.set(decode_kv)
        self.queued_prompt_tokens.set(queued)
        self.kv_capacity_tokens.set(capacity)
        self.num_requests_waiting.set(num_waiting)
        self.kv_cache_used_blocks.set(num_used_blocks)
        self.kv_cache_usage.set(num_used_blocks / num_blocks if num_blocks else 0.0)
        if new_preemptions:
            self.preemptions.inc(new_preemptions)
        if new_prefix_queries:
            self.prefix_cache_queries.inc(new_prefix_queries)
            self.prefix_cache_hits.inc(new_prefix_hits)

    def track_steps(self, tracking: TrackingError, bounds_s: Sequence[float]) -> None:
        """Show a virtual replica's step lateness (its histogram's ``bounds_s``) on every scrape."""
        self.registry.register(_StepLateness(tracking, bounds_s, self._model_name))

    def render(self) -> bytes:
        """The Prometheus text exposition format."""
        return generate_latest(self.registry)
