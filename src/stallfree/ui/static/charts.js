// stallfree ui charts: plain SVG, drawn from numbers the API computed (nothing is recomputed here).
// Charts.frame draws axes and returns scales; lines, bars and the explain timeline build on it.
"use strict";
const Charts = (() => {
  const NS = "http://www.w3.org/2000/svg";
  const COLORS = { decode: "#4c78a8", prompt: "#f58518", gap: "#c62828", ink: "#1f2328",
    "chunked": "#4c78a8", "prefill-first": "#f58518", "decode-first": "#54a24b" };

  function el(tag, attrs, parent, text) {
    const node = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    if (parent) parent.appendChild(node);
    return node;
  }

  function clear(svg, height) {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    const width = Math.max(320, svg.clientWidth || svg.parentNode.clientWidth || 600);
    svg.setAttribute("viewBox", `0 0 ${width} ${height}`);
    svg.setAttribute("height", height);
    return width;
  }

  function fmt(v) {
    const a = Math.abs(v);
    if (a >= 1e4) return Math.round(v).toLocaleString("en-US");
    if (a >= 10 || v === 0) return String(Math.round(v * 10) / 10);
    return String(Number(v.toPrecision(2)));
  }

  // A scale from [d0, d1] to [r0, r1]; log scales take positive domains.
  function scale(d0, d1, r0, r1, log) {
    const f = log ? Math.log10 : (v) => v;
    let a = f(d0), b = f(d1);
    if (!(b > a)) { a -= 0.5; b += 0.5; }
    const s = (v) => r0 + ((f(v) - a) / (b - a)) * (r1 - r0);
    s.invert = (px) => { const t = a + ((px - r0) / (r1 - r0)) * (b - a); return log ? 10 ** t : t; };
    s.ticks = () => {
      if (log) {
        const out = [];
        for (let e = Math.floor(a); e <= Math.ceil(b); e++)
          for (const m of b - a < 2.5 ? [1, 2, 5] : [1]) { const v = m * 10 ** e; if (f(v) >= a - 1e-9 && f(v) <= b + 1e-9) out.push(v); }
        return out;
      }
      const span = b - a, step0 = 10 ** Math.floor(Math.log10(span / 5));
      const step = [1, 2, 5, 10].map((m) => m * step0).find((st) => span / st <= 7);
      const out = [];
      for (let v = Math.ceil(a / step) * step; v <= b + 1e-9; v += step) out.push(Number(v.toPrecision(12)));
      return out;
    };
    return s;
  }

  function extent(values, log) {
    const vs = values.filter((v) => Number.isFinite(v) && (!log || v > 0));
    if (!vs.length) return [log ? 1 : 0, log ? 10 : 1];
    const lo = Math.min(...vs), hi = Math.max(...vs);
    // A little room around the data; linear axes of positive data start at 0.
    return log ? [lo / 1.25, hi * 1.25] : [Math.min(0, lo), hi + 0.06 * (hi - Math.min(0, lo) || 1)];
  }

  // Axes, grid and labels. opts: {height, title, right (margin), x: {domain, log, label, ticks}, y: {...}}.
  function frame(svg, opts) {
    const height = opts.height || 260;
    const width = clear(svg, height);
    const m = { left: 58, right: opts.right || 14, top: opts.title ? 24 : 10, bottom: 38 };
    const x = scale(...opts.x.domain, m.left, width - m.right, opts.x.log);
    const y = scale(...opts.y.domain, height - m.bottom, m.top, opts.y.log);
    const axis = el("g", { class: "axis" }, svg);
    for (const t of opts.x.ticks || x.ticks()) {
      el("line", { class: "grid", x1: x(t), x2: x(t), y1: m.top, y2: height - m.bottom }, axis);
      el("text", { x: x(t), y: height - m.bottom + 14, "text-anchor": "middle" }, axis, fmt(t));
    }
    for (const t of y.ticks()) {
      el("line", { class: "grid", x1: m.left, x2: width - m.right, y1: y(t), y2: y(t) }, axis);
      el("text", { x: m.left - 5, y: y(t) + 4, "text-anchor": "end" }, axis, fmt(t));
    }
    el("path", { d: `M${m.left},${m.top}V${height - m.bottom}H${width - m.right}`, fill: "none" }, axis);
    el("text", { x: (m.left + width - m.right) / 2, y: height - 6, "text-anchor": "middle" }, axis, opts.x.label);
    el("text", { transform: `translate(12,${(m.top + height - m.bottom) / 2}) rotate(-90)`, "text-anchor": "middle" }, axis, opts.y.label);
    if (opts.title) el("text", { class: "title", x: m.left, y: 14 }, svg, opts.title);
    return { x, y, m, width, height, g: el("g", {}, svg) };
  }

  // Lines. series: [{name, color, points: [[x, y, hollow?]], step, width, opacity, dots}];
  // vlines / hlines: [{at, label, color, dash}]; onPick(x) on a dot's click or Enter.
  function lines(svg, opts) {
    const xs = opts.series.flatMap((s) => s.points.map((p) => p[0]));
    const ys = opts.series.flatMap((s) => s.points.map((p) => p[1])).concat((opts.hlines || []).map((h) => h.at));
    const f = frame(svg, { ...opts, x: { domain: opts.x.domain || extent(xs, opts.x.log), ...opts.x },
      y: { domain: opts.y.domain || extent(ys, opts.y.log), ...opts.y } });
    const { x, y, g } = f;
    for (const v of opts.vlines || []) {
      el("line", { x1: x(v.at), x2: x(v.at), y1: f.m.top, y2: f.height - f.m.bottom, stroke: v.color || "#57606a",
        "stroke-dasharray": v.dash || "4 3", "stroke-width": v.width || 1.2 }, g);
      if (v.label) el("text", { x: x(v.at) + 4, y: f.m.top + 10 }, g, v.label);
    }
    for (const h of opts.hlines || []) {
      el("line", { x1: f.m.left, x2: f.width - f.m.right, y1: y(h.at), y2: y(h.at), stroke: h.color || COLORS.gap, "stroke-dasharray": "5 3" }, g);
      el("text", { x: f.width - f.m.right - 4, y: y(h.at) - 4, "text-anchor": "end" }, g, h.label);
    }
    opts.series.forEach((s, i) => {
      const pts = s.points.filter((p) => Number.isFinite(p[1]));
      const d = pts.map((p, j) => {
        if (!s.step || j === 0) return `${j ? "L" : "M"}${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`;
        return `H${x(p[0]).toFixed(1)}V${y(p[1]).toFixed(1)}`;
      }).join("");
      el("path", { d, fill: "none", stroke: s.color, "stroke-width": s.width || 2, opacity: s.opacity || 1 }, g);
      if (s.dots) for (const p of pts) {
        const dot = el("circle", { cx: x(p[0]), cy: y(p[1]), r: s.dotRadius || 4, stroke: s.color, "stroke-width": 1.5,
          fill: p[2] ? "#fff" : s.color, "data-x": p[0] }, g);
        el("title", {}, dot, `${s.name}: ${fmt(p[0])}, ${fmt(p[1])}`);
        if (opts.onPick) {
          dot.setAttribute("tabindex", "0"); dot.style.cursor = "pointer";
          dot.addEventListener("click", () => opts.onPick(p[0]));
          dot.addEventListener("keydown", (e) => { if (e.key === "Enter" || e.key === " ") { e.preventDefault(); opts.onPick(p[0]); } });
        }
      }
      if (s.name && !s.hideLegend) {
        const below = opts.legend === "bottom", n = opts.series.filter((t) => t.name && !t.hideLegend).length;
        const ly = below ? f.height - f.m.bottom - 10 - 15 * (n - 1 - i) : f.m.top + 6 + 15 * i, lx = f.width - f.m.right - 200;
        el("rect", { x: lx, y: ly - 8, width: 10, height: 10, fill: s.color }, g);
        el("text", { x: lx + 14, y: ly + 1 }, g, s.name);
      }
    });
    return f;
  }

  // Stacked bars of decode and prompt tokens per step, over a window: steps [[start, end, decode, prompt]].
  function bars(svg, opts) {
    const top = Math.max(1, ...opts.steps.map((s) => s[2] + s[3]));
    const f = frame(svg, { height: opts.height || 150, title: opts.title,
      x: { domain: opts.window, label: "simulated time (s)" }, y: { domain: [0, top], label: "tokens per step" } });
    const base = f.y(0);
    for (const [start, end, decode, prompt] of opts.steps) {
      const x0 = Math.max(f.x(start), f.m.left), w = Math.max(0.6, Math.min(f.x(end), f.width - f.m.right) - x0);
      el("rect", { x: x0, width: w, y: f.y(decode), height: base - f.y(decode), fill: COLORS.decode }, f.g);
      if (prompt) el("rect", { x: x0, width: w, y: f.y(decode + prompt), height: f.y(decode) - f.y(decode + prompt), fill: COLORS.prompt }, f.g);
    }
    return f;
  }

  // An autoscaled day (the API's `day`): the replicas as steps (ready; on GPUs, starting and
  // draining included), each scaling decision marked at the count it wanted, each window's
  // arrivals per second on the right axis, windows whose requests missed the SLOs shaded (darker,
  // more missed).
  function day(svg, d, title) {
    const end = d.fleet[d.fleet.length - 1][0];
    const top = Math.max(1, ...d.fleet.map((p) => p[2]), ...d.events.map((e) => e[2])) + 1;
    const f = frame(svg, { height: 280, title, right: 52, x: { domain: [0, end], label: "simulated time (s)" }, y: { domain: [0, top], label: "replicas" } });
    const { x, y, g, m } = f, right = f.width - m.right, bottom = f.height - m.bottom;
    for (const [start, , met] of d.windows) {
      if (met === null || met >= 1) continue;
      const x0 = x(start), x1 = x(Math.min(start + d.window_s, end));
      const shade = el("rect", { class: "slo-miss", x: x0, y: m.top, width: Math.max(0, x1 - x0), height: bottom - m.top,
        fill: COLORS.gap, "fill-opacity": 0.08 + 0.3 * (1 - met), "data-met": met }, g);
      el("title", {}, shade, `from ${fmt(start)} s: ${Math.round(met * 100)}% of the requests met the SLOs`);
    }
    const rates = d.windows.map((w) => w[1] / d.window_s);
    const r = scale(0, Math.max(...rates) * 1.1 || 1, bottom, m.top, false);
    const axis = el("g", { class: "axis" }, svg);
    for (const t of r.ticks()) el("text", { x: right + 5, y: r(t) + 4 }, axis, fmt(t));
    el("path", { d: `M${right},${m.top}V${bottom}`, fill: "none" }, axis);
    el("text", { transform: `translate(${f.width - 6},${(m.top + bottom) / 2}) rotate(90)`, "text-anchor": "middle" }, axis, "arrivals per second");
    const load = d.windows.map(([start], i) => `${i ? "V" : `M${x(start).toFixed(1)},`}${r(rates[i]).toFixed(1)}H${x(Math.min(start + d.window_s, end)).toFixed(1)}`);
    const steps = (k) => d.fleet.map((p, i) => (i ? `H${x(p[0]).toFixed(1)}V` : `M${x(p[0]).toFixed(1)},`) + y(p[k]).toFixed(1)).join("");
    const series = [["arrival-rate", COLORS.prompt, load.join(""), 1.5, `arrivals/s (${fmt(d.window_s)}-s windows)`],
      ["on-gpus", COLORS.ink, steps(2), 1.5, "on GPUs (starting, draining)"], ["ready", COLORS.decode, steps(1), 2.5, "ready (routable)"]];
    series.forEach(([name, color, path, width, label], i) => {
      el("path", { class: name, d: path, fill: "none", stroke: color, "stroke-width": width }, g);
      el("rect", { x: m.left + 8, y: m.top + 6 + 15 * i, width: 10, height: 10, fill: color }, g);
      el("text", { x: m.left + 22, y: m.top + 15 + 15 * i }, g, label);
    });
    for (const [at, current, desired] of d.events) {
      const px = x(at), py = y(desired), up = desired > current;
      const mark = el("path", { class: up ? "scale-up" : "scale-down", fill: COLORS.ink,
        d: up ? `M${px},${py - 5}l4.5,8h-9z` : `M${px},${py + 5}l4.5,-8h-9z` }, g);
      el("title", {}, mark, `${fmt(at)} s: ${current} -> ${desired} replicas wanted`);
    }
    return f;
  }

  // The explain timeline: both runs on one clock. data: payload.timeline; rows: [[name, title]].
  function timeline(svg, data, rows, onStep) {
    const streamsShown = Math.max(...rows.map(([name]) => Object.keys(data.runs[name].streams).length));
    const rowH = 70 + streamsShown * 7, height = rows.length * rowH + 36;
    const width = clear(svg, height);
    const left = 92, right = width - 14;
    const x = scale(0, data.end_s, left, right, false);
    const axis = el("g", { class: "axis" }, svg);
    for (const t of x.ticks()) {
      el("line", { class: "grid", x1: x(t), x2: x(t), y1: 0, y2: height - 30 }, axis);
      el("text", { x: x(t), y: height - 16, "text-anchor": "middle" }, axis, fmt(t));
    }
    el("text", { x: (left + right) / 2, y: height - 2, "text-anchor": "middle" }, axis, "time since every stream was decoding (s)");
    const layout = rows.map(([name, title], r) => {
      const run = data.runs[name], y0 = r * rowH, band = y0 + 32, lines0 = band + 22;
      const g = el("g", { "data-policy": name }, svg);
      el("text", { class: "title", x: left, y: y0 + 12 }, g, title);
      for (const [start, dur, decode, prompt] of run.steps) {
        const share = prompt / (decode + prompt || 1), w = Math.max(0.5, x(start + dur) - x(start));
        el("rect", { x: x(start), y: band, width: w, height: 16 * (1 - share), fill: COLORS.decode }, g);
        if (prompt) el("rect", { x: x(start), y: band + 16 * (1 - share), width: w, height: 16 * share, fill: COLORS.prompt }, g);
      }
      const ids = Object.keys(run.streams);
      for (let i = 0; i < ids.length; i++) el("line", { class: "grid", x1: left, x2: right, y1: lines0 + i * 7 + 5, y2: lines0 + i * 7 + 5 }, g);
      el("text", { x: left - 6, y: lines0 + 8, "text-anchor": "end" }, g, `${run.num_streams} streams`);
      if (ids.length < run.num_streams) el("text", { x: left - 6, y: lines0 + 20, "text-anchor": "end" }, g, `(${ids.length} shown)`);
      const d = ids.map((id, i) => run.streams[id].map((t) => `M${x(t).toFixed(1)},${lines0 + i * 7}v5`).join("")).join("");
      el("path", { d, stroke: COLORS.ink, "stroke-width": 1 }, g);
      const gap = run.max_gap, gy = lines0 - 3, gh = ids.length * 7 + 4;
      el("rect", { x: x(gap.start_s), y: gy, width: Math.max(1, x(gap.end_s) - x(gap.start_s)), height: gh,
        fill: COLORS.gap, "fill-opacity": 0.12, stroke: COLORS.gap, "stroke-width": 1.5, class: "max-gap" }, g);
      el("text", { x: Math.min(x(gap.start_s) + 4, right - 150), y: gy + gh + 12, fill: COLORS.gap, class: "max-gap-label" }, g,
        `longest gap ${Fmt.seconds(gap.gap_s)}`);
      for (const [at, label, dash] of [[run.arrival_s, "prompt arrives", "4 3"], [run.first_token_s, "first token", ""]]) {
        el("line", { x1: x(at), x2: x(at), y1: band - 4, y2: lines0 + ids.length * 7, stroke: COLORS.gap, "stroke-dasharray": dash }, g);
        el("text", { x: x(at) + (label === "first token" ? -3 : 3), y: band - 6, "font-size": 10,
          "text-anchor": label === "first token" ? "end" : "start" }, g, label);
      }
      return { name, run, band };
    });
    // Hover or arrow keys pick a step; onStep(policy, index, step, px, py) shows it.
    const cursor = el("rect", { fill: "none", stroke: COLORS.ink, "stroke-width": 1.5, visibility: "hidden" }, svg);
    let current = { row: 0, index: -1 };
    function pick(row, index) {
      const L = layout[row], s = L.run.steps[index];
      if (!s) return;
      current = { row, index };
      cursor.setAttribute("x", x(s[0]) - 1); cursor.setAttribute("width", Math.max(2, x(s[0] + s[1]) - x(s[0]) + 2));
      cursor.setAttribute("y", L.band - 2); cursor.setAttribute("height", 20); cursor.setAttribute("visibility", "visible");
      onStep(L.name, index, s, x(s[0] + s[1] / 2), L.band);
    }
    svg.onmousemove = (e) => {
      const box = svg.getBoundingClientRect(), scaleX = width / box.width;
      const px = (e.clientX - box.left) * scaleX, py = (e.clientY - box.top) * scaleX;
      const row = Math.min(layout.length - 1, Math.max(0, Math.floor(py / rowH)));
      if (py < layout[row].band - 4 || py > layout[row].band + 22 + 7 * streamsShown) { svg.onmouseleave(); return; }
      const t = x.invert(px), steps = layout[row].run.steps;
      let lo = 0, hi = steps.length - 1;
      while (lo < hi) { const mid = (lo + hi + 1) >> 1; if (steps[mid][0] <= t) lo = mid; else hi = mid - 1; }
      if (t >= steps[0][0] && t <= steps[lo][0] + steps[lo][1]) pick(row, lo);
    };
    svg.onmouseleave = () => { cursor.setAttribute("visibility", "hidden"); onStep(null); };
    svg.onkeydown = (e) => {
      const moves = { ArrowRight: [0, 1], ArrowLeft: [0, -1], ArrowDown: [1, 0], ArrowUp: [-1, 0] };
      if (!moves[e.key]) return;
      e.preventDefault();
      const row = Math.min(layout.length - 1, Math.max(0, current.row + moves[e.key][0]));
      const n = layout[row].run.steps.length;
      pick(row, Math.min(n - 1, Math.max(0, (current.index < 0 ? -1 : current.index) + moves[e.key][1])));
    };
  }

  return { COLORS, el, frame, lines, bars, day, timeline, fmt };
})();

// Number formats shared by the page: the same rules as the CLI's tables.
const Fmt = (() => {
  const fixed = (v, digits) => v.toLocaleString("en-US", { minimumFractionDigits: digits, maximumFractionDigits: digits });
  return {
    seconds: (s) => (s < 1 ? `${fixed(s * 1e3, 1)} ms` : `${fixed(s, 2)} s`),
    ratio: (r) => `${fixed(r, 3)}x`,
    fixed,
  };
})();
