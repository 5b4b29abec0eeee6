"""The tune view's data: a saved ``stallfree tune --json`` result, checked and laid out for charts.

Nothing is recomputed: capacity per budget, every trial's P99 TBT at its QPS, the launch flags
and the CLI's own report (:func:`stallfree.tune.report.format_tune`) all come from the file.
A file that is not such a result is a 400 naming what is missing.
"""

from __future__ import annotations

from typing import Any

from stallfree.ui.errors import ApiError


def tune_view(body: object) -> dict[str, Any]:
    """``POST /api/tune`` with a ``tune --json`` object as the body."""
    from stallfree.tune.report import format_tune

    if not isinstance(body, dict):
        raise ApiError("expected the JSON object `stallfree tune --json` prints")
    try:
        report = format_tune(body)
        capacity = {
            policy: {
                "points": [
                    [p["token_budget"], p["capacity_qps"], bool(p["hit_qps_max"])] for p in entry["curve"]
                ],
                "best_budget": entry["best_budget"],
                "capacity_qps": entry["capacity_qps"],
            }
            for policy, entry in body["policies"].items()
        }
        tbt: dict[str, dict[str, list[list[Any]]]] = {policy: {} for policy in capacity}
        for trial in sorted(body["trials"], key=lambda t: (t["token_budget"], t["qps"])):
            tbt[trial["policy"]].setdefault(str(trial["token_budget"]), []).append(
                [trial["qps"], trial["metrics"]["p99_itl_ms"], bool(trial["passed"])]
            )
        commands = body["policies"].get("chunked", {}).get("commands")
        title = f"{body['model']} on {body['tp']} x {body['hardware']}, {body['workload']['lengths']} lengths"
    except (KeyError, TypeError, AttributeError, ValueError) as error:
        detail = f"missing {error}" if isinstance(error, KeyError) else str(error)
        raise ApiError(f"not a `stallfree tune --json` result ({detail})") from None
    return {
        "title": title,
        "slos": body["slos"],
        "slo_tbt_ms": body["slos"].get("tbt_p99_ms"),
        "capacity": capacity,
        "tbt": tbt,
        "commands": commands,
        "report": report,
    }
