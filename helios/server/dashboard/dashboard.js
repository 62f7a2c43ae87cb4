// The flare dashboard: polls /debug/stats and /debug/decisions once a second, draws the charts with
// uPlot and keeps the newest decisions in a table whose rows expand to the alternatives and prices.
// Plain browser JavaScript, no build step. docs/server.md describes every field.
"use strict";

const POLL_MS = 1000;
const HISTORY = 300;     // chart points kept (5 minutes at one poll a second)
const MAX_ROWS = 400;    // decisions kept in the table
const COHORT_ROWS = 12;  // cohort lanes listed in an opened row
const KEY_STORE = "flare-api-key";

const $ = (id) => document.getElementById(id);
let apiKey = sessionStorage.getItem(KEY_STORE) || "";
let lastSeq = 0;
let lastStats = null;
const rows = [];         // decisions in the table, newest first
const series = { x: [], throughput: [], ttft50: [], ttft99: [], gap50: [], gap99: [], running: [], waiting: [], free: [] };
let charts = null;

async function getJSON(url) {
  const headers = apiKey ? { Authorization: "Bearer " + apiKey } : {};
  const r = await fetch(url, { headers, cache: "no-store" });
  if (r.status === 401) {
    const key = prompt("This server needs its API key for /debug:");
    if (key) { apiKey = key; sessionStorage.setItem(KEY_STORE, key); }
    throw new Error("the server asks for an API key");
  }
  if (!r.ok) throw new Error(url + ": HTTP " + r.status);
  return r.json();
}

function fmt(v, digits = 3) {
  if (v === null || v === undefined || Number.isNaN(v)) return "–";
  if (v === 0) return "0";
  const a = Math.abs(v);
  return a >= 1e5 || a < 1e-3 ? v.toExponential(digits - 1) : Number(v.toPrecision(digits)).toString();
}
const ms = (v) => (v === null || v === undefined ? "–" : v.toFixed(v < 10 ? 2 : 1));
const pct = (p) => (p ? `${ms(p.p50)} / ${ms(p.p90)} / ${ms(p.p99)}` : "–");
const who = (r) => (r.id || "#" + r.handle) + (r.class ? ` (${r.class})` : "");

// ---- charts --------------------------------------------------------------------------------
function chartWidth() {
  return Math.max(300, Math.min(560, Math.floor((window.innerWidth - 120) / 3)));  // three abreast when they fit
}

function makeChart(el, lines, yLabel) {
  const opts = {
    width: chartWidth(), height: 180, legend: { live: false },
    scales: { x: { time: true } },
    axes: [{}, { label: yLabel, size: 56 }],
    series: [{}, ...lines.map(([label, stroke, dash]) => ({ label, stroke, width: 1.5, dash, points: { show: false } }))],
  };
  return new uPlot(opts, [[], ...lines.map(() => [])], el);
}

function initCharts() {
  charts = {
    throughput: makeChart($("chart-throughput"), [["tokens/s", "#1f6feb"]], "tokens/s"),
    latency: makeChart($("chart-latency"), [["TTFT p50", "#0b6e4f"], ["TTFT p99", "#0b6e4f", [5, 4]],
      ["gap p50", "#b35900"], ["gap p99", "#b35900", [5, 4]]], "ms"),
    queue: makeChart($("chart-queue"), [["running", "#1f6feb"], ["waiting", "#b3261e"], ["free slots", "#6a7380", [4, 3]]], "requests"),
  };
  window.addEventListener("resize", () => {
    for (const c of Object.values(charts)) c.setSize({ width: chartWidth(), height: 180 });
  });
}

function push(name, value) {
  const a = series[name];
  a.push(value);
  if (a.length > HISTORY) a.shift();
}

function onStats(s) {
  const now = Date.now() / 1000;
  let rate = null;
  if (lastStats && s.t > lastStats.t) rate = (s.output_tokens - lastStats.output_tokens) / (s.t - lastStats.t);
  lastStats = s;
  const lat = s.latency;
  push("x", now); push("throughput", rate);
  push("ttft50", lat.ttft_ms ? lat.ttft_ms.p50 : null); push("ttft99", lat.ttft_ms ? lat.ttft_ms.p99 : null);
  push("gap50", lat.gap_ms ? lat.gap_ms.p50 : null); push("gap99", lat.gap_ms ? lat.gap_ms.p99 : null);
  push("running", s.running); push("waiting", s.waiting); push("free", s.free_slots);
  charts.throughput.setData([series.x, series.throughput]);
  charts.latency.setData([series.x, series.ttft50, series.ttft99, series.gap50, series.gap99]);
  charts.queue.setData([series.x, series.running, series.waiting, series.free]);
  $("tile-throughput").textContent = rate === null ? "–" : fmt(rate, 4);
  $("tile-ttft").textContent = pct(lat.ttft_ms);
  $("tile-gap").textContent = pct(lat.gap_ms);
  $("tile-slots").textContent = `${s.running} / ${s.waiting} / ${s.slots}`;
  $("tile-decisions").textContent = String(s.decisions.recorded);
  renderClasses(lat.classes || {});
}

function renderClasses(classes) {
  const names = Object.keys(classes);
  $("classes-section").hidden = names.length === 0;
  const body = $("classes").tBodies[0];
  body.replaceChildren(...names.map((name) => {
    const c = classes[name];
    return tr([name, c.requests, c.output_tokens, ms(c.ttft_ms && c.ttft_ms.p50), ms(c.ttft_ms && c.ttft_ms.p99),
      ms(c.gap_ms && c.gap_ms.p50), ms(c.gap_ms && c.gap_ms.p99)]);
  }));
}

// ---- the decision table --------------------------------------------------------------------
function tr(cells, cls) {
  const row = document.createElement("tr");
  if (cls) row.className = cls;
  for (const c of cells) {
    const td = document.createElement("td");
    if (c instanceof Node) td.appendChild(c); else td.textContent = c;
    row.appendChild(td);
  }
  return row;
}

function table(head, body) {
  const t = document.createElement("table");
  const h = t.appendChild(document.createElement("tr"));
  for (const name of head) h.appendChild(document.createElement("th")).textContent = name;
  for (const cells of body) t.appendChild(tr(cells));
  return t;
}

function cohortText(d) {
  const n = d.cohort.length;
  const names = d.cohort.slice(0, 4).map(who).join(", ");
  return `${n}: ${names}${n > 4 ? ", …" : ""}`;
}

function decisionRow(d) {
  const alt = d.alternatives[0];
  const ratio = alt && alt.value_rate !== null && d.value_rate ? ` (${fmt(alt.value_rate / d.value_rate, 2)}×)` : "";
  const row = tr([d.seq, d.t.toFixed(3), d.graph, d.reason, cohortText(d), ms(d.estimated_ms), ms(d.measured_ms),
    fmt(d.value_rate), alt ? alt.graph : (d.candidates === null ? "–" : "none in full"), alt ? fmt(alt.value_rate) + ratio : "–"],
    "decision reason-" + d.reason);
  row.dataset.seq = d.seq;
  row.dataset.graph = d.graph;
  row.children[4].className = "cohort-cell";
  row.addEventListener("click", () => toggle(row, d));
  row.decision = d;
  return row;
}

function detailRow(d) {
  const grid = document.createElement("div");
  grid.className = "detail-grid";
  grid.appendChild(table(["alternative", "est ms", "requests", "value rate", "vs chosen", "would serve"],
    d.alternatives.map((a) => [a.graph, ms(a.estimated_ms), a.cohort_size, fmt(a.value_rate),
      a.value_rate !== null && d.value_rate ? fmt(a.value_rate / d.value_rate, 2) + "×" : "–",
      a.cohort ? a.cohort.slice(0, 3).map(who).join(", ") + (a.cohort.length > 3 ? ", …" : "") : "–"])));
  if (d.prices) {
    const p = d.prices;
    grid.appendChild(table([`decoding (${p.decoding_count}): top next-token value`, "price"],
      p.decoding.map((r) => [who(r), fmt(r.price)])));
    grid.appendChild(table([`waiting (${p.waiting_count}): top prompt-token price`, "price"],
      p.waiting.map((r) => [who(r), fmt(r.price)])));
  }
  const shown = d.cohort.slice(0, COHORT_ROWS).map((r) => [who(r), r.prompt_tokens, r.output_rows, fmt(r.value)]);
  if (d.cohort.length > COHORT_ROWS) shown.push([`… ${d.cohort.length - COHORT_ROWS} more`, "", "", ""]);
  grid.appendChild(table([`cohort (${d.cohort.length})`, "prompt tokens", "output rows", "lane value"], shown));
  const note = document.createElement("div");
  note.className = "sub";
  note.textContent = `execution class ${d.execution_class}; ${d.candidates ?? "?"} candidates evaluated in full ` +
    `(a capacity whose best possible rate is provably below the winner's is not); ` +
    `values share the factor e^-${fmt(d.log_scale)} (log10 unscaled rate ${fmt(d.value_rate_log10)})`;
  grid.appendChild(note);
  const row = tr([grid], "detail");
  row.firstChild.colSpan = 10;
  return row;
}

function toggle(row, d) {
  if (row.detail) { row.detail.remove(); row.detail = null; row.classList.remove("open"); return; }
  row.detail = detailRow(d);
  row.after(row.detail);
  row.classList.add("open");
}

function matches(d, text) {
  if (!text) return true;
  const hit = (r) => String(r.handle) === text || (r.id && r.id.includes(text));
  return d.cohort.some(hit) || (d.prices && (d.prices.waiting.some(hit) || d.prices.decoding.some(hit)));
}

function applyFilter() {
  const text = $("filter").value.trim();
  for (const row of $("decisions").tBodies[0].querySelectorAll("tr.decision")) {
    const show = matches(row.decision, text);
    row.hidden = !show;
    if (row.detail) row.detail.hidden = !show;
  }
}

function onDecisions(body) {
  const fresh = body.data;
  if (!fresh.length) return;
  lastSeq = body.last;
  const text = $("filter").value.trim();
  const tbody = $("decisions").tBodies[0];
  const frag = document.createDocumentFragment();
  for (const d of fresh.slice(-MAX_ROWS).reverse()) {
    const row = decisionRow(d);
    row.hidden = !matches(d, text);
    frag.appendChild(row);
    rows.unshift(row);
  }
  tbody.insertBefore(frag, tbody.firstChild);
  while (rows.length > MAX_ROWS) {
    const old = rows.pop();
    if (old.detail) old.detail.remove();
    old.remove();
  }
  $("decision-count").textContent = `${rows.length} shown of ${body.recorded} recorded (the server keeps ${body.capacity})`;
}

async function tick() {
  if (!$("pause").checked) {
    try {
      const [stats, decisions] = await Promise.all([getJSON("/debug/stats"), getJSON(`/debug/decisions?since=${lastSeq}`)]);
      onStats(stats);
      onDecisions(decisions);
      $("status").textContent = "live · " + new Date().toLocaleTimeString();
      $("status").className = "status";
    } catch (err) {
      $("status").textContent = String(err.message || err);
      $("status").className = "status error";
    }
  }
  setTimeout(tick, POLL_MS);
}

initCharts();
$("filter").addEventListener("input", applyFilter);
tick();
