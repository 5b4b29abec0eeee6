// stallfree ui: the controls and the views. Every number shown comes from the JSON API
// (stallfree.explain / stallfree.sim / a tune result), or, in a static export, from the same
// API answers precomputed for each chunk of the sweep and inlined in the page.
"use strict";
(() => {
  const $ = (id) => document.getElementById(id);
  const embedded = $("stallfree-data");
  const STATIC = embedded ? JSON.parse(embedded.textContent) : null;
  let presets = null;

  // ---- state in the URL: #view=explain&model=...&chunk_tokens=256
  function readHash() { return new URLSearchParams(location.hash.slice(1)); }
  function writeHash(view, params) {
    const p = new URLSearchParams(params); p.set("view", view);
    history.replaceState(null, "", `#${p}`);
  }

  function showError(id, message) { const box = $(id); box.textContent = message || ""; box.hidden = !message; }

  async function getJson(url, init) {
    const response = await fetch(url, init);
    const body = await response.json().catch(() => ({ error: { message: `HTTP ${response.status}` } }));
    if (!response.ok) throw new Error(body.error ? body.error.message : `HTTP ${response.status}`);
    return body;
  }

  function fillSelect(select, values) { select.innerHTML = values.map((v) => `<option>${v}</option>`).join(""); }

  // ---- tabs (arrow keys move between them)
  const VIEWS = ["explain", "traffic", "tune"];
  function showView(view) {
    for (const v of VIEWS) {
      $(`view-${v}`).hidden = v !== view;
      $(`tab-${v}`).setAttribute("aria-selected", String(v === view));
      $(`tab-${v}`).tabIndex = v === view ? 0 : -1;
    }
    if (view === "explain") writeHash("explain", explainParams());
    if (view === "traffic") writeHash("traffic", trafficParams());
    if (view === "tune") writeHash("tune", {});
  }
  VIEWS.forEach((v, i) => {
    const tab = $(`tab-${v}`);
    tab.addEventListener("click", () => showView(v));
    tab.addEventListener("keydown", (e) => {
      const step = { ArrowRight: 1, ArrowLeft: -1 }[e.key];
      if (!step) return;
      const next = VIEWS[(i + step + VIEWS.length) % VIEWS.length];
      if (!$(`tab-${next}`).hidden) { showView(next); $(`tab-${next}`).focus(); }
    });
  });

  function formParams(form) {
    const out = {};
    for (const field of form.elements) if (field.name && field.type !== "checkbox" && field.value !== "") out[field.name] = field.value;
    return out;
  }

  // ---- explain view
  const form = $("explain-form"), slider = $("chunk-slider");
  let sizeBy = "chunk_tokens", sweep = [], inflight = null, timer = null;

  function explainParams() {
    const p = formParams(form);
    delete p[sizeBy === "chunk_tokens" ? "token_budget" : "chunk_tokens"];
    return p;
  }

  function setCell(id, value, text) { const cell = $(id); cell.dataset.value = String(value); cell.textContent = text; }

  function renderExplain(view) {
    const out = view.explain, sc = out.scenario, pf = out.policies["prefill-first"], ch = out.policies.chunked;
    for (const [key, p] of [["pf", pf], ["ch", ch]]) {
      setCell(`${key}-max-gap`, p.max_gap_s, Fmt.seconds(p.max_gap_s));
      setCell(`${key}-median-gap`, p.median_gap_s, Fmt.seconds(p.median_gap_s));
      setCell(`${key}-ttft`, p.ttft_s, Fmt.seconds(p.ttft_s));
      setCell(`${key}-vs-alone`, p.ttft_vs_alone, Fmt.ratio(p.ttft_vs_alone));
    }
    $("pf-max-gap").classList.toggle("worst", pf.max_gap_s > ch.max_gap_s);
    $("ch-label").textContent = `chunked (${sc.chunk_tokens}-token chunks)`;
    const facts = [
      ["setup", `${sc.model} on ${sc.tp} x ${sc.hardware}, cost model ${sc.cost_model}`],
      [`decode step (${sc.streams} streams)`, Fmt.seconds(out.decode_step_s)],
      ["prompt prefill alone", Fmt.seconds(out.prefill_alone_s)],
      ["ridge point", `${Fmt.fixed(out.ridge_tokens, 0)} tokens per step`],
      ["token budget", `${view.token_budget.toLocaleString("en-US")} (chunk + ${sc.streams} decodes)`],
      ["prompt chunk steps", `${out.prompt_chunks.num_steps}: ${Fmt.seconds(out.prompt_chunks.first_step_s)} to ${Fmt.seconds(out.prompt_chunks.last_step_s)}`],
    ];
    $("explain-facts").innerHTML = "";
    for (const [k, v] of facts) {
      const dt = document.createElement("dt"), dd = document.createElement("dd");
      dt.textContent = k; dd.textContent = v; $("explain-facts").append(dt, dd);
    }
    $("explain-table").textContent = view.table;
    Charts.timeline($("timeline"), view.timeline, [["prefill-first", "prefill-first"], ["chunked", `chunked (${sc.chunk_tokens}-token chunks)`]], showStep);
    drawSweep(out);
    form.elements.chunk_tokens.value = sc.chunk_tokens;
    form.elements.token_budget.value = view.token_budget;
    syncSlider(sc.chunk_tokens);
  }

  function showStep(policy, index, step, px, py) {
    const tip = $("tooltip");
    if (!policy) { tip.hidden = true; return; }
    const [start, dur, decode, prompt] = step;
    tip.textContent = `${policy}, step ${index + 1}: ${decode} decode + ${prompt.toLocaleString("en-US")} prompt tokens, ` +
      `${Fmt.seconds(dur)} (at ${Fmt.fixed(start, 3)} s)`;
    const svg = $("timeline"), k = svg.getBoundingClientRect().width / svg.viewBox.baseVal.width;
    tip.style.left = `${Math.max(0, Math.min(px * k - 120, svg.clientWidth - 360))}px`;
    tip.style.top = `${py * k + 48}px`;
    tip.hidden = false;
  }

  function drawSweep(out) {
    const chunk = out.scenario.chunk_tokens, ridge = out.ridge_tokens;
    const marks = [{ at: ridge, label: `ridge ~${Fmt.fixed(ridge, 0)}` }, { at: chunk, label: "", color: "#1f2328", dash: "1 0", width: 2 }];
    const pickChunk = (value) => setChunk(value);
    Charts.lines($("sweep-gap"), { height: 240, title: "longest gap (ms)", x: { log: true, label: "chunk tokens", ticks: out.sweep.map((r) => r.chunk_tokens) }, y: { log: true, label: "ms" },
      series: [{ hideLegend: true, name: "chunked", color: Charts.COLORS.chunked, dots: true, points: out.sweep.map((r) => [r.chunk_tokens, r.max_gap_s * 1e3]) }],
      hlines: [{ at: out.policies["prefill-first"].max_gap_s * 1e3, label: "prefill-first", color: Charts.COLORS["prefill-first"] }],
      vlines: marks, onPick: pickChunk });
    Charts.lines($("sweep-ttft"), { height: 240, title: "prompt TTFT vs prefill alone", x: { log: true, label: "chunk tokens", ticks: out.sweep.map((r) => r.chunk_tokens) }, y: { label: "x alone" },
      series: [{ hideLegend: true, name: "chunked", color: Charts.COLORS.chunked, dots: true, points: out.sweep.map((r) => [r.chunk_tokens, r.ttft_vs_alone]) }],
      hlines: [{ at: out.policies["prefill-first"].ttft_vs_alone, label: "prefill-first", color: Charts.COLORS["prefill-first"] }],
      vlines: marks, onPick: pickChunk });
  }

  function syncSlider(chunk) {
    let best = 0;
    sweep.forEach((c, i) => { if (Math.abs(Math.log(c / chunk)) < Math.abs(Math.log(sweep[best] / chunk))) best = i; });
    slider.value = best;
    $("chunk-value").textContent = `${chunk.toLocaleString("en-US")} tokens`;
  }

  function setChunk(value) {
    if (STATIC) { const i = STATIC.chunks.indexOf(value); if (i >= 0) { slider.value = i; renderStatic(i); } return; }
    sizeBy = "chunk_tokens"; form.elements.chunk_tokens.value = value; runExplain();
  }

  function renderStatic(i) {
    renderExplain(STATIC.views[i]);
    writeHash("explain", { chunk_tokens: STATIC.chunks[i] });
  }

  function runExplain() {
    clearTimeout(timer);
    timer = setTimeout(async () => {
      const params = explainParams();
      writeHash("explain", params);
      if (inflight) inflight.abort();
      const controller = (inflight = new AbortController());
      $("explain-busy").hidden = false;
      try {
        const view = await getJson(`api/explain?${new URLSearchParams(params)}`, { signal: controller.signal });
        showError("explain-error", "");
        renderExplain(view);
      } catch (error) {
        if (error.name !== "AbortError") showError("explain-error", error.message);
      } finally {
        if (inflight === controller) { inflight = null; $("explain-busy").hidden = true; }
      }
    }, 150);
  }

  form.addEventListener("submit", (e) => e.preventDefault());
  form.addEventListener("input", (e) => {
    if (e.target === slider) {
      if (STATIC) { renderStatic(Number(slider.value)); return; }
      sizeBy = "chunk_tokens"; form.elements.chunk_tokens.value = sweep[Number(slider.value)];
      $("chunk-value").textContent = `${sweep[Number(slider.value)].toLocaleString("en-US")} tokens`;
    } else if (e.target.name === "token_budget" || e.target.name === "chunk_tokens") {
      sizeBy = e.target.name;
    }
    runExplain();
  });

  // ---- traffic view
  const tform = $("traffic-form");
  let trafficRun = null;
  const ROWS = [
    ["completed", "completed", (v) => v.toLocaleString("en-US")],
    ["rejected", "rejected", (v) => v.toLocaleString("en-US")],
    ["requests/s", "request_throughput", (v) => Fmt.fixed(v, 3)],
    ["output tokens/s", "output_throughput", (v) => Fmt.fixed(v, 1)],
    ["TTFT p99 (ms)", "p99_ttft_ms", (v) => Fmt.fixed(v, 1)],
    ["ITL median (ms)", "median_itl_ms", (v) => Fmt.fixed(v, 2)],
    ["ITL p99 (ms)", "p99_itl_ms", (v) => Fmt.fixed(v, 2)],
    ["ITL max (ms)", "max_itl_ms", (v) => Fmt.fixed(v, 1)],
    ["preemptions", "num_preemptions", (v) => v.toLocaleString("en-US")],
  ];

  function renderTraffic(results) {
    const table = $("traffic-table");
    table.innerHTML = "";
    const head = table.createTHead().insertRow();
    head.innerHTML = "<th></th>" + results.map((r) => `<th scope="col">${r.policy}</th>`).join("");
    const body = table.createTBody();
    for (const [label, key, f] of ROWS) {
      const row = body.insertRow();
      row.innerHTML = `<th scope="row">${label}</th>`;
      for (const r of results) {
        const cell = row.insertCell(), v = r.summary[key];
        cell.dataset.key = `${r.policy}.${key}`; cell.dataset.value = String(v);
        cell.textContent = v === null || v === undefined ? "-" : f(v);
      }
    }
    const color = (p) => Charts.COLORS[p] || "#b279a2";
    const cdf = (svg, key, title) => Charts.lines(svg, { height: 260, title, x: { log: true, label: "ms" }, y: { domain: [0, 1.02], label: "fraction at or below" }, legend: "bottom",
      series: results.map((r) => ({ name: r.policy, color: color(r.policy), step: true, points: r[key].filter((p) => p[0] > 0) })) });
    cdf($("itl-cdf"), "itl_cdf_ms", "inter-token latency CDF");
    cdf($("ttft-cdf"), "ttft_cdf_ms", "time to first token CDF");
    const traced = results.filter((r) => r.batch), batches = $("batch-charts"), days = $("day-charts");
    batches.innerHTML = ""; days.innerHTML = "";
    $("step-charts").hidden = !traced.length;  // an autoscaled fleet keeps no steps: its day instead
    for (const r of traced) {
      const svg = Charts.el("svg", { role: "img", "aria-label": `batch composition, ${r.policy}` }, batches);
      Charts.bars(svg, { steps: r.batch.steps, window: [r.batch.start_s, r.batch.end_s],
        title: `${r.policy}: tokens per step, ${Fmt.fixed(r.batch.start_s, 1)}-${Fmt.fixed(r.batch.end_s, 1)} s` });
    }
    if (traced.length) Charts.lines($("kv-usage"), { height: 260, title: `KV blocks in use (peak per bin, of ${traced[0].kv.num_blocks.toLocaleString("en-US")})`,
      x: { label: "simulated time (s)" }, y: { domain: [0, 100], label: "%" },
      series: traced.map((r) => ({ name: r.policy, color: color(r.policy), points: r.kv.points })) });
    for (const r of results.filter((r) => r.day)) {
      const svg = Charts.el("svg", { role: "img", "aria-label": `replicas and load over time, ${r.policy}` }, days);
      const judged = r.day.windows.some((w) => w[2] !== null);
      Charts.day(svg, r.day, `${r.policy}: ${r.day.rule}, ${Fmt.fixed(r.day.gpu_hours, 2)} GPU-hours; ` +
        (judged ? "shaded: windows whose requests missed the SLOs" : "no SLOs given: misses not marked"));
    }
  }

  // A rate profile sets the rate (no QPS); an autoscaler's settings apply with it, and its fleet
  // keeps no steps to window. Disabled fields are left out of the query.
  const DAY_FIELDS = ["min_replicas", "max_replicas", "startup_s", "window_s", "goodput"];
  function syncTrafficFields() {
    const profile = tform.elements.rate_profile.value.trim() !== "", scaled = tform.elements.autoscale.value.trim() !== "";
    for (const k of ["qps", "burstiness"]) tform.elements[k].disabled = profile;
    for (const k of DAY_FIELDS) tform.elements[k].disabled = !scaled;
    tform.elements.window_start_s.disabled = scaled;
  }
  function trafficParams() {
    const p = formParams(tform);
    for (const field of tform.elements) if (field.name && field.disabled) delete p[field.name];
    return p;
  }
  tform.addEventListener("input", syncTrafficFields);

  async function runTraffic() {
    const policies = [...tform.querySelectorAll("input[type=checkbox]:checked")].map((b) => b.value);
    if (!policies.length) { showError("traffic-error", "choose at least one policy"); return; }
    const params = trafficParams();
    writeHash("traffic", params);
    const controller = (trafficRun = new AbortController());
    $("traffic-run").disabled = true; $("traffic-cancel").disabled = false;
    $("traffic-bar").hidden = false; $("traffic-bar").max = policies.length; $("traffic-bar").value = 0;
    showError("traffic-error", "");
    const results = [];
    try {
      for (const policy of policies) {
        $("traffic-status").textContent = `simulating ${policy} (${results.length + 1} of ${policies.length})…`;
        const query = new URLSearchParams({ ...params, policy });
        if (results.length && results[0].batch) query.set("window_start_s", results[0].batch.start_s);
        results.push(await getJson(`api/simulate?${query}`, { signal: controller.signal }));
        $("traffic-bar").value = results.length;
      }
      $("traffic-status").textContent = `done: ${results.length} policies, ${results[0].summary.completed.toLocaleString("en-US")} requests each`;
      renderTraffic(results);
    } catch (error) {
      if (error.name === "AbortError") $("traffic-status").textContent = `cancelled after ${results.length} of ${policies.length} policies`;
      else { showError("traffic-error", error.message); $("traffic-status").textContent = ""; }
    } finally {
      trafficRun = null; $("traffic-run").disabled = false; $("traffic-cancel").disabled = true; $("traffic-bar").hidden = true;
    }
  }
  tform.addEventListener("submit", (e) => { e.preventDefault(); runTraffic(); });
  $("traffic-cancel").addEventListener("click", () => { if (trafficRun) trafficRun.abort(); });

  // ---- tune view
  $("tune-file").addEventListener("change", async () => {
    const file = $("tune-file").files[0];
    if (!file) return;
    try {
      const view = await getJson("api/tune", { method: "POST", headers: { "Content-Type": "application/json" }, body: await file.text() });
      showError("tune-error", "");
      renderTune(view);
    } catch (error) {
      showError("tune-error", error.message); $("tune-result").hidden = true;
    }
  });

  function renderTune(view) {
    $("tune-result").hidden = false;
    $("tune-title").textContent = view.title;
    const color = (p) => Charts.COLORS[p] || "#b279a2";
    Charts.lines($("tune-capacity"), { height: 280, title: "capacity (QPS meeting every SLO) vs token budget", legend: "bottom",
      x: { log: true, label: "token budget", ticks: [...new Set(Object.values(view.capacity).flatMap((c) => c.points.map((p) => p[0])))] }, y: { label: "QPS" },
      series: Object.entries(view.capacity).map(([p, c]) => ({ name: `${p} (best ${c.best_budget ?? "none"})`, color: color(p), dots: true, points: c.points })) });
    const series = [];
    for (const [p, byBudget] of Object.entries(view.tbt)) {
      const best = String(view.capacity[p].best_budget);
      for (const [budget, pts] of Object.entries(byBudget)) {
        series.push({ name: budget === best ? `${p}, budget ${budget}` : "", hideLegend: budget !== best, color: color(p), dots: true, dotRadius: 3,
          width: budget === best ? 2.5 : 1, opacity: budget === best ? 1 : 0.35, points: pts.map(([q, v, ok]) => [q, v, !ok]) });
      }
    }
    const slo = view.slo_tbt_ms;
    Charts.lines($("tune-tbt"), { height: 280, title: "P99 TBT vs QPS (hollow: a trial missing an SLO)", x: { log: true, label: "QPS" }, y: { log: true, label: "P99 TBT (ms)" },
      series, hlines: slo ? [{ at: slo, label: `SLO ${slo} ms` }] : [] });
    const flags = $("tune-flags");
    flags.innerHTML = view.commands ? "<h3>launch flags (chunked, best budget)</h3>" : "<p>no chunked budget met the SLOs: no flags to recommend</p>";
    for (const [name, command] of Object.entries(view.commands || {})) {
      const row = document.createElement("div"); row.className = "flag";
      const code = document.createElement("code"); code.textContent = command; code.id = `flags-${name}`;
      const button = document.createElement("button"); button.type = "button"; button.textContent = `copy ${name}`;
      button.addEventListener("click", async () => {
        try { await navigator.clipboard.writeText(command); button.textContent = "copied"; }
        catch { getSelection().selectAllChildren(code); button.textContent = "selected: press Ctrl+C"; }
      });
      row.append(code, button); flags.append(row);
    }
    $("tune-report").textContent = view.report;
  }

  // ---- start
  function applyHash(formEl, hash) { for (const [k, v] of hash) if (formEl.elements[k] && formEl.elements[k].type !== "checkbox") formEl.elements[k].value = v; }

  async function start() {
    const hash = readHash();
    if (STATIC) {
      sweep = STATIC.chunks;
      const sc = STATIC.views[0].explain.scenario;
      fillSelect(form.elements.model, [sc.model]); fillSelect(form.elements.hardware, [sc.hardware]);
      fillSelect(form.elements.cost_model, [sc.cost_model]);
      for (const field of form.elements) if (field !== slider) field.disabled = true;
      for (const v of ["traffic", "tune"]) $(`tab-${v}`).hidden = true;
      $("mode-note").textContent = "static export: the chunk slider steps through the precomputed sweep; run `stallfree ui` to change the rest";
      slider.max = sweep.length - 1;
      const wanted = Number(hash.get("chunk_tokens"));
      const i = sweep.includes(wanted) ? sweep.indexOf(wanted) : STATIC.index;
      slider.value = i;
      const first = STATIC.views[i].explain.scenario;
      for (const k of ["tp", "cost_model", "streams", "context_tokens", "prompt_tokens"]) form.elements[k].value = first[k];
      renderStatic(i);
      return;
    }
    try { presets = await getJson("api/presets"); } catch (error) { showError("explain-error", error.message); return; }
    sweep = presets.sweep;
    slider.max = sweep.length - 1;
    fillSelect(form.elements.model, presets.models); fillSelect(form.elements.hardware, presets.hardware);
    fillSelect(form.elements.cost_model, presets.cost_models);
    fillSelect(tform.elements.model, presets.models); fillSelect(tform.elements.hardware, presets.hardware);
    fillSelect(tform.elements.lengths, presets.traces);
    $("policy-boxes").innerHTML = presets.policies.map((p) =>
      `<label><input type="checkbox" value="${p}"${p === "decode-first" ? "" : " checked"}> ${p}</label>`).join("");
    tform.elements.num_requests.max = presets.max_requests;
    for (const [k, v] of Object.entries(presets.explain_defaults)) if (form.elements[k]) form.elements[k].value = v;
    for (const [k, v] of Object.entries(presets.traffic_defaults)) if (tform.elements[k]) tform.elements[k].value = v;
    const view = hash.get("view") || "explain";
    if (view === "traffic") applyHash(tform, hash);
    else if (view === "explain") {
      applyHash(form, hash);
      if (hash.get("token_budget")) sizeBy = "token_budget";
    }
    syncTrafficFields();
    showView(VIEWS.includes(view) ? view : "explain");
    runExplain();
  }
  start();
})();
