"""The server's Prometheus text: per-step histograms follow Prometheus' cumulative ``le`` buckets."""

from __future__ import annotations

from stallfree.server.prometheus import ServerMetrics


def _samples(metrics: ServerMetrics) -> dict[str, float]:
    out = {}
    for line in metrics.render().decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


def test_step_histogram_buckets_are_cumulative_and_inclusive() -> None:
    metrics = ServerMetrics("m")
    metrics.record_step(
        ttfts_s=[0.005, 0.3],
        itls_s=[0.001, 0.001, 0.0011, 100.0],
        num_prompt_tokens=7,
        num_generated_tokens=6,
    )
    metrics.record_step(ttfts_s=[], itls_s=[0.02], num_prompt_tokens=0, num_generated_tokens=1)
    s = _samples(metrics)
    itl = "stallfree:inter_token_latency_seconds"
    assert s[f'{itl}_bucket{{le="0.001",model_name="m"}}'] == 2  # a value on a bound counts in that bucket
    assert s[f'{itl}_bucket{{le="0.0025",model_name="m"}}'] == 3
    assert s[f'{itl}_bucket{{le="0.02",model_name="m"}}'] == 4
    assert s[f'{itl}_bucket{{le="80.0",model_name="m"}}'] == 4
    assert s[f'{itl}_bucket{{le="+Inf",model_name="m"}}'] == 5
    assert s[f'{itl}_count{{model_name="m"}}'] == 5
    assert abs(s[f'{itl}_sum{{model_name="m"}}'] - (0.001 + 0.001 + 0.0011 + 100.0 + 0.02)) < 1e-9
    ttft = "stallfree:time_to_first_token_seconds"
    assert s[f'{ttft}_bucket{{le="0.005",model_name="m"}}'] == 1
    assert s[f'{ttft}_count{{model_name="m"}}'] == 2
    assert s['stallfree:prompt_tokens_total{model_name="m"}'] == 7
    assert s['stallfree:generation_tokens_total{model_name="m"}'] == 7


def test_gauges_and_reasons() -> None:
    metrics = ServerMetrics("m")
    metrics.update_engine(num_running=3, num_waiting=2, num_used_blocks=25, num_blocks=100, new_preemptions=1)
    metrics.request_finished("abort")
    s = _samples(metrics)
    assert s['stallfree:kv_cache_usage_perc{model_name="m"}'] == 0.25
    assert s['stallfree:num_requests_running{model_name="m"}'] == 3
    assert s['stallfree:num_preemptions_total{model_name="m"}'] == 1
    assert s['stallfree:request_success_total{finished_reason="abort",model_name="m"}'] == 1
