"""`stallfree ui`'s JSON API without a browser: the numbers equal the CLI's, bad input is a 4xx
with an OpenAI-style body (and the server keeps serving), and the static export is self-contained."""

from __future__ import annotations

import bisect
import contextlib
import io
import itertools
import json
import re
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from stallfree.cli import main
from stallfree.core.serving import ServingConfig
from stallfree.costs.choice import CostChoice
from stallfree.sim import Deployment, simulate
from stallfree.ui.api import handle
from stallfree.ui.server import serve_in_thread
from stallfree.workload import TraceLengths, Workload, gamma


def cli_json(*args: str) -> Any:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([*args, "--json"]) == 0
    return json.loads(out.getvalue())


def api(path: str, **query: str) -> tuple[int, Any]:
    status, content_type, body = handle("GET", path, {k: [v] for k, v in query.items()})
    assert content_type == "application/json"
    return status, json.loads(body)


@pytest.fixture(scope="module")
def tune_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = cli_json(
        "tune", "--policy", "chunked,prefill-first", "--budgets", "256,1024", "--num-requests", "100",
        "--workers", "1", "--no-progress",
    )  # fmt: skip
    path = tmp_path_factory.mktemp("tune") / "tune.json"
    path.write_text(json.dumps(out))
    return path


@pytest.mark.parametrize(
    ("query", "flags"),
    [
        ({}, []),
        ({"chunk_tokens": "64"}, ["--chunk-tokens", "64"]),
        (
            {"model": "llama-3-8b", "hardware": "h100-sxm", "tp": "1", "cost_model": "full", "streams": "8"},
            [
                "--model",
                "llama-3-8b",
                "--hardware",
                "h100-sxm",
                "--tp",
                "1",
                "--cost-model",
                "full",
                "--streams",
                "8",
            ],
        ),
        # a token budget carries budget - streams prompt tokens a step: 528 - 16 = 512
        (
            {"token_budget": "528", "prompt_tokens": "4096"},
            ["--chunk-tokens", "512", "--prompt-tokens", "4096"],
        ),
    ],
)
def test_explain_is_the_cli_json(query: dict[str, str], flags: list[str]) -> None:
    status, view = api("/api/explain", **query)
    assert status == 200
    assert view["explain"] == cli_json("explain", *flags)
    sc = view["explain"]["scenario"]
    assert view["token_budget"] == sc["chunk_tokens"] + sc["streams"]
    for name, run in view["timeline"]["runs"].items():
        policy = view["explain"]["policies"][name]
        assert run["max_gap"]["gap_s"] == policy["max_gap_s"]
        assert run["ttft_s"] == policy["ttft_s"]
        ticks = run["streams"][run["max_gap"]["stream"]]
        assert [run["max_gap"]["start_s"], run["max_gap"]["end_s"]] == pytest.approx(
            [t for t in ticks if run["max_gap"]["start_s"] <= t <= run["max_gap"]["end_s"] + 1e-12]
        )
        assert len(run["streams"]) == min(16, run["num_streams"]) == min(16, sc["streams"])


@pytest.mark.parametrize(
    ("query", "param", "words"),
    [
        ({"tp": "0"}, "tp", "between 1 and 64"),
        ({"streams": "many"}, "streams", "whole number"),
        ({"model": "gpt-9"}, "model", "unknown 'gpt-9'"),
        ({"model": "/etc/passwd"}, "model", "choose from"),  # presets only: no local files
        ({"hardware": "tpu"}, "hardware", "unknown 'tpu'"),
        ({"cost_model": "exact"}, "cost_model", "choose from: weights-only, full"),
        ({"prompt_tokens": "1000000"}, "prompt_tokens", "65,536"),
        ({"chunk_tokens": "1", "prompt_tokens": "65536"}, "chunk_tokens", "at least 16 tokens"),
        ({"token_budget": "16"}, "token_budget", "no room for the prompt"),
        ({"chunk_tokens": "64", "token_budget": "200"}, "token_budget", "not both"),
        ({"chunk": "64"}, "chunk", "unknown parameter"),
        ({"tp": "1"}, None, "do not fit on 1 x a100-40gb"),  # the library's check: was a 5xx
    ],
)
def test_explain_bad_input_is_a_400(query: dict[str, str], param: str | None, words: str) -> None:
    status, body = api("/api/explain", **query)
    assert status == 400
    assert body["error"]["type"] == "invalid_request_error"
    assert body["error"]["param"] == param
    assert words in body["error"]["message"]


def test_simulate_is_the_simulator() -> None:
    status, view = api(
        "/api/simulate", policy="prefill-first", lengths="sharegpt", qps="4", burstiness="0.5",
        num_requests="300", token_budget="256",
    )  # fmt: skip
    assert status == 200
    direct = simulate(
        Workload(gamma(4.0, 0.5), TraceLengths("sharegpt")),
        Deployment(
            costs=CostChoice(kind="full"),
            serving=ServingConfig(policy="prefill-first", max_num_batched_tokens=256),
        ),
        num_requests=300,
        keep_steps=True,
    ).summary
    assert view["summary"] == {key: direct[key] for key in view["summary"]}
    assert view["summary"]["completed"] == 300
    itl = view["itl_cdf_ms"]
    assert itl[-1][1] == pytest.approx(1.0) and all(a[0] <= b[0] for a, b in itertools.pairwise(itl))
    assert len(itl) <= 2 * 300 + 1
    assert max(p[0] for p in itl) == pytest.approx(direct["max_itl_ms"], rel=1e-4)
    batch = view["batch"]
    assert batch["end_s"] - batch["start_s"] == 3.0 and batch["steps"]
    assert all(s[1] > batch["start_s"] and s[0] < batch["end_s"] for s in batch["steps"])
    assert 0 < max(p[1] for p in view["kv"]["points"]) <= 100


DAY = {
    "rate_profile": "diurnal:24,3,0.05",
    "autoscale": "keda:waiting=4",
    "max_replicas": "4",
    "startup_s": "20",
    "window_s": "20",
    "goodput": "ttft:2000",
}
DAY_FLAGS = [
    "--rate-profile", DAY["rate_profile"], "--autoscale", DAY["autoscale"], "--max-replicas", "4",
    "--startup-s", "20", "--window-s", "20", "--goodput", "ttft:2000",
]  # fmt: skip


def test_simulate_runs_an_autoscaled_day_as_the_cli_does() -> None:
    status, view = api("/api/simulate", **DAY, num_requests="2500")
    assert status == 200 and "batch" not in view and "kv" not in view  # no steps kept: the day instead
    out = cli_json("simulate", "--num-requests", "2500", "--cost-model", "full", *DAY_FLAGS)["policies"][
        "chunked"
    ]
    assert view["summary"] == {key: out[key] for key in view["summary"]}
    a, day = out["autoscale"], view["day"]
    assert (day["rule"], day["window_s"], day["gpu_hours"]) == ("keda:waiting=4", 20, a["gpu_hours"])
    assert day["windows"] == [[w["start_s"], w["arrivals"], w["slo_attainment"]] for w in a["windows"]]
    assert any(w[2] < 1 for w in day["windows"])  # the start-up's queue missed the TTFT SLO
    assert day["events"] == [[e["time_s"], e["current"], e["desired"]] for e in a["events"]] != []
    times = [p[0] for p in day["fleet"]]
    assert day["fleet"][0] == [0, 1, 1] and times[-1] == view["end_s"] == out["duration"]
    for time_s, starting, ready, draining in a["sizes"]:  # the steps hold the size after every scrape
        assert day["fleet"][bisect.bisect_right(times, time_s) - 1][1:] == [
            ready,
            starting + ready + draining,
        ]


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ({"policy": "fastest"}, "policy"),
        ({"num_requests": "100000"}, "num_requests"),
        ({"qps": "-1"}, "qps"),
        ({"lengths": "/etc/passwd"}, "lengths"),
        ({"window_start_s": "1e8", "num_requests": "20"}, "window_start_s"),
        ({"autoscale": "keda:bogus=4"}, "autoscale"),
        ({"autoscale": "keda:waiting=4", "min_replicas": "5", "max_replicas": "2"}, "autoscale"),
        ({"autoscale": "keda:waiting=4", "max_replicas": "0"}, "max_replicas"),
        ({"autoscale": "keda:waiting=4", "startup_s": "1000"}, "startup_s"),  # past the last arrival
        ({"autoscale": "keda:waiting=4", "goodput": "ttft"}, "goodput"),
        ({"autoscale": "keda:waiting=4", "window_start_s": "3"}, "window_start_s"),
        ({"min_replicas": "2"}, "min_replicas"),  # applies with autoscale
        ({"rate_profile": "diurnal:1"}, "rate_profile"),
        ({"rate_profile": "/etc/passwd"}, "rate_profile"),
        ({"rate_profile": "diurnal:4,1", "qps": "2"}, "qps"),
    ],
)
def test_simulate_bad_input_is_a_400(query: dict[str, str], param: str) -> None:
    status, body = api("/api/simulate", **query)
    assert status == 400 and body["error"]["param"] == param
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["message"]


def test_tune_view_is_the_file(tune_json: Path) -> None:
    out = json.loads(tune_json.read_text())
    status, _, body = handle("POST", "/api/tune", {}, tune_json.read_bytes())
    view = json.loads(body)
    assert status == 200
    assert view["commands"] == out["policies"]["chunked"]["commands"]
    assert view["slo_tbt_ms"] == out["slos"]["tbt_p99_ms"]
    chunked = view["capacity"]["chunked"]
    assert [p[0] for p in chunked["points"]] == [256, 1024]
    assert chunked["capacity_qps"] == out["policies"]["chunked"]["capacity_qps"]
    assert sum(len(v) for by in view["tbt"].values() for v in by.values()) == len(out["trials"])
    assert "launch flags" in view["report"]
    for bad, words in ((b"[1, 2]", "JSON object"), (b'{"model": "x"}', "missing"), (b"{", "not JSON")):
        status, _, body = handle("POST", "/api/tune", {}, bad)
        assert status == 400 and words in json.loads(body)["error"]["message"]


def test_server_answers_4xx_and_keeps_serving() -> None:
    server, url = serve_in_thread()
    try:
        for path, status in (("/api/explain?tp=x", 400), ("/api/nothing", 404), ("/api/tune", 405)):
            with pytest.raises(urllib.error.HTTPError) as caught:
                urllib.request.urlopen(url + path, timeout=30)
            assert caught.value.code == status
            assert json.loads(caught.value.read())["error"]["message"]
        page = urllib.request.urlopen(url + "/", timeout=30).read().decode()
        assert '<script src="static/app.js">' in page
        with urllib.request.urlopen(
            url + "/api/explain?chunk_tokens=512&prompt_tokens=2048", timeout=30
        ) as r:
            assert json.loads(r.read())["explain"]["scenario"]["chunk_tokens"] == 512
        for name in ("app.js", "charts.js", "style.css"):
            assert urllib.request.urlopen(f"{url}/static/{name}", timeout=30).status == 200
    finally:
        server.shutdown()
        server.server_close()


def test_static_export_is_self_contained_and_the_cli(tmp_path: Path) -> None:
    path = tmp_path / "page" / "explain.html"
    out = cli_json("explain", "--html", str(path), "--sweep", "64,1024", "--prompt-tokens", "4096")
    assert out["html"] == str(path)
    page = path.read_text()
    assert not re.search(r"""(src|href)=["'](?!data:)""", page)  # nothing loaded from anywhere
    # the only URL is SVG's namespace name, which is never fetched
    assert not re.search(r"https?://", page.replace("http://www.w3.org/2000/svg", ""))
    data = json.loads(re.search(r'id="stallfree-data">(.*?)</script>', page, re.S).group(1))  # type: ignore[union-attr]
    assert data["chunks"] == [64, 256, 1024] and data["index"] == 1
    for chunk, view in zip(data["chunks"], data["views"], strict=True):
        expect = cli_json(
            "explain", "--sweep", "64,1024", "--prompt-tokens", "4096", "--chunk-tokens", str(chunk)
        )
        assert view["explain"] == expect


def test_the_page_runs_without_the_command_line(tmp_path: Path) -> None:
    """The API and the export stand on the library alone: ``stallfree.cli`` is never imported."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from stallfree.explain import ExplainOptions\n"
        "from stallfree.ui.api import handle\n"
        "from stallfree.ui.export import write_html\n"
        "assert handle('GET', '/api/presets', {})[0] == 200\n"
        "assert handle('GET', '/api/explain', {'prompt_tokens': ['2048']})[0] == 200\n"
        f"write_html(ExplainOptions(prompt_tokens=2048, sweep=(256,)), {str(tmp_path / 'x.html')!r})\n"
        "print(sorted(m for m in sys.modules if m.startswith('stallfree.cli')))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_html_refuses_the_torch_engine(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "--engine", "torch", "--html", "x.html"]) == 2
    assert "--html" in capsys.readouterr().err


def test_ui_port_in_use_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    server, url = serve_in_thread()
    try:
        port = url.rsplit(":", 1)[1]
        assert main(["ui", "--port", port]) == 2
        assert "cannot listen on 127.0.0.1" in capsys.readouterr().err
    finally:
        server.shutdown()
        server.server_close()
