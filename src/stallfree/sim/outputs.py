"""What ``simulate`` writes beside its table: per-request CSVs and a Perfetto trace (figures are
``stallfree.plots``, a layer above)."""

from __future__ import annotations

from pathlib import Path

from stallfree.sim.api import SimulationResult


def write_outputs(
    results: list[SimulationResult],
    num_policies: int,
    requests_out: str | None,
    trace_out: str | None,
) -> list[str]:
    """Per-request records (one CSV per policy when several ran) and the steps as a Chrome trace,
    as asked; the paths written."""
    from stallfree.metrics.io import write_records_csv

    outputs: list[str] = []
    if requests_out:
        for result in results:
            path = per_policy_path(requests_out, result.policy, num_policies)
            write_records_csv(result.records, path)
            outputs.append(str(path))
    if trace_out and results:
        from stallfree.sim.perfetto import write_chrome_trace

        write_chrome_trace(((r.policy, r.steps) for r in results if r.steps is not None), trace_out)
        outputs.append(trace_out)
    return outputs


def per_policy_path(path: str, policy: str, num_policies: int) -> Path:
    target = Path(path)
    return target if num_policies == 1 else target.with_name(f"{target.stem}.{policy}{target.suffix}")
