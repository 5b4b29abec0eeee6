"""`stallfree ui` in a real browser: headless Chromium (the OS package, /usr/bin/chromium) driven
by Playwright. The numbers the page shows must be the CLI's; screenshots go to out/ui-screenshots/.
Skipped, with the reason, where no Chromium or no Playwright is installed."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest

from stallfree.cli import main
from stallfree.ui.server import serve_in_thread

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
if CHROMIUM is None:
    pytest.skip("no chromium on PATH (apt-get install chromium)", allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the dev extra)")

SHOTS = Path(__file__).resolve().parent.parent / "out" / "ui-screenshots"
pytestmark = pytest.mark.xdist_group("ui-browser")  # one browser for the module


def cli_json(*args: str) -> Any:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main([*args, "--json"]) == 0
    return json.loads(out.getvalue())


def ms(seconds: float) -> str:
    """The CLI's time format (stallfree explain's table)."""
    return f"{seconds * 1e3:,.1f} ms" if seconds < 1 else f"{seconds:,.2f} s"


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    SHOTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as pw:
        chromium = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    server, url = serve_in_thread()
    yield url
    server.shutdown()
    server.server_close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    yield page
    context.close()
    assert not errors, errors


def wait_for_chunk(page: Any, chunk: int) -> None:
    page.wait_for_function(
        f"document.getElementById('ch-label').textContent === 'chunked ({chunk}-token chunks)'"
        " && document.getElementById('explain-busy').hidden",
        timeout=90_000,  # a recompute beside the other tests on 2 cores once passed Playwright's 30 s
    )


def assert_shows(page: Any, out: dict[str, Any]) -> None:
    """The page's numbers table holds ``out``'s numbers, exactly, and prints them as the CLI does."""
    for key, policy in (("pf", "prefill-first"), ("ch", "chunked")):
        for cell, field in (("max-gap", "max_gap_s"), ("ttft", "ttft_s"), ("median-gap", "median_gap_s")):
            node = page.locator(f"#{key}-{cell}")
            assert float(node.get_attribute("data-value")) == out["policies"][policy][field]
            assert node.inner_text() == ms(out["policies"][policy][field])
    labels = page.locator("#timeline .max-gap-label").all_text_contents()
    assert labels == [
        f"longest gap {ms(out['policies'][p]['max_gap_s'])}" for p in ("prefill-first", "chunked")
    ]


def test_chunk_slider_shows_the_cli_numbers(page: Any, base_url: str) -> None:
    page.goto(base_url + "/")
    wait_for_chunk(page, 256)
    assert_shows(page, cli_json("explain"))
    page.screenshot(path=str(SHOTS / "explain.png"), full_page=True)
    page.focus("#chunk-slider")
    page.keyboard.press("ArrowLeft")  # 256 -> 128, by keyboard
    wait_for_chunk(page, 128)
    assert_shows(page, cli_json("explain", "--chunk-tokens", "128"))
    assert page.locator("#chunk").input_value() == "128"
    assert "chunk_tokens=128" in page.url
    # hovering a step says what it carries
    box = page.locator("#timeline").bounding_box()
    page.mouse.move(box["x"] + box["width"] * 0.5, box["y"] + box["height"] * 0.62)
    tip = page.locator("#tooltip")
    assert (
        tip.is_visible() and "chunked, step" in tip.inner_text() and "128 prompt tokens" in tip.inner_text()
    )
    # the URL holds the state: opening it again shows the same view
    page.goto(page.url.replace("chunk_tokens=128", "chunk_tokens=1024"))
    page.reload()
    wait_for_chunk(page, 1024)
    assert_shows(page, cli_json("explain", "--chunk-tokens", "1024"))


def test_switching_model_and_hardware(page: Any, base_url: str) -> None:
    page.goto(base_url + "/#view=explain&prompt_tokens=8192")
    wait_for_chunk(page, 256)
    page.select_option("#explain-form select[name=model]", "llama-3-8b")
    page.select_option("#explain-form select[name=hardware]", "h100-sxm")
    page.fill("#explain-form input[name=tp]", "1")
    page.fill("#budget", "528")  # a token budget: 512 prompt tokens beside 16 decodes
    wait_for_chunk(page, 512)
    expect = cli_json(
        "explain", "--model", "llama-3-8b", "--hardware", "h100-sxm", "--tp", "1", "--prompt-tokens", "8192",
        "--chunk-tokens", "512",
    )  # fmt: skip
    assert_shows(page, expect)
    assert "llama-3-8b on 1 x h100-sxm" in page.locator("#explain-facts").inner_text()
    assert page.locator("#explain-table").text_content() == _cli_table(
        "--model", "llama-3-8b", "--hardware", "h100-sxm", "--tp", "1", "--prompt-tokens", "8192",
        "--chunk-tokens", "512",
    )  # fmt: skip


def _cli_table(*args: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["explain", *args]) == 0
    return out.getvalue().rstrip("\n")


def test_bad_input_shows_a_message_and_the_page_recovers(page: Any, base_url: str) -> None:
    page.goto(base_url + "/")
    wait_for_chunk(page, 256)
    page.fill("#explain-form input[name=tp]", "0")
    error = page.locator("#explain-error")
    error.wait_for(state="visible")
    assert "tp: must be between 1 and 64, got 0" in error.inner_text()
    status = page.evaluate("fetch('api/explain?tp=0').then((r) => r.status)")
    assert status == 400
    page.fill("#explain-form input[name=tp]", "8")
    error.wait_for(state="hidden")
    page.wait_for_function("document.getElementById('explain-facts').textContent.includes('on 8 x')")
    assert_shows(page, cli_json("explain", "--tp", "8"))


def test_static_export_from_disk(page: Any, tmp_path: Path) -> None:
    path = tmp_path / "explain.html"
    cli_json("explain", "--html", str(path), "--prompt-tokens", "8192")
    requests: list[str] = []
    page.on("request", lambda request: requests.append(request.url))
    page.goto(path.as_uri())
    wait_for_chunk(page, 256)
    assert_shows(page, cli_json("explain", "--prompt-tokens", "8192"))
    assert (
        page.locator("#explain-form select[name=model]").is_disabled()
        and page.locator("#tab-traffic").is_hidden()
    )
    page.focus("#chunk-slider")
    for _ in range(2):
        page.keyboard.press("ArrowLeft")  # 256 -> 128 -> 64
    wait_for_chunk(page, 64)
    assert_shows(page, cli_json("explain", "--prompt-tokens", "8192", "--chunk-tokens", "64"))
    page.screenshot(path=str(SHOTS / "static-export.png"), full_page=True)
    assert all(url.startswith("file://") for url in requests), requests


def test_traffic_view_runs_the_simulator_and_cancels(page: Any, base_url: str) -> None:
    page.goto(base_url + "/#view=traffic&num_requests=300&qps=3")
    page.wait_for_selector("#policy-boxes input")
    page.click("#traffic-run")
    page.wait_for_function("document.getElementById('traffic-status').textContent.startsWith('done')")
    expect = cli_json(
        "simulate",
        "--policy",
        "chunked,prefill-first",
        "--num-requests",
        "300",
        "--qps",
        "3",
        "--token-budget",
        "512",
        "--cost-model",
        "full",  # the traffic view's cost model
    )["policies"]
    for policy in ("chunked", "prefill-first"):
        for key in ("p99_itl_ms", "p99_ttft_ms", "request_throughput"):
            cell = page.locator(f'td[data-key="{policy}.{key}"]')
            assert float(cell.get_attribute("data-value")) == expect[policy][key]
    assert page.locator("#batch-charts svg").count() == 2
    page.screenshot(path=str(SHOTS / "traffic.png"), full_page=True)
    # a long run shows progress and can be cancelled
    page.fill("input[name=num_requests]", "5000")
    page.check("#policy-boxes input[value=decode-first]")
    page.click("#traffic-run")
    assert page.locator("#traffic-status").inner_text().startswith("simulating chunked (1 of 3)")
    page.click("#traffic-cancel")
    page.wait_for_function("document.getElementById('traffic-status').textContent.startsWith('cancelled')")
    assert page.locator("#traffic-run").is_enabled()


def test_traffic_view_runs_an_autoscaled_day(page: Any, base_url: str) -> None:
    day = {"rate_profile": "diurnal:24,3,0.05", "autoscale": "keda:waiting=4", "max_replicas": "4"}
    day |= {"startup_s": "20", "window_s": "20", "goodput": "ttft:2000", "num_requests": "2500"}
    page.goto(f"{base_url}/#view=traffic&{urlencode(day)}")
    page.wait_for_selector("#policy-boxes input")
    page.uncheck("#policy-boxes input[value=prefill-first]")
    for name in ("qps", "burstiness", "window_start_s"):  # the profile sets the rate; no steps to window
        assert page.locator(f"#traffic-form [name={name}]").is_disabled()
    page.click("#traffic-run")
    page.wait_for_function("document.getElementById('traffic-status').textContent.startsWith('done')")
    flags = [x for k, v in day.items() for x in (f"--{k.replace('_', '-')}", v)]
    out = cli_json("simulate", "--cost-model", "full", "--token-budget", "512", *flags)["policies"]["chunked"]
    for key in ("p99_ttft_ms", "request_throughput"):
        assert float(page.locator(f'td[data-key="chunked.{key}"]').get_attribute("data-value")) == out[key]
    assert page.locator("#step-charts").is_hidden()
    chart = page.locator("#day-charts svg")
    assert chart.count() == 1 and chart.locator("path.ready").count() == 1
    a = out["autoscale"]
    missed = [w["slo_attainment"] for w in a["windows"] if (w["slo_attainment"] or 1) < 1]
    shown = chart.locator("rect.slo-miss").evaluate_all(
        "rs => rs.map((r) => Number(r.getAttribute('data-met')))"
    )
    assert shown == missed and missed
    ups = sum(e["desired"] > e["current"] for e in a["events"])
    assert chart.locator("path.scale-up").count() == ups and ups
    page.screenshot(path=str(SHOTS / "traffic-day.png"), full_page=True)
    # a bad rule is the API's message, and the page runs again once it is fixed
    page.fill("#traffic-form [name=autoscale]", "keda:bogus=4")
    page.click("#traffic-run")
    error = page.locator("#traffic-error")
    error.wait_for(state="visible")
    assert "autoscale: unknown autoscaling metric 'bogus'" in error.inner_text()
    page.fill("#traffic-form [name=autoscale]", "")
    assert page.locator("#traffic-form [name=qps]").is_disabled()  # still a profile
    assert page.locator("#traffic-form [name=max_replicas]").is_disabled()  # a fixed fleet now
    page.click("#traffic-run")
    page.wait_for_function("document.getElementById('traffic-status').textContent.startsWith('done')")
    assert error.is_hidden() and page.locator("#day-charts svg").count() == 0
    assert page.locator("#batch-charts svg").count() == 1


def test_tune_view_shows_flags_with_a_copy_button(page: Any, base_url: str, tmp_path: Path) -> None:
    out = cli_json(
        "tune", "--policy", "chunked,prefill-first", "--budgets", "256,1024", "--num-requests", "100",
        "--workers", "1", "--no-progress",
    )  # fmt: skip
    path = tmp_path / "tune.json"
    path.write_text(json.dumps(out))
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    page.goto(base_url + "/#view=tune")
    page.set_input_files("#tune-file", str(path))
    page.wait_for_selector("#tune-result:not([hidden])")
    assert page.locator("#flags-vllm").inner_text() == out["policies"]["chunked"]["commands"]["vllm"]
    page.click("text=copy vllm")
    assert page.evaluate("navigator.clipboard.readText()") == out["policies"]["chunked"]["commands"]["vllm"]
    assert page.locator("#tune-capacity circle").count() == 4  # 2 policies x 2 budgets
    page.screenshot(path=str(SHOTS / "tune.png"), full_page=True)
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": "x"}')
    page.set_input_files("#tune-file", str(bad))
    page.locator("#tune-error").wait_for(state="visible")
    assert "not a `stallfree tune --json` result" in page.locator("#tune-error").inner_text()
