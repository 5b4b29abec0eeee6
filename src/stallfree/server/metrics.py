"""Prometheus metrics of one server, in a registry of its own (several servers can share a process).

Latency histograms are observed on the engine thread at the moment a token is sampled, so they
measure the scheduler and the model, not how fast a client reads. Gauges are refreshed after
every engine step. Names follow vLLM's (``stallfree:`` prefix instead of ``vllm:``).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS_S = (
    0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5,
    0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0,
)  # fmt: skip


class ServerMetrics:
    """Counters, gauges and histograms; every method is safe to call from any thread."""

    def __init__(self, model_name: str) -> None:
        self.registry = CollectorRegistry()
        labels = ("model_name",)

        def gauge(name: str, doc: str) -> Gauge:
            return Gauge(f"stallfree:{name}", doc, labels, registry=self.registry)

        def counter(name: str, doc: str) -> Counter:
            return Counter(f"stallfree:{name}", doc, labels, registry=self.registry)

        def histogram(name: str, doc: str) -> Histogram:
            return Histogram(
                f"stallfree:{name}", doc, labels, buckets=_LATENCY_BUCKETS_S, registry=self.registry
            )

        self.num_requests_running = gauge("num_requests_running", "Requests in the running batch.").labels(
            model_name
        )
        self.num_requests_waiting = gauge("num_requests_waiting", "Requests queued for admission.").labels(
            model_name
        )
        self.kv_cache_usage = gauge(
            "kv_cache_usage_perc", "Fraction of KV-cache blocks in use (0-1)."
        ).labels(model_name)
        self.kv_cache_used_blocks = gauge("kv_cache_used_blocks", "KV-cache blocks held by requests.").labels(
            model_name
        )
        self.preemptions = counter("num_preemptions", "Requests preempted (recomputed later).").labels(
            model_name
        )
        self.prompt_tokens = counter(
            "prompt_tokens", "Prompt tokens of requests that got a first token."
        ).labels(model_name)
        self.generation_tokens = counter("generation_tokens", "Tokens generated.").labels(model_name)
        self.time_to_first_token = histogram(
            "time_to_first_token_seconds", "Arrival to first sampled token."
        ).labels(model_name)
        self.inter_token_latency = histogram(
            "inter_token_latency_seconds", "Gap between two sampled tokens of a request."
        ).labels(model_name)
        self._request_success = Counter(
            "stallfree:request_success",
            "Requests that ended, by finish reason.",
            ("model_name", "finished_reason"),
            registry=self.registry,
        )
        self._model_name = model_name

    def first_token(self, ttft_s: float, num_prompt_tokens: int) -> None:
        self.time_to_first_token.observe(ttft_s)
        self.prompt_tokens.inc(num_prompt_tokens)

    def next_token(self, itl_s: float) -> None:
        self.inter_token_latency.observe(itl_s)

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
    ) -> None:
        self.num_requests_running.set(num_running)
        self.num_requests_waiting.set(num_waiting)
        self.kv_cache_used_blocks.set(num_used_blocks)
        self.kv_cache_usage.set(num_used_blocks / num_blocks if num_blocks else 0.0)
        if new_preemptions:
            self.preemptions.inc(new_preemptions)

    def render(self) -> bytes:
        """The Prometheus text exposition format."""
        return generate_latest(self.registry)
