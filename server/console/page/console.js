// The console page: draws the feed of docs/console.md (hello, then a tick a
// second) with uPlot, and sends controls with the token from the page's URL.
"use strict";

const token = new URLSearchParams(location.search).get("token") || "";
const series = {};          // key -> {t: [], v: []}: the history, then each tick's sample
const charts = {};          // chart id -> {plot, keys}
window.tetherCharts = charts;  // for tests and the curious: each chart's uPlot
let socket = null;
let retryMs = 500;

function el(tag, attrs, text) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

// uPlot wants one x array for all of a chart's series: the union of their times.
function aligned(keys) {
  const xs = new Set();
  for (const k of keys) for (const t of series[k].t) xs.add(t);
  const x = Array.from(xs).sort((a, b) => a - b);
  const index = new Map(x.map((t, i) => [t, i]));
  const data = [x];
  for (const k of keys) {
    const ys = new Array(x.length).fill(null);
    const s = series[k];
    for (let i = 0; i < s.t.length; i++) ys[index.get(s.t[i])] = s.v[i];
    data.push(ys);
  }
  return data;
}

// Which series each chart draws (keys as the feed names them), on which y axes: every axis has
// one unit ([unit, key test]; a key goes on the first axis whose test it passes; a second axis is
// drawn on the right). A chart with `band` draws each <prefix>/return_mean as a line and its
// return_min and return_max as a shaded band around it, not as three lines.
const CHARTS = [
  {id: "returns", title: "Return: whole episode (grey) and per module. Line: mean; band: min to max", band: true,
   axes: [["return", k => /^(episode|module\/[^/]+)\/return_(mean|min|max)$/.test(k)]]},
  {id: "returns_type", title: "Return per agent type and group. Line: mean; band: min to max", band: true,
   axes: [["return", k => /^agent_type\/[^/]+\/return_(mean|min|max)$/.test(k)]]},
  {id: "length", title: "Episode length (mean): whole episode, per module, per agent type and group",
   axes: [["env steps", k => k === "episode/length_mean" || /^(module|agent_type)\/[^/]+\/length_mean$/.test(k)]]},
  {id: "losses", title: "Policy loss (left axis) and value loss (right axis, dashed)",
   axes: [["policy loss", k => /^module\/[^/]+\/policy_loss$/.test(k)],
          ["value loss", k => /^module\/[^/]+\/value_loss$/.test(k)]]},
  {id: "entropy", title: "Policy entropy", axes: [["nats", k => /^module\/[^/]+\/entropy$/.test(k)]]},
  {id: "cloning", title: "Behaviour cloning: loss (left), logged share of the batch and demo coefficient (right)",
   axes: [["BC loss", k => /^module\/[^/]+\/(bc_loss|demo_bc_loss)$/.test(k)],
          ["fraction", k => /^module\/[^/]+\/(logged_fraction|demo_coef)$/.test(k)]]},
  {id: "self_play", title: "Self-play Elo ratings: each learning module and its latest snapshot (dashed)",
   order: ["rating", "latest_snapshot_rating"],
   axes: [["Elo", k => /^self_play\/[^/]+\/(rating|latest_snapshot_rating)$/.test(k)]]},
  {id: "curriculum", title: "Curriculum: lesson (left) and the mean of its measure (right)",
   axes: [["lesson", k => k === "curriculum/lesson"], ["measure", k => k === "curriculum/measure"]]},
  {id: "env_params", title: "Environment parameters (a sampler at its centre)",
   axes: [["value", k => /^curriculum\/param\//.test(k)]]},
  {id: "kl", title: "Approx. KL (left) and clip fraction (right)",
   axes: [["KL (nats)", k => /^module\/[^/]+\/approx_kl$/.test(k)],
          ["clip fraction", k => /^module\/[^/]+\/clipfrac$/.test(k)]]},
  {id: "ev", title: "Explained variance of the value function (1: perfect)",
   axes: [["explained var.", k => /^module\/[^/]+\/explained_variance$/.test(k)]]},
  {id: "lr", title: "Learning rate (left) and entropy coefficient (right)",
   axes: [["learning rate", k => /^module\/[^/]+\/lr$/.test(k)],
          ["entropy coef.", k => /^module\/[^/]+\/ent_coef$/.test(k)]]},
  {id: "weights", title: "Weights version per module (left) and updates (right)",
   axes: [["version", k => /^module\/[^/]+\/weights_seq_no$/.test(k)], ["updates", k => k === "charts/updates"]]},
  {id: "throughput", title: "Throughput", axes: [["env steps/s", k => k === "charts/env_steps_per_s"]]},
  {id: "ranks", title: "Per rank: env steps/s ingested (left) and connected clients (right, dashed)",
   order: ["env_steps_per_s", "clients"],
   axes: [["env steps/s", k => /^rank\/\d+\/env_steps_per_s$/.test(k)], ["clients", k => /^rank\/\d+\/clients$/.test(k)]]},
  {id: "timing", title: "Update time and ONNX export time (dashed)", order: ["update_s", "export_s"],
   axes: [["seconds", k => /^module\/[^/]+\/(update_s|export_s)$/.test(k)]]},
  // The server's health, one unit a chart (it used to put ms, steps and MB on one axis).
  {id: "health_lag", title: "Event loop lag (worst lateness of a 100 ms timer each second)", height: 150,
   axes: [["ms", k => k === "health/loop_lag_ms"]]},
  {id: "health_steps", title: "Agent steps waiting for an update; stale steps refused and dropped (total)", height: 150,
   axes: [["steps", k => k === "health/pool_steps" || k === "charts/samples_refused_stale" ||
                         k === "charts/samples_dropped_stale"]]},
  {id: "health_memory", title: "Server memory (resident)", height: 150, axes: [["MB", k => k === "health/rss_mb"]]},
];

// Readable series names. A metric of a module, agent type or self-play module is "<name>: <metric>".
const METRIC_NAMES = {
  env_steps_per_s: "env steps/s", clients: "clients", pool_steps: "steps waiting", rss_mb: "memory (MB)",
  loop_lag_ms: "event loop lag (ms)",
  return_mean: "mean return", return_min: "min return", return_max: "max return", length_mean: "mean length",
  agent_return_mean: "mean return per agent", policy_loss: "policy loss", value_loss: "value loss",
  entropy: "entropy", approx_kl: "approx. KL", clipfrac: "clip fraction", explained_variance: "explained variance",
  update_s: "update time (s)", export_s: "ONNX export time (s)", update_trials: "update tries", lr: "learning rate",
  ent_coef: "entropy coef.", weights_seq_no: "weights version", bc_loss: "BC loss (logged steps)",
  demo_bc_loss: "BC loss (demos)", logged_fraction: "logged share", demo_coef: "demo coefficient",
  rating: "Elo", latest_snapshot_rating: "latest snapshot's Elo", snapshots: "snapshots held",
};
const KEY_NAMES = {
  "episode/count": "episodes finished", "charts/env_steps": "env steps", "charts/agent_steps": "agent steps",
  "charts/env_steps_per_s": "env steps/s", "charts/updates": "updates", "charts/updates_discarded": "updates discarded",
  "charts/samples_dropped_stale": "stale steps dropped", "charts/samples_refused_stale": "stale steps refused",
  "charts/batches_duplicate": "duplicate batches", "charts/clients_connected": "clients connected",
  "health/loop_lag_ms": "event loop lag (ms)", "health/pool_steps": "steps waiting for an update",
  "health/rss_mb": "memory (MB)", "health/paused": "paused", "self_play/games_rated": "games rated",
  "curriculum/lesson": "lesson", "curriculum/measure": "measure (mean)", "curriculum/seq": "parameter set",
};

const words = s => s.replace(/_/g, " ").trim();
const groups = new Set();   // the run's groups (hello's run.groups): their returns count as an agent type's

function seriesLabel(key) {
  if (KEY_NAMES[key]) return KEY_NAMES[key];
  const parts = key.split("/");
  const metric = parts[parts.length - 1];
  const what = METRIC_NAMES[metric] || words(metric);
  const name = parts.slice(1, -1).join(" ");
  if (parts.length >= 3 && (parts[0] === "module" || parts[0] === "self_play")) return `${name}: ${what}`;
  if (parts.length === 3 && parts[0] === "rank") return `rank ${parts[1]}: ${what}`;
  if (parts.length >= 3 && parts[0] === "agent_type") return `${name} (${groups.has(name) ? "group" : "agent type"}): ${what}`;
  if (parts.length === 2 && parts[0] === "episode") return `episode: ${what}`;
  if (parts.length === 2 && (parts[0] === "charts" || parts[0] === "health")) return what;
  if (parts.length === 3 && parts[0] === "curriculum" && parts[1] === "param") return `parameter ${words(metric)}`;
  // Unknown keys: words, never the raw key.
  return parts.length === 1 ? words(key) : `${parts.slice(0, -1).map(words).join(" ")}: ${what}`;
}

// One colour per module or agent type in every chart (a module and the agent type of the same
// name share it); the whole episode is grey; the server's own series (no module) take colours
// from the palette's other end, in each chart's order.
const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#ff9da7", "#3b3b98"];
const colours = {episode: "#6b6b6b"};
function entityOf(key) {
  const parts = key.split("/");
  if (parts.length >= 3 && ["module", "agent_type", "self_play"].includes(parts[0])) return parts.slice(1, -1).join("/");
  if (parts.length === 3 && parts[0] === "rank") return `rank ${parts[1]}`;
  return parts[0] === "episode" ? "episode" : null;
}
function colourOf(entity) {
  if (!(entity in colours)) colours[entity] = PALETTE[(Object.keys(colours).length - 1) % PALETTE.length];
  return colours[entity];
}
const LABEL_FONT = "bold 11px system-ui, sans-serif";
const DASHES = [undefined, [6, 4], [2, 3], [10, 3, 2, 3]];

// Numbers as a glance wants them: three significant digits, whole numbers from 100 on.
function fmt(v) {
  if (v == null || !Number.isFinite(v)) return "–";
  return Math.abs(v) >= 100 ? String(Math.round(v)) : String(Number(v.toPrecision(3)));
}

function lastIndex(ys) {
  for (let i = ys.length - 1; i >= 0; i--) if (ys[i] != null) return i;
  return null;
}

// Series in a legend's reading order: the whole episode, modules, agent types, the rest; a
// module's metrics in the chart's `order` (the first drawn solid, the next dashed).
const PREFIX_RANK = {episode: 0, module: 1, self_play: 1, agent_type: 2};
function seriesOrder(spec) {
  const rank = k => PREFIX_RANK[k.split("/")[0]] ?? 3;
  const metricRank = k => (spec.order || []).indexOf(k.split("/").pop()) >>> 0;   // unlisted (-1) last
  return (a, b) => rank(a) - rank(b) || (entityOf(a) ?? "").localeCompare(entityOf(b) ?? "") ||
    metricRank(a) - metricRank(b) || a.localeCompare(b);
}

// The series of a chart in drawing order, each {key, axis, band: {min, max} keys for a mean}.
function layout(spec, keys) {
  const mine = [];
  spec.axes.forEach(([, test], axis) => {
    const taken = keys.filter(k => test(k) && !mine.some(m => m.key === k)).sort(seriesOrder(spec));
    for (const k of taken) mine.push({key: k, axis});
  });
  if (!spec.band) return mine;
  // Band charts: one group per <prefix>/return_, the whole episode first; its mean, then its edges.
  const byPrefix = {};
  for (const m of mine) {
    const [, prefix, which] = m.key.match(/^(.*)\/return_(mean|min|max)$/);
    (byPrefix[prefix] = byPrefix[prefix] || {})[which] = m;
  }
  const order = Object.keys(byPrefix).sort((a, b) => (b === "episode") - (a === "episode") || a.localeCompare(b));
  const out = [];
  for (const prefix of order) {
    const g = byPrefix[prefix];
    if (g.mean) out.push({...g.mean, band: g.min && g.max ? {min: g.min.key, max: g.max.key} : null});
    for (const edge of ["min", "max"]) if (g[edge]) out.push({...g[edge], edge: true});
  }
  return out;
}

// A y axis wide enough for its longest tick label (uPlot's default is a fixed 50 px).
function axisSize(u, values, axisIdx, cycleNum) {
  const axis = u.axes[axisIdx];
  if (cycleNum > 1) return axis._size;
  const longest = (values || []).reduce((n, v) => Math.max(n, String(v).length), 0);
  return axis.ticks.size + axis.gap + Math.ceil(longest * 6.5) + 4;
}

// The cursor picks each series' nearest point (series sampled at other times hold nulls in the
// shared x array), unless that is far: then the legend shows "–" for it.
function nearestPoint(u, si, idx) {
  const ys = u.data[si];
  if (idx == null || ys[idx] != null) return idx;
  for (let d = 1; d <= 16; d++) {
    if (ys[idx - d] != null) return idx - d;
    if (ys[idx + d] != null) return idx + d;
  }
  return null;
}

function makeChart(spec, series_, box, data) {
  const scales = [...new Set(series_.map(s => s.axis))];   // the axes that have series, left first
  const index = {};
  series_.forEach((s, i) => { index[s.key] = i + 1; });
  const perEntity = {};
  const bands = [], bandOf = {};
  let own = 0;
  const ySeries = series_.map((s, i) => {
    const entity = entityOf(s.key) ?? s.key;
    const colour = entityOf(s.key) == null ? PALETTE[PALETTE.length - 1 - own++ % PALETTE.length] : colourOf(entity);
    const opts = {label: seriesLabel(s.key), scale: "y" + s.axis, spanGaps: true};
    if (s.edge) {
      // The band's edges: faint, and left out of the legend (the mean's value names them).
      return {...opts, stroke: colour + "55", width: 1, points: {show: false}, class: "band-edge"};
    }
    const nth = perEntity[entity] = (perEntity[entity] ?? -1) + 1;   // a module's 2nd metric here is dashed
    if (s.band) {
      const band = {min: index[s.band.min], max: index[s.band.max]};
      bandOf[i + 1] = band;
      bands.push({series: [band.max, band.min], colour});
    }
    return {...opts, stroke: colour, width: entity === "episode" ? 1.5 : 2, dash: DASHES[nth % DASHES.length]};
  });
  // Fainter bands the more of them overlap (a self-play run has one per snapshot module).
  const alpha = Math.round(255 * 0.22 / Math.sqrt(bands.length || 1)).toString(16).padStart(2, "0");
  for (const band of bands) band.fill = band.colour + alpha;
  const value = (u, v, si, idx) => {
    // Off the chart the legend shows each series' latest value; on it, the value under the cursor.
    if (u.cursor.idx == null) {
      idx = lastIndex(u.data[si]);
      v = idx == null ? null : u.data[si][idx];
    }
    if (si === 0) return v == null ? "–" : `${Math.round(v)} s`;
    const band = bandOf[si];
    if (band && v != null) return `${fmt(v)} (min ${fmt(u.data[band.min][idx])}, max ${fmt(u.data[band.max][idx])})`;
    return fmt(v);
  };
  const opts = {
    width: Math.max(380, box.clientWidth - 12), height: spec.height || 200,
    scales: {x: {time: false}},
    series: [{label: "time", value}].concat(ySeries.map(s => ({...s, value}))),
    bands,
    // Every y axis is labelled with its unit; a second one is on the right, without a grid of its own.
    axes: [{label: "seconds since start", labelSize: 18, labelFont: LABEL_FONT}].concat(scales.map((axis, i) => ({
      scale: "y" + axis, label: spec.axes[axis][0], labelSize: 20, labelFont: LABEL_FONT,
      side: i === 0 ? 3 : 1, grid: {show: i === 0}, size: axisSize,
    }))),
    cursor: {drag: {x: true, y: false}, dataIdx: nearestPoint},   // drag to zoom over the whole run
    hooks: {setSeries: [(u, si, o) => {
      // Hiding a mean (a click on its legend row) hides its band too.
      const band = bandOf[si];
      if (band && o.show != null) for (const edge of [band.min, band.max]) {
        if (u.series[edge].show !== o.show) u.setSeries(edge, {show: o.show});
      }
    }]},
  };
  return new uPlot(opts, data, box);
}

function chartBox(spec) {
  let box = document.getElementById("chart-" + spec.id);
  if (box) return box;
  box = el("div", {class: "chart", id: "chart-" + spec.id});
  box.appendChild(el("h3", {}, spec.title));
  // In the order of CHARTS, whatever order their series first arrive in.
  const later = CHARTS.slice(CHARTS.indexOf(spec) + 1).map(c => document.getElementById("chart-" + c.id)).find(Boolean);
  document.getElementById("charts").insertBefore(box, later || null);
  return box;
}

function drawCharts() {
  const keys = Object.keys(series).sort();
  for (const spec of CHARTS) {
    const mine = layout(spec, keys);
    if (mine.length === 0) continue;
    const order = mine.map(s => s.key);
    let chart = charts[spec.id];
    if (!chart || chart.keys.join("|") !== order.join("|")) {
      if (chart) chart.plot.destroy();
      const box = chartBox(spec);
      chart = charts[spec.id] = {plot: makeChart(spec, mine, box, aligned(order)), keys: order};
    } else {
      // Follow the newest points unless the user zoomed into the past (drag to zoom, double-click to reset).
      const data = aligned(order);
      const x = chart.plot.scales.x;
      const shown = chart.plot.data[0];
      const following = x.max == null || shown.length === 0 || x.max >= shown[shown.length - 1];
      chart.plot.setData(data, following);
      if (!following) chart.plot.setLegend();   // (setData redraws the legend only when it rescales)
    }
  }
}

function renderClients(clients, reconnects) {
  const body = document.querySelector("#clients tbody");
  body.replaceChildren();
  for (const c of clients) {
    const weights = Object.entries(c.weights).map(([m, v]) => `${m} v${v} (${c.staleness[m] ?? "?"})`).join(", ");
    const row = el("tr", {class: c.connected ? "client" : "client gone", "data-id": c.id, "data-rank": c.rank ?? ""});
    // (several ranks: each rank numbers its own clients, so an id is shown with its rank)
    for (const cell of [c.rank == null ? c.id : `r${c.rank}:${c.id}`, c.address, (c.client_name ?? "") + (c.sdk ? ` (${c.sdk})` : ""), c.protocol_version ?? "v1", weights, c.env_steps_per_s,
                        c.batches, c.env_steps, `${c.last_seen_s_ago.toFixed(1)} s ago`, c.round_trip_ms ?? "",
                        c.errors, (c.connected ? "connected" : "gone") + (c.reconnects ? `, reconnect ${c.reconnects}` : "")]) {
      row.appendChild(el("td", {}, String(cell)));
    }
    body.appendChild(row);
  }
  document.getElementById("reconnects").textContent = `reconnects: ${reconnects}`;
}

// Several ranks (docs/scale-out.md): each rank's clients, ingest and health, and the clients it redirected.
function renderRanks(ranks) {
  const panel = document.getElementById("ranks-panel");
  panel.hidden = !ranks;
  if (!ranks) return;
  const body = document.querySelector("#ranks tbody");
  body.replaceChildren();
  for (const r of ranks) {
    const row = el("tr", {"data-rank": r.rank});
    const redirected = r.redirected.map((n, to) => n ? `${n} to rank ${to}` : "").filter(Boolean).join(", ");
    for (const cell of [r.rank, r.address ?? "", r.clients_connected, r.env_steps, fmt(r.env_steps_per_s),
                        r.samples_refused_stale, r.clients_refused, r.pool_steps, fmt(r.rss_mb),
                        fmt(r.loop_lag_ms), redirected || "none"]) {
      row.appendChild(el("td", {}, String(cell)));
    }
    body.appendChild(row);
  }
}

// A curriculum change (a control, or a lesson the measure advanced): what it set.
function eventText(e) {
  const what = e.name !== undefined ? `${e.name} = ${paramText(e.value)}; ` : "";
  const why = e.measure !== undefined ? ` (measure ${Number(e.measure).toFixed(3)})` : "";
  return `${what}parameter set ${e.set_seq}, lesson ${e.lesson}${why}`;
}

function renderErrors(errors, prepend) {
  const body = document.querySelector("#errors tbody");
  if (!prepend) body.replaceChildren();
  for (const e of errors.slice().reverse()) {  // newest first
    const row = el("tr", {class: e.kind === "error" ? "error" : "event", "data-seq": e.seq});
    const who = e.client ? `#${e.client.id} ${e.client.name ?? ""} ${e.client.address}` : "";
    const what = e.code ?? e.action ?? e.cause ?? "";
    const text = e.message ?? (e.set_seq !== undefined ? eventText(e) :
      (e.value !== undefined ? `${e.module}: ${e.value}` : (e.path ?? "")));
    for (const cell of [`${e.t.toFixed(1)} s`, e.kind, what, text, who]) row.appendChild(el("td", {}, String(cell)));
    body.insertBefore(row, body.firstChild);
  }
  while (body.rows.length > 500) body.deleteRow(body.rows.length - 1);
}

function renderActions(actions) {
  const box = document.getElementById("actions");
  box.replaceChildren();
  for (const [module, h] of Object.entries(actions)) {
    const part = el("div", {class: "histogram", "data-module": module});
    part.appendChild(el("strong", {}, `${module} (${h.count} actions) `));
    if (h.type === "Box") {
      h.mean.forEach((m, d) => part.appendChild(el("span", {}, ` dim ${d}: mean ${m?.toFixed(3)} std ${h.std[d]?.toFixed(3)};`)));
    } else {
      const total = Object.values(h.counts).reduce((a, b) => a + b, 0);
      for (const [a, n] of Object.entries(h.counts)) {
        const item = el("span", {title: `${n}`}, ` ${a} `);
        const bar = el("span", {class: "bar"});
        bar.style.width = `${Math.round(100 * n / total)}px`;
        item.appendChild(bar);
        part.appendChild(item);
      }
    }
    box.appendChild(part);
  }
}

function renderEpisodes(episodes) {
  const box = document.getElementById("episodes");
  box.replaceChildren();
  for (const [module, list] of Object.entries(episodes)) {
    const line = el("div", {"data-module": module});
    line.appendChild(el("strong", {}, `${module}: `));
    for (const e of list) {
      const item = el("span", {class: "episode", title: "click for its steps"}, ` ${e.return?.toFixed(1)} (${e.length}) `);
      item.onclick = () => askEpisode(module, e.id);
      line.appendChild(item);
    }
    box.appendChild(line);
  }
}

// The steps of an episode are sent only when asked for: a tick carries the summaries.
function askEpisode(module, id) {
  if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify({type: "episode", module, id}));
}

// One episode step by step: each agent's reward and action at each of its steps.
function showEpisode(e) {
  const box = document.getElementById("episode-detail");
  if (e.error) {
    box.replaceChildren(el("p", {}, e.error));
    return;
  }
  box.replaceChildren(el("h3", {}, `${e.module}: return ${e.return?.toFixed(2)}, length ${e.length}`));
  if (e.agents > e.agents_shown) box.appendChild(el("p", {}, `steps of ${e.agents_shown} of its ${e.agents} agents`));
  for (const [agent, steps] of Object.entries(e.agent_steps || {})) {
    const table = el("table", {class: "steps", "data-agent": agent});
    const head = el("tr");
    for (const h of ["agent", "step", "action", "reward"]) head.appendChild(el("th", {}, h));
    table.appendChild(head);
    steps.rewards.forEach((r, i) => {
      const row = el("tr");
      for (const cell of [i === 0 ? agent : "", i, JSON.stringify(steps.actions[i]), r]) row.appendChild(el("td", {}, String(cell)));
      table.appendChild(row);
    });
    if (steps.steps > steps.rewards.length) box.appendChild(el("p", {}, `${agent}: first ${steps.rewards.length} of ${steps.steps} steps`));
    box.appendChild(table);
  }
}

// A parameter's value as a person reads it: a number, or its sampler.
function paramText(v) {
  if (typeof v === "number") return String(v);
  if (v.sampler === "uniform") return `uniform ${v.low} to ${v.high}`;
  if (v.sampler === "gaussian") return `gaussian ${v.mean} ± ${v.std}`;
  if (v.sampler === "ranges") return "ranges " + v.ranges.map(([a, b]) => `[${a}, ${b}]`).join(" ");
  return JSON.stringify(v);
}

// The curriculum: its lesson, the measure that advances it, and every parameter (docs/curriculum.md).
function renderCurriculum(c) {
  const panel = document.getElementById("curriculum-panel");
  panel.hidden = !c;
  if (!c) return;
  const lesson = c.lessons ? `lesson ${c.lesson} of ${c.lessons - 1}${c.lesson_name ? ` (${c.lesson_name})` : ""}` : "no lessons";
  const mean = c.measure_mean == null ? "no episodes yet" : c.measure_mean.toFixed(3);
  const next = !c.lessons ? "" : c.threshold == null ? "; the last lesson" :
    `; advances at ${c.threshold} over ${c.min_episodes} episodes (${c.lesson_episodes} played)`;
  document.getElementById("curriculum-state").textContent =
    `${lesson}; parameter set ${c.seq}; measure (${c.measure}): ${mean}${next}`;
  const body = document.querySelector("#curriculum-params tbody");
  body.replaceChildren();
  for (const [name, v] of Object.entries(c.values)) {
    const row = el("tr", {"data-param": name});
    row.appendChild(el("td", {}, name));
    row.appendChild(el("td", {}, paramText(v)));
    body.appendChild(row);
  }
  const select = document.getElementById("param-name");
  const names = Object.keys(c.values);
  if (select.options.length !== names.length) select.replaceChildren(...names.map(n => el("option", {value: n}, n)));
}

function renderLive(message) {
  const status = document.getElementById("status");
  status.textContent = message.paused ? "paused" : "live";
  status.className = "status " + (message.paused ? "paused" : "live");
  document.getElementById("summary").textContent =
    Object.entries(message.weights).map(([m, v]) => `${m} v${v}`).join("  ");
  renderClients(message.clients, message.reconnects);
  renderRanks(message.ranks);
  renderActions(message.actions);
  renderEpisodes(message.episodes);
  renderCurriculum(message.curriculum);
  const select = document.getElementById("module");
  if (select.options.length !== Object.keys(message.weights).length) {
    select.replaceChildren(...Object.keys(message.weights).map(m => el("option", {value: m}, m)));
  }
}

function onMessage(event) {
  const message = JSON.parse(event.data);
  if (message.type === "hello") {
    for (const k of Object.keys(series)) delete series[k];
    for (const [k, s] of Object.entries(message.history)) series[k] = {t: s.t.slice(), v: s.v.slice()};
    Object.keys(message.run?.modules || {}).sort().forEach(colourOf);   // modules' colours in their order
    for (const g of Object.keys(message.run?.groups || {})) groups.add(g);
    renderErrors(message.errors, false);
    renderLive(message);
    drawCharts();
  } else if (message.type === "tick") {
    for (const [k, v] of Object.entries(message.values)) {
      const s = series[k] || (series[k] = {t: [], v: []});
      s.t.push(message.t);
      s.v.push(v);
    }
    renderErrors(message.errors, true);
    renderLive(message);
    drawCharts();
    document.body.dataset.ticks = String(Number(document.body.dataset.ticks || 0) + 1);
  } else if (message.type === "episode") {
    showEpisode(message);
  } else if (message.type === "control_result") {
    document.getElementById("control-result").textContent =
      message.ok ? `${message.action}: done` : `refused: ${message.error}`;
  }
}

function control(action, extra) {
  if (socket && socket.readyState === WebSocket.OPEN) socket.send(JSON.stringify({type: "control", token, action, ...extra}));
}

function connect() {
  const scheme = location.protocol === "https:" ? "wss" : "ws";
  socket = new WebSocket(`${scheme}://${location.host}/feed?token=${encodeURIComponent(token)}`);
  socket.onopen = () => { retryMs = 500; };
  socket.onmessage = onMessage;
  socket.onclose = () => {
    const status = document.getElementById("status");
    status.textContent = "disconnected: retrying";
    status.className = "status down";
    setTimeout(connect, retryMs);      // a reconnecting browser gets the history again
    retryMs = Math.min(retryMs * 2, 10000);
  };
}

for (const id of ["pause", "resume", "checkpoint"]) document.getElementById(id).onclick = () => control(id);
document.getElementById("stop").onclick = () => { if (confirm("Stop the server?")) control("stop"); };
document.getElementById("set-lr").onclick = () =>
  control("set_lr", {module: document.getElementById("module").value, value: Number(document.getElementById("lr").value)});
document.getElementById("set-ent").onclick = () =>
  control("set_ent_coef", {module: document.getElementById("module").value, value: Number(document.getElementById("ent").value)});
document.getElementById("set-param").onclick = () => {
  const text = document.getElementById("param-value").value.trim();
  let value;
  try { value = JSON.parse(text); } catch (_) { value = text; }   // the server names what is wrong
  control("set_param", {name: document.getElementById("param-name").value, value});
};
document.getElementById("set-lesson").onclick = () => {
  // An empty box is no lesson (Number("") would be 0): the text goes as typed, the server names what is wrong.
  const text = document.getElementById("lesson").value.trim();
  control("set_lesson", {lesson: /^\d+$/.test(text) ? Number(text) : text});
};
connect();
