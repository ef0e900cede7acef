// The console page: draws the feed of docs/console.md (hello, then a tick a
// second) with uPlot, and sends controls with the token from the page's URL.
"use strict";

const token = new URLSearchParams(location.search).get("token") || "";
const series = {};          // key -> {t: [], v: []}: the history, then each tick's sample
const charts = {};          // chart id -> {plot, keys}
window.tetherCharts = charts;  // for tests and the curious: each chart's uPlot
let socket = null;
let retryMs = 500;

// Which series each chart draws (keys as the feed names them).
const CHARTS = [
  ["returns", "Episode return (mean, min, max; per module; per agent type and group)",
    k => k.startsWith("episode/return_") || /^(module|agent_type)\/[^/]+\/return_(mean|min|max)$/.test(k)],
  ["length", "Episode length (mean; per module; per agent type and group)",
    k => k === "episode/length_mean" || /^(module|agent_type)\/[^/]+\/length_mean$/.test(k)],
  ["losses", "Policy and value loss", k => /(^|\/)(policy_loss|value_loss)$/.test(k) && k.startsWith("module/")],
  ["entropy", "Entropy", k => /^module\/[^/]+\/entropy$/.test(k)],
  ["cloning", "Behaviour cloning (logged steps, demonstrations): loss, logged share, dataset coefficient",
    k => /^module\/[^/]+\/(bc_loss|demo_bc_loss|logged_fraction|demo_coef)$/.test(k)],
  ["self_play", "Self-play Elo ratings: each learning module and its latest snapshot",
    k => /^self_play\/[^/]+\/(rating|latest_snapshot_rating)$/.test(k)],
  ["kl", "Approx. KL and clip fraction", k => /^module\/[^/]+\/(approx_kl|clipfrac)$/.test(k)],
  ["ev", "Explained variance", k => /^module\/[^/]+\/explained_variance$/.test(k)],
  ["lr", "Learning rate and entropy coefficient", k => /^module\/[^/]+\/(lr|ent_coef)$/.test(k)],
  ["weights", "Weights version and updates", k => /^module\/[^/]+\/weights_seq_no$/.test(k) || k === "charts/updates"],
  ["throughput", "Env steps/s", k => k === "charts/env_steps_per_s"],
  ["timing", "Update and ONNX export time (s)", k => /^module\/[^/]+\/(update_s|export_s)$/.test(k)],
  ["health", "Server health (loop lag ms, pool steps, stale refused and dropped, memory MB)",
    k => k.startsWith("health/") && k !== "health/paused" || k === "charts/samples_dropped_stale" ||
      k === "charts/samples_refused_stale"],
];

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

function drawCharts() {
  const keys = Object.keys(series).sort();
  for (const [id, title, wanted] of CHARTS) {
    const mine = keys.filter(wanted);
    if (mine.length === 0) continue;
    let chart = charts[id];
    if (!chart || chart.keys.join("|") !== mine.join("|")) {
      if (chart) chart.plot.destroy(); else {
        const box = el("div", {class: "chart", id: "chart-" + id});
        box.appendChild(el("h3", {}, title));
        document.getElementById("charts").appendChild(box);
      }
      const box = document.getElementById("chart-" + id);
      const opts = {
        width: Math.max(380, box.clientWidth - 12), height: 200,
        scales: {x: {time: false}},
        series: [{label: "s"}].concat(mine.map((k, i) => ({label: k, stroke: `hsl(${(i * 67) % 360} 65% 45%)`, spanGaps: true}))),
        axes: [{label: "seconds"}, {}],
        cursor: {drag: {x: true, y: false}},   // drag to zoom over the whole run
      };
      chart = charts[id] = {plot: new uPlot(opts, aligned(mine), box), keys: mine};
    } else {
      // Follow the newest points unless the user zoomed into the past (drag to zoom, double-click to reset).
      const data = aligned(mine);
      const x = chart.plot.scales.x;
      const shown = chart.plot.data[0];
      const following = x.max == null || shown.length === 0 || x.max >= shown[shown.length - 1];
      chart.plot.setData(data, following);
    }
  }
}

function renderClients(clients, reconnects) {
  const body = document.querySelector("#clients tbody");
  body.replaceChildren();
  for (const c of clients) {
    const weights = Object.entries(c.weights).map(([m, v]) => `${m} v${v} (${c.staleness[m] ?? "?"})`).join(", ");
    const row = el("tr", {class: c.connected ? "client" : "client gone", "data-id": c.id});
    for (const cell of [c.id, c.address, (c.client_name ?? "") + (c.sdk ? ` (${c.sdk})` : ""), c.protocol_version ?? "v1", weights, c.env_steps_per_s,
                        c.batches, c.env_steps, `${c.last_seen_s_ago.toFixed(1)} s ago`, c.round_trip_ms ?? "",
                        c.errors, (c.connected ? "connected" : "gone") + (c.reconnects ? `, reconnect ${c.reconnects}` : "")]) {
      row.appendChild(el("td", {}, String(cell)));
    }
    body.appendChild(row);
  }
  document.getElementById("reconnects").textContent = `reconnects: ${reconnects}`;
}

function renderErrors(errors, prepend) {
  const body = document.querySelector("#errors tbody");
  if (!prepend) body.replaceChildren();
  for (const e of errors.slice().reverse()) {  // newest first
    const row = el("tr", {class: e.kind === "error" ? "error" : "event", "data-seq": e.seq});
    const who = e.client ? `#${e.client.id} ${e.client.name ?? ""} ${e.client.address}` : "";
    const what = e.code ?? e.action ?? "";
    const text = e.message ?? (e.value !== undefined ? `${e.module}: ${e.value}` : (e.path ?? ""));
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

function renderLive(message) {
  const status = document.getElementById("status");
  status.textContent = message.paused ? "paused" : "live";
  status.className = "status " + (message.paused ? "paused" : "live");
  document.getElementById("summary").textContent =
    Object.entries(message.weights).map(([m, v]) => `${m} v${v}`).join("  ");
  renderClients(message.clients, message.reconnects);
  renderActions(message.actions);
  renderEpisodes(message.episodes);
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
connect();
