// The edge dashboard: one EventSource (the session cookie rides along), views drawn with the DOM
// and hand-made SVG. Everything a worker or client chose (paths, log lines, names) is set as text,
// never as markup.
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const MAX_ROWS = 200;
const MAX_ARCS = 40;
const W = 1000, H = 500;
const state = { topology: [], snapshot: null, requests: [], picked: null, seen: { account: new Set(), worker: new Set(), model: new Set() } };

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else if (k.startsWith("data-")) node.setAttribute(k, v); else node[k] = v;
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(c == null ? "" : String(c)));
  return node;
}
function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (text != null) node.textContent = String(text);
  return node;
}
const fmt = (v, d = 1) => (v == null ? "–" : Number(v).toFixed(d));
const pct = (v) => (v == null ? "–" : (100 * v).toFixed(1) + "%");
const project = (lat, lon) => [((lon + 180) / 360) * W, ((90 - lat) / 180) * H];

// --- tabs -------------------------------------------------------------------------------------
for (const button of document.querySelectorAll("#tabs button")) {
  button.addEventListener("click", () => show(button.dataset.view));
}
function show(view) {
  for (const b of document.querySelectorAll("#tabs button")) b.classList.toggle("active", b.dataset.view === view);
  for (const s of document.querySelectorAll(".view")) s.classList.toggle("active", s.id === "view-" + view);
  if (view === "charts") drawCharts();
}
if (location.hash.length > 1) show(location.hash.slice(1));

// --- the map ----------------------------------------------------------------------------------
const LAND = [
  [[-168, 66], [-140, 70], [-95, 72], [-80, 63], [-60, 55], [-53, 47], [-70, 42], [-81, 31], [-80, 25], [-97, 26], [-97, 20], [-87, 21], [-83, 9], [-78, 8], [-95, 16], [-105, 20], [-117, 32], [-124, 40], [-125, 49], [-135, 58], [-152, 59], [-165, 60]],
  [[-73, 78], [-20, 82], [-20, 70], [-45, 60], [-55, 65]],
  [[-78, 8], [-60, 10], [-50, 0], [-35, -7], [-40, -22], [-48, -28], [-58, -38], [-65, -55], [-72, -50], [-73, -37], [-71, -18], [-81, -5], [-80, 1]],
  [[-10, 36], [-9, 43], [-2, 44], [-5, 48], [2, 51], [8, 54], [10, 58], [5, 62], [15, 69], [28, 71], [40, 67], [60, 68], [80, 73], [105, 78], [140, 72], [180, 68], [170, 60], [160, 52], [142, 47], [135, 35], [127, 35], [122, 31], [121, 22], [110, 20], [106, 10], [100, 13], [100, 3], [104, 1], [98, 8], [94, 16], [90, 22], [80, 15], [77, 8], [72, 20], [66, 25], [57, 25], [56, 27], [50, 30], [48, 29], [55, 22], [52, 16], [43, 13], [35, 28], [34, 36], [28, 41], [26, 38], [22, 37], [20, 40], [15, 38], [12, 44], [8, 44], [3, 42], [-2, 37]],
  [[-17, 21], [-10, 30], [-6, 36], [10, 37], [20, 32], [32, 31], [35, 28], [43, 12], [51, 12], [40, -3], [40, -15], [33, -25], [20, -35], [17, -29], [12, -17], [13, -5], [9, 4], [-8, 5], [-17, 14]],
  [[114, -22], [122, -18], [130, -12], [137, -12], [142, -11], [146, -19], [153, -25], [150, -37], [140, -38], [132, -32], [115, -34]],
  [[130, 31], [135, 34], [140, 36], [142, 40], [141, 45], [145, 44], [140, 41], [137, 37], [132, 34]],
  [[-5, 50], [1, 51], [-1, 55], [-3, 58.5], [-6, 57], [-5, 54]],
];
const map = document.getElementById("map");
const arcs = svg("g", { id: "arcs" });
function drawMap() {
  map.replaceChildren();
  for (let lon = -150; lon <= 150; lon += 30) { const [x] = project(0, lon); map.append(svg("line", { class: "grid", x1: x, y1: 0, x2: x, y2: H })); }
  for (let lat = -60; lat <= 60; lat += 30) { const [, y] = project(lat, 0); map.append(svg("line", { class: "grid", x1: 0, y1: y, x2: W, y2: y })); }
  for (const shape of LAND) map.append(svg("polygon", { class: "land", points: shape.map(([lon, lat]) => project(lat, lon).join(",")).join(" ") }));
  map.append(arcs);
  for (const p of state.topology) {
    const [x, y] = project(p.lat, p.lon);
    const g = svg("g", { id: "pop-" + p.code, class: "pop-group" });
    g.append(svg("circle", { class: p.gpu ? "pop gpu" : "pop", cx: x, cy: y, r: p.gpu ? 7 : 2.5 }));
    if (p.gpu) {
      g.append(svg("circle", { class: "ring", cx: x, cy: y, r: 7, "stroke-opacity": 0 }));
      g.append(svg("text", { class: "label", x: x + 10, y: y - 2 }, p.code));
      g.append(svg("text", { class: "label small", x: x + 10, y: y + 10 }, ""));
    }
    g.append(svg("title", {}, `${p.code} ${p.city}${p.gpu ? " (GPU PoP)" : ""}`));
    map.append(g);
  }
}
function updateMap(snapshot) {
  for (const pop of snapshot.pops) {
    const g = document.getElementById("pop-" + pop.code);
    if (!g) continue;
    const dot = g.querySelector("circle.pop");
    dot.classList.toggle("down", !pop.up);
    g.classList.toggle("down", !pop.up);
    const engines = Object.values(pop.models);
    const sum = (k) => engines.reduce((a, m) => a + (m[k] || 0), 0);
    const small = g.querySelector("text.small");
    if (small) small.textContent = pop.up ? `q ${pop.queue_depth} · run ${sum("running")} · ${fmt(sum("tok_s"), 0)} tok/s` : "down";
    const ring = g.querySelector("circle.ring");
    if (ring) { ring.setAttribute("r", 7 + Math.min(20, 2 * pop.queue_depth)); ring.setAttribute("stroke-opacity", pop.queue_depth ? 0.8 : 0); }
  }
  const cards = document.getElementById("pop-cards");
  cards.replaceChildren(...snapshot.pops.map((pop) => {
    const rows = [["state", pop.up ? "up" : "down"], ["in flight", `${pop.in_flight} / ${pop.max_in_flight}`], ["queue depth", pop.queue_depth]];
    for (const [name, m] of Object.entries(pop.models)) {
      rows.push([name, ""], ["  running / waiting", `${m.running} / ${m.waiting}`], ["  KV blocks used / free", `${m.kv_used} / ${m.kv_free}`],
        ["  decode tok/s", fmt(m.tok_s, 1)], ["  weights · KV", `${m.weights} · ${m.kv_dtype}`]);
    }
    const dl = el("dl");
    for (const [k, v] of rows) dl.append(el("dt", {}, k), el("dd", {}, v));
    return el("div", { class: pop.up ? "card" : "card down", id: "card-" + pop.code, "data-up": String(pop.up) }, el("h3", {}, pop.code), dl);
  }));
}
function drawArc(req) {
  const byCode = Object.fromEntries(state.topology.map((p) => [p.code, p]));
  const ingress = byCode[req.ingress];
  if (!ingress || req.client == null) return;
  const [cx, cy] = project(req.client.lat, req.client.lon);
  const [ix, iy] = project(ingress.lat, ingress.lon);
  const g = svg("g", { class: "arc" });
  g.append(svg("circle", { class: "client", cx, cy, r: 3 }));
  g.append(svg("line", { class: "leg-client", x1: cx, y1: cy, x2: ix, y2: iy }));
  for (const call of req.ai) {
    const pop = byCode[call.pop];
    if (!pop || pop.code === ingress.code) continue; // served where it landed: no backbone leg
    const [px, py] = project(pop.lat, pop.lon);
    const mx = (ix + px) / 2, my = Math.min(iy, py) - 30 - Math.abs(px - ix) / 6;
    g.append(svg("path", { class: "leg-backbone", d: `M${ix},${iy} Q${mx},${my} ${px},${py}` }));
  }
  arcs.append(g);
  while (arcs.childNodes.length > MAX_ARCS) arcs.firstChild.remove();
  setTimeout(() => g.remove(), 4000);
}

// --- the request list and its waterfalls -------------------------------------------------------
const PARTS = [["client", "client_rtt_ms"], ["backbone", "backbone_rtt_ms"], ["queue", "queue_ms"], ["prefill", "prefill_ms"], ["decode", "decode_ms"]];
function waterfall(call, width, height, labels) {
  const s = svg("svg", { class: "wf", width, height, viewBox: `0 0 ${width} ${height}` });
  const modeled = call.modeled && call.modeled.total_ms != null ? call.modeled.total_ms : 0;
  const scale = (width - (labels ? 50 : 2)) / Math.max(call.total_ms || 0, modeled, 0.001);
  let x = 0;
  const barH = labels ? height / 2 - 2 : height;
  for (const [cls, key] of PARTS) {
    const w = Math.max(0, (call[key] || 0) * scale);
    const r = svg("rect", { class: cls, x, y: 0, width: Math.max(w, call[key] ? 1 : 0), height: barH });
    r.append(svg("title", {}, `${cls}: ${fmt(call[key], 2)} ms`));
    s.append(r);
    x += w;
  }
  if (labels) {
    s.append(svg("text", { x: x + 4, y: barH - 2 }, `${fmt(call.total_ms, 1)} ms`));
    if (modeled) {
      s.append(svg("rect", { class: "modeled", x: 0, y: barH + 4, width: modeled * scale, height: barH - 2 }));
      s.append(svg("text", { x: modeled * scale + 4, y: height - 2 }, `${fmt(modeled, 1)} ms modeled`));
    }
  }
  return s;
}
const statusClass = (s) => (s == null ? "sx" : "s" + String(s)[0]);
function matches(req) {
  const f = (id) => document.getElementById(id).value;
  if (f("f-account") && req.account !== f("f-account")) return false;
  if (f("f-worker") && req.worker !== f("f-worker")) return false;
  if (f("f-model") && !req.ai.some((c) => c.model === f("f-model"))) return false;
  const st = f("f-status");
  if (st && (st === "x" ? req.status != null : String(req.status || "")[0] !== st)) return false;
  return true;
}
function row(req) {
  const call = req.ai[0];
  const route = call ? `${req.ingress} → ${req.ai.map((c) => c.pop).join(", ")}` : req.ingress;
  const tr = el("tr", { class: "req", "data-id": String(req.id), "data-pop": call ? call.pop : "", "data-account": req.account, "data-path": req.path },
    el("td", {}, new Date(req.t * 1000).toLocaleTimeString()), el("td", {}, req.account), el("td", {}, req.worker),
    el("td", { class: "path", title: req.path }, `${req.method || req.kind} ${req.path}`),
    el("td", { class: statusClass(req.status) }, req.status == null ? req.outcome : req.status),
    el("td", {}, route), el("td", { title: call ? call.model : "" }, call ? call.model.split("/").pop() : ""), el("td", { class: "num" }, fmt(req.wall_ms, 1)),
    el("td", {}, call ? waterfall(call, 200, 10, false) : el("span", { class: "muted" }, "no AI call")));
  tr.addEventListener("click", () => pick(req));
  if (!matches(req)) tr.hidden = true;
  return tr;
}
function addOption(kind, value) {
  if (!value || state.seen[kind].has(value)) return;
  state.seen[kind].add(value);
  document.getElementById("f-" + kind).append(el("option", { value }, value));
}
function addRequest(req) {
  state.requests.push(req);
  if (state.requests.length > MAX_ROWS) state.requests.shift();
  addOption("account", req.account); addOption("worker", req.worker);
  for (const c of req.ai) addOption("model", c.model);
  const body = document.querySelector("#requests tbody");
  body.prepend(row(req));
  while (body.rows.length > MAX_ROWS) body.lastChild.remove();
  drawArc(req);
}
for (const id of ["f-account", "f-worker", "f-model", "f-status"]) {
  document.getElementById(id).addEventListener("change", () => {
    const byId = Object.fromEntries(state.requests.map((r) => [String(r.id), r]));
    for (const tr of document.querySelectorAll("#requests tbody tr")) tr.hidden = !matches(byId[tr.dataset.id]);
  });
}
function pick(req) {
  for (const tr of document.querySelectorAll("#requests tr.picked")) tr.classList.remove("picked");
  const tr = document.querySelector(`#requests tr[data-id="${req.id}"]`);
  if (tr) tr.classList.add("picked");
  const detail = document.getElementById("detail");
  const parts = [el("h3", {}, `${req.method || req.kind} ${req.path}`),
    el("p", { class: "muted" }, `${req.account} / ${req.worker} · client ${req.client ? req.client.name : "–"} → ${req.ingress} · ${req.status ?? req.outcome} · ${fmt(req.wall_ms, 1)} ms`)];
  req.ai.forEach((call, i) => {
    parts.push(el("p", {}, `AI call ${i + 1}: ${call.model} at ${call.pop}`), waterfall(call, 320, 34, true));
    const t = el("table", {}, el("tr", {}, el("th", {}, ""), el("th", { class: "num" }, "measured"), el("th", { class: "num" }, "modeled full size")));
    const m = call.modeled || {};
    for (const [label, key, mkey] of [["client RTT", "client_rtt_ms"], ["backbone RTT", "backbone_rtt_ms"], ["queue", "queue_ms"],
      ["prefill", "prefill_ms", "prefill_ms"], ["decode", "decode_ms", "decode_ms"], ["TPOT", "tpot_ms", "tpot_ms"], ["TTFT", "ttft_ms", "ttft_ms"], ["total", "total_ms", "total_ms"]]) {
      t.append(el("tr", {}, el("td", {}, label), el("td", { class: "num" }, fmt(call[key], 2)), el("td", { class: "num" }, mkey ? fmt(m[mkey], 2) : "")));
    }
    t.append(el("tr", {}, el("td", {}, "cached tokens"), el("td", { class: "num" }, call.cached_tokens ?? 0), el("td", {}, "")));
    parts.push(t, el("p", { class: "muted" }, `${call.quantization}${m.target ? " · modeled: " + m.target : ""}`));
  });
  if (req.ai_calls > req.ai.length) parts.push(el("p", { class: "muted" }, `${req.ai_calls - req.ai.length} more AI call(s) not shown`));
  for (const g of req.gateway || []) parts.push(el("p", { class: "muted" }, `AI Gateway ${g.gateway}: log ${g.log}${g.cache ? " · cache " + g.cache : ""}`));
  parts.push(el("p", {}, "log lines"), el("pre", {}, req.logs.length ? req.logs.map((l) => `${l.level} ${l.message}`).join("\n") : "(none)"));
  detail.replaceChildren(...parts);
}

// --- accounts and models -----------------------------------------------------------------------
function updateAccounts(accounts) {
  const body = document.querySelector("#accounts tbody");
  body.replaceChildren(...Object.entries(accounts).sort().map(([name, a]) => el("tr", { "data-account": name },
    el("td", {}, name), el("td", { class: "num" }, a.requests), el("td", { class: "num" }, a.tokens_in), el("td", { class: "num" }, a.tokens_out),
    el("td", { class: a.rate_limited ? "num limited hot" : "num limited" }, a.rate_limited), el("td", { class: "num" }, a.seats),
    el("td", { class: "num" }, pct(a.seat_share)), el("td", { class: "num" }, a.kv_blocks), el("td", { class: "num" }, pct(a.kv_share)),
    el("td", { class: "num" }, a.waiting), el("td", { class: "num" }, fmt(a.ttft_p50, 1)), el("td", { class: "num" }, fmt(a.ttft_p99, 1)))));
}
function updateModels(models) {
  const body = document.querySelector("#models tbody");
  body.replaceChildren(...Object.entries(models).sort().map(([name, m]) => {
    const r = m.rollout;
    let signal = el("span", { class: "muted" }, "–");
    if (r && r.p99_ttft_ratio != null) {
      signal = el("span", { class: r.p99_ttft_ratio > r.p99_ttft_ratio_threshold ? "signal over" : "signal under" },
        `${fmt(r.p99_ttft_ratio, 2)}× (roll back past ${r.p99_ttft_ratio_threshold}×)`);
    } else if (r) signal = el("span", { class: "muted" }, `no calls on both sides yet (threshold ${r.p99_ttft_ratio_threshold}×)`);
    return el("tr", { "data-model": name }, el("td", {}, name), el("td", {}, m.pops.join(", ")), el("td", {}, m.weights.join(", ")),
      el("td", {}, m.kv_dtype.join(", ")), el("td", {}, r ? `canary ${r.share}% → ${r.new}` : "none"), el("td", {}, signal),
      el("td", { class: "muted" }, r ? r.perplexity : ""));
  }));
}

// --- AI Search: each instance's indexing (documents done of all, chunks, errors) ---------------
function updateSearch(rows) {
  const body = document.querySelector("#ai-search tbody");
  body.replaceChildren(...(rows || []).map((r) => {
    const done = r.completed + r.error + r.skipped;
    const bar = el("progress", { max: String(Math.max(1, r.documents)), value: String(done) });
    return el("tr", { "data-instance": `${r.account}/${r.namespace}/${r.instance}` },
      el("td", {}, r.account), el("td", {}, r.namespace), el("td", {}, r.instance),
      el("td", {}, bar, ` ${done} / ${r.documents}`), el("td", { class: "num" }, r.queued + r.running),
      el("td", { class: "num" }, r.chunks), el("td", { class: r.error ? "num limited hot" : "num" }, r.error),
      el("td", { class: "muted" }, r.last_error || ""));
  }));
}

// --- charts: the last 10 minutes ---------------------------------------------------------------
const CHARTS = [
  ["output tokens / s", [["tok_s", "tok/s"]]], ["requests / s", [["req_s", "req/s"]]],
  ["TTFT (ms)", [["ttft_p50", "p50"], ["ttft_p99", "p99"]]], ["TPOT (ms)", [["tpot_p50", "p50"], ["tpot_p99", "p99"]]],
  ["end-to-end latency (ms)", [["e2e_p50", "p50"], ["e2e_p99", "p99"]]],
];
function drawCharts() {
  const series = (state.snapshot && state.snapshot.series) || [];
  const now = state.snapshot ? state.snapshot.t : Date.now() / 1000;
  const box = document.getElementById("charts");
  box.replaceChildren(...CHARTS.map(([title, keys]) => {
    const w = 400, h = 180, left = 44, bottom = 18;
    const s = svg("svg", { viewBox: `0 0 ${w} ${h}`, preserveAspectRatio: "none" });
    let top = 0;
    for (const [k] of keys) for (const p of series) if (p[k] != null) top = Math.max(top, p[k]);
    top = top || 1;
    const x = (t) => left + ((t - (now - 600)) / 600) * (w - left - 4);
    const y = (v) => h - bottom - (v / top) * (h - bottom - 8);
    s.append(svg("line", { class: "axis", x1: left, y1: h - bottom, x2: w, y2: h - bottom }), svg("line", { class: "axis", x1: left, y1: 4, x2: left, y2: h - bottom }));
    s.append(svg("text", { x: 2, y: 12 }, fmt(top, top < 10 ? 2 : 0)), svg("text", { x: 2, y: h - bottom }, "0"));
    s.append(svg("text", { x: left, y: h - 4 }, "−10 min"), svg("text", { x: w - 30, y: h - 4 }, "now"));
    keys.forEach(([k, label], i) => {
      const pts = series.filter((p) => p[k] != null && p.t >= now - 600).map((p) => `${x(p.t).toFixed(1)},${y(p[k]).toFixed(1)}`);
      if (pts.length) s.append(svg("polyline", { class: "s" + i, points: pts.join(" ") }));
      for (const pt of pts) { const [px, py] = pt.split(","); s.append(svg("circle", { class: "dot" + i, cx: px, cy: py, r: 2 })); }
      s.append(svg("rect", { class: "key" + i, x: w - 120 + i * 55, y: 4, width: 8, height: 8 }), svg("text", { x: w - 108 + i * 55, y: 12 }, label));
    });
    return el("div", { class: "chart" }, el("h3", {}, title), s);
  }));
}

// --- the stream --------------------------------------------------------------------------------
const conn = document.getElementById("conn");
const events = new EventSource("/cdn-cgi/edge/dashboard/events");
events.addEventListener("open", () => { conn.textContent = "live"; conn.className = "conn live"; });
events.addEventListener("error", () => { conn.textContent = "reconnecting…"; conn.className = "conn lost"; });
events.addEventListener("topology", (e) => { state.topology = JSON.parse(e.data).pops; drawMap(); if (state.snapshot) updateMap(state.snapshot); });
events.addEventListener("snapshot", (e) => {
  const snapshot = JSON.parse(e.data);
  state.snapshot = snapshot;
  updateMap(snapshot); updateAccounts(snapshot.accounts); updateModels(snapshot.models); updateSearch(snapshot.ai_search);
  if (document.getElementById("view-charts").classList.contains("active")) drawCharts();
});
events.addEventListener("request", (e) => {
  const req = JSON.parse(e.data);
  if (state.requests.some((r) => r.id === req.id)) return; // a reconnect sends the window again
  addRequest(req);
});
events.addEventListener("dropped", (e) => { conn.textContent = `live (${JSON.parse(e.data).requests} request events dropped: this tab fell behind)`; });
