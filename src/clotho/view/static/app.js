// clotho view: runs -> run -> trial, groups, compare. Vanilla JS, no dependencies.
// Served by `clotho view` (fetches /api/...) or inlined in an export (answers from the
// embedded JSON, keyed by the same paths).
"use strict";

const DATA = JSON.parse(document.getElementById("clotho-data").textContent || "null");
const EXPORT = !!(DATA && DATA.export);
const PAGE = 100; // table rows per page: the DOM never holds more
const POLL_MS = 2000;
const FOLD_CHARS = 1500;
const FOLD_LINES = 25;
const TOKENS_SHOWN = 4000;

const $ = (sel, root = document) => root.querySelector(sel);
const app = $("#app");
let pollTimer = null;
let routeSeq = 0;

async function api(path) {
  if (EXPORT) {
    const value = DATA.routes[path.split("?")[0]];
    if (value === undefined) throw new Error("not in this report: " + path);
    return value;
  }
  // Relative to the page, without the credentials a http://user:token@host/ address carries
  // (fetch refuses such a URL; the browser sends the token it was given with every request).
  const url = new URL(path.replace(/^\//, ""), location.href);
  url.username = url.password = "";
  const response = await fetch(url.href);
  if (!response.ok) throw new Error(path + ": HTTP " + response.status);
  return response.json();
}

function esc(value) {
  return String(value ?? "").replace(/[&<>"']/g, (c) =>
    ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);
}
// Every value read from a file is data: text goes through esc(), and a number field is shown
// only if it is a number (a results file may hold markup where a count belongs).
const isNum = (x) => typeof x === "number" && Number.isFinite(x);
const count = (x) => (isNum(x) ? String(x) : "–");
const list = (x) => (Array.isArray(x) ? x : []);
const enc = encodeURIComponent;
const pct = (x) => (isNum(x) ? (100 * x).toFixed(1) + "%" : "–");
const num = (x, d = 2) => (isNum(x) ? x.toFixed(d) : "–");
function secs(s) {
  if (!isNum(s)) return "–";
  if (s < 1) return (s * 1000).toFixed(0) + " ms";
  if (s < 120) return s.toFixed(1) + " s";
  if (s < 7200) return (s / 60).toFixed(1) + " min";
  return (s / 3600).toFixed(1) + " h";
}
function date(t) {
  const d = isNum(t) && t ? new Date(t * 1000) : null;
  return d && !isNaN(d) ? d.toISOString().replace("T", " ").slice(0, 16) : "–";
}
const ci = (c) => (Array.isArray(c) ? `[${pct(c[0])}, ${pct(c[1])}]` : "");
function errorChips(errors) {
  const kinds = Object.entries(errors || {});
  if (!kinds.length) return '<span class="muted">none</span>';
  return kinds.map(([k, n]) => `<span class="chip err-${esc(k)}">${esc(k)} ${count(n)}</span>`).join(" ");
}
// How a run ended: still running, stopped before every planned attempt ran, or finished.
function statusChip(r) {
  const status = r.status || (r.finished ? "finished" : "running");
  if (status === "running") return ' <span class="chip live">running</span>';
  if (status === "stopped") {
    const of = r.n_planned != null ? `: ${r.n_finished ?? "?"} of ${r.n_planned} attempts` : "";
    return ` <span class="chip stopped" title="stopped before it finished; clotho eval --resume completes it">stopped${esc(of)}</span>`;
  }
  return "";
}
const isRunning = (r) => (r.status || (r.finished ? "finished" : "running")) === "running";
function meanOver(r) {
  const n = r.mean_reward_n ?? r.n_scored;
  return `mean reward over ${n} scored trial${n === 1 ? "" : "s"}`;
}
function crumbs(parts) {
  $("#crumbs").innerHTML = parts
    .map(([label, href]) => (href ? `<a href="${esc(href)}">${esc(label)}</a>` : `<span>${esc(label)}</span>`))
    .join(" / ");
}
function setLive(text) {
  $("#live").textContent = text || "";
}

// ---- statistics (the same as runs/metrics.py) ----
function wilson(passed, n, z = 1.96) {
  if (!n) return null;
  const p = passed / n, d = 1 + (z * z) / n;
  const centre = (p + (z * z) / (2 * n)) / d;
  const half = (z * Math.sqrt((p * (1 - p)) / n + (z * z) / (4 * n * n))) / d;
  // At 0/n and n/n the bound is exactly the observed rate; rounding must not leave it out.
  return [passed === 0 ? 0 : Math.max(0, centre - half), passed === n ? 1 : Math.min(1, centre + half)];
}
// Newcombe's hybrid score interval for the difference of two independent proportions.
function diffInterval(pa, na, pb, nb) {
  const a = wilson(pa, na), b = wilson(pb, nb);
  if (!a || !b) return null;
  const ra = pa / na, rb = pb / nb, d = rb - ra;
  return [d - Math.sqrt((rb - b[0]) ** 2 + (a[1] - ra) ** 2),
          d + Math.sqrt((b[1] - rb) ** 2 + (ra - a[0]) ** 2)];
}

// A poll that fails (the server stopped, the page is leaving) says so and tries again.
function polled(fn) {
  let busy = false;
  return async () => {
    if (busy) return; // a slow answer is not asked for twice
    busy = true;
    try {
      await fn();
    } catch (err) {
      setLive("server unreachable: retrying");
    } finally {
      busy = false;
    }
  };
}

// ---- router ----
window.addEventListener("hashchange", route);
window.addEventListener("DOMContentLoaded", route);

async function route() {
  app.onchange = null;
  clearInterval(pollTimer);
  pollTimer = null;
  const seq = ++routeSeq;
  const parts = (location.hash.replace(/^#\/?/, "") || "").split("/").map(decodeURIComponent);
  try {
    if (parts[0] === "run" && parts[2] === "trial") await trialView(parts[1], +parts[3], seq);
    else if (parts[0] === "run") await runView(parts[1], seq);
    else if (parts[0] === "groups" && parts[2] === "group") await groupView(parts[1], +parts[3]);
    else if (parts[0] === "groups") await groupsView(parts[1]);
    else if (parts[0] === "compare") await compareView(parts[1], parts[2]);
    else await runsView();
  } catch (err) {
    if (seq === routeSeq) app.innerHTML = `<p class="error">${esc(err.message)}</p>`;
  }
  document.body.dataset.view = parts[0] || "runs";
}

// ---- runs ----
async function runsView() {
  crumbs([["runs"]]);
  setLive(EXPORT ? "exported report" : "");
  const sources = await api("/api/runs");
  const runs = sources.filter((s) => s.kind === "run");
  const groups = sources.filter((s) => s.kind === "groups");
  let html = `<h1>Runs</h1>`;
  if (runs.length) {
    html += `<table id="runs" class="grid"><thead><tr><th></th><th>run</th><th>date</th>
      <th>agent / model</th><th>pass rate</th><th>95% interval</th><th>n</th><th>errors</th>
      <th>wall time</th></tr></thead><tbody>`;
    for (const r of runs) {
      html += `<tr class="run-row" data-id="${esc(r.id)}">
        <td><input type="checkbox" class="pick" value="${esc(r.id)}" aria-label="compare"></td>
        <td><a href="#/run/${esc(r.id)}">${esc(r.name)}</a>${statusChip(r)}</td>
        <td>${date(r.date)}</td><td>${esc(r.agent || "")}${r.model ? " / " + esc(r.model) : ""}</td>
        <td class="num rate">${pct(r.pass_rate)}</td><td class="num">${ci(r.ci95)}</td>
        <td class="num">${count(r.n_passed)}/${count(r.n_scored)} <span class="muted">(${count(r.n)} attempts)</span></td>
        <td>${errorChips(r.errors)}</td><td class="num">${secs(r.wall_s)}</td></tr>`;
    }
    html += `</tbody></table>
      <p><button id="compare" disabled>compare the two selected runs</button>
      <span class="muted">pick two runs</span></p>`;
  }
  if (groups.length) {
    html += `<h2>Scored groups</h2><table id="group-files" class="grid"><thead><tr><th>file</th>
      <th>groups</th><th>rollouts</th><th>mean score</th><th>dropped</th></tr></thead><tbody>`;
    for (const g of groups) {
      html += `<tr><td><a href="#/groups/${esc(g.id)}">${esc(g.name)}</a></td>
        <td class="num">${count(g.n_groups)}</td><td class="num">${count(g.n)}</td>
        <td class="num">${num(g.mean_score, 3)}</td><td>${droppedText(g.stats)}</td></tr>`;
    }
    html += `</tbody></table>`;
  }
  if (!sources.length) html += `<p class="muted">No run directories or group files here.</p>`;
  app.innerHTML = html;
  if (!EXPORT && runs.some(isRunning)) {
    const seq = routeSeq;
    pollTimer = setInterval(polled(async () => {
      const fresh = await api("/api/runs");
      if (seq !== routeSeq) return;
      for (const r of fresh.filter((s) => s.kind === "run")) {
        const tr = app.querySelector(`tr.run-row[data-id="${CSS.escape(String(r.id))}"]`);
        if (!tr) continue;
        const cells = tr.children;
        cells[1].querySelectorAll(".live, .stopped").forEach((el) => el.remove());
        cells[1].insertAdjacentHTML("beforeend", statusChip(r));
        cells[4].innerHTML = pct(r.pass_rate);
        cells[5].innerHTML = ci(r.ci95);
        cells[6].innerHTML = `${count(r.n_passed)}/${count(r.n_scored)} <span class="muted">(${count(r.n)} attempts)</span>`;
        cells[7].innerHTML = errorChips(r.errors);
        cells[8].innerHTML = secs(r.wall_s);
      }
    }), POLL_MS);
  }
  const button = $("#compare");
  if (button) {
    const picked = () => [...app.querySelectorAll(".pick:checked")].map((c) => c.value);
    app.onchange = () => (button.disabled = picked().length !== 2);
    button.addEventListener("click", () => {
      const [a, b] = picked();
      location.hash = `#/compare/${a}/${b}`;
    });
  }
}

// ---- one run ----
const runState = {}; // id -> {rows, version, overview, filter, sort, page}

async function loadRun(id) {
  let st = runState[id];
  if (!st) {
    st = runState[id] = { rows: [], version: null, overview: null, page: 0,
      sort: { key: "i", dir: 1 }, filter: { category: "", status: "", error: "", q: "" } };
  }
  const [overview, trials] = await Promise.all([
    api(`/api/run/${enc(id)}`),
    api(`/api/run/${enc(id)}/trials?since=${st.rows.length}&version=${enc(st.version ?? "")}`),
  ]);
  st.overview = overview;
  mergeRows(st, trials);
  return st;
}

function mergeRows(st, trials) {
  if (trials.version !== st.version || trials.since === 0) st.rows = [];
  st.version = trials.version;
  const cols = trials.columns;
  for (const values of trials.rows) {
    const row = {};
    for (let c = 0; c < cols.length; c++) row[cols[c]] = values[c];
    st.rows.push(row);
  }
}

async function runView(id, seq) {
  const st = await loadRun(id);
  if (seq !== routeSeq) return;
  const s = st.overview.summary;
  crumbs([["runs", "#/"], [s.name]]);
  app.innerHTML = `<h1>${esc(s.name)}<span id="run-status">${statusChip(s)}</span></h1><section id="run-summary"></section>
    <div class="cols"><section id="categories"></section><section id="passk"></section>
    <section id="timings"></section></div>
    <section id="filters" class="filters"></section><section id="table"></section>`;
  renderRunHeader(st);
  renderFilters(id, st);
  renderTable(id, st);
  if (!EXPORT) {
    setLive(isRunning(s) ? "live: updating" : "");
    pollTimer = setInterval(polled(async () => {
      const trials = await api(`/api/run/${enc(id)}/trials?since=${st.rows.length}&version=${enc(st.version)}`);
      if (seq !== routeSeq || (!trials.rows.length && trials.version === st.version)) return;
      mergeRows(st, trials);
      st.overview = await api(`/api/run/${enc(id)}`);
      if (seq !== routeSeq) return;
      renderRunHeader(st);
      renderFilters(id, st);
      renderTable(id, st);
      $("#run-status").innerHTML = statusChip(st.overview.summary);
      setLive(isRunning(st.overview.summary) ? `live: ${st.rows.length} trials` : "");
    }), POLL_MS);
  }
}

function renderRunHeader(st) {
  const s = st.overview.summary, m = st.overview.metrics, cfg = st.overview.config || {};
  $("#run-summary").innerHTML = `<div class="stats">
    <div class="stat"><b id="pass-rate">${pct(s.pass_rate)}</b><span>pass rate ${ci(s.ci95)}</span></div>
    <div class="stat"><b>${count(s.n_passed)}/${count(s.n_scored)}</b><span>passed / scored</span></div>
    <div class="stat"><b>${count(s.n_tasks)}</b><span>tasks, ${count(s.n)} attempts</span></div>
    <div class="stat" id="mean-reward"><b>${num(s.mean_reward, 3)}</b><span title="a scored failure (tamper, agent, limit, verifier) counts as 0, as it counts as a failure in the pass rate; infra, task and config errors are in neither">${esc(meanOver(s))}</span></div>
    <div class="stat"><b>${secs(s.wall_s)}</b><span>wall time</span></div>
    <div class="stat"><span>errors</span>${errorChips(s.errors)}</div></div>
    <p class="muted">${esc(s.agent || "")}${s.model ? " / " + esc(s.model) : ""} · ${esc(s.path)}
    · ${date(s.date)}${cfg.concurrency ? " · concurrency " + esc(cfg.concurrency) : ""}</p>`;
  let cats = `<h3>Per category</h3><table class="grid small"><thead><tr><th>category</th><th>pass rate</th><th>passed</th></tr></thead><tbody>`;
  for (const [name, c] of Object.entries(m.by_category || {})) {
    cats += `<tr><td>${esc(name)}</td><td class="num">${pct(c.pass_rate)}
      <span class="bar"><i style="width:${(100 * (isNum(c.pass_rate) ? c.pass_rate : 0)).toFixed(1)}%"></i></span></td>
      <td class="num">${count(c.n_passed)}/${count(c.n)}</td></tr>`;
  }
  $("#categories").innerHTML = cats + "</tbody></table>";
  const passk = Object.entries(m.pass_at_k || {});
  $("#passk").innerHTML = passk.length
    ? `<h3>pass@k</h3><table class="grid small"><tbody>${passk
        .map(([k, v]) => `<tr><td>pass@${esc(k)}</td><td class="num">${pct(v)}</td></tr>`).join("")}</tbody></table>`
    : "";
  const timings = Object.entries(m.timings || {});
  $("#timings").innerHTML = timings.length
    ? `<h3>Time per phase</h3><table class="grid small"><thead><tr><th>phase</th><th>p50</th><th>p95</th><th>total</th></tr></thead><tbody>${timings
        .map(([k, t]) => `<tr><td>${esc(k.replace(/_s$/, ""))}</td><td class="num">${secs(t.p50_s)}</td><td class="num">${secs(t.p95_s)}</td><td class="num">${secs(t.total_s)}</td></tr>`)
        .join("")}</tbody></table>`
    : "";
}

function renderFilters(id, st) {
  const f = st.filter;
  const cats = [...new Set(st.rows.map((r) => r.category))].sort();
  const kinds = [...new Set(st.rows.map((r) => r.error).filter(Boolean))].sort();
  const opt = (v, label, cur) => `<option value="${esc(v)}"${v === cur ? " selected" : ""}>${esc(label)}</option>`;
  const box = $("#filters");
  const focused = document.activeElement && document.activeElement.id;
  box.innerHTML = `
    <label>category <select id="f-category">${opt("", "all", f.category)}${cats.map((c) => opt(c, c, f.category)).join("")}</select></label>
    <label>outcome <select id="f-status">${opt("", "all", f.status)}${opt("passed", "passed", f.status)}${opt("failed", "failed", f.status)}${opt("error", "any error", f.status)}</select></label>
    <label>error kind <select id="f-error">${opt("", "all", f.error)}${kinds.map((k) => opt(k, k, f.error)).join("")}</select></label>
    <label>search <input id="f-search" type="search" placeholder="task, category, message" value="${esc(f.q)}"></label>`;
  const update = () => {
    f.category = $("#f-category").value;
    f.status = $("#f-status").value;
    f.error = $("#f-error").value;
    f.q = $("#f-search").value;
    st.page = 0;
    renderTable(id, st);
  };
  box.querySelectorAll("select").forEach((el) => el.addEventListener("change", update));
  $("#f-search").addEventListener("input", update);
  if (focused === "f-search") {
    const input = $("#f-search");
    input.focus();
    input.setSelectionRange(input.value.length, input.value.length);
  }
}

const COLUMNS = [
  ["task", "task"], ["category", "category"], ["attempt", "attempt"], ["reward", "reward"],
  ["passed", "pass"], ["error", "error"], ["turns", "turns"], ["tool_calls", "tool calls"],
  ["duration_s", "duration"],
];

function filtered(st) {
  const f = st.filter, q = f.q.trim().toLowerCase();
  let rows = st.rows.filter((r) =>
    (!f.category || r.category === f.category) &&
    (!f.error || r.error === f.error) &&
    (f.status !== "passed" || r.passed) &&
    (f.status !== "failed" || (!r.passed && r.scored)) &&
    (f.status !== "error" || r.error) &&
    (!q || r.task.toLowerCase().includes(q) || r.category.toLowerCase().includes(q) ||
      (r.message || "").toLowerCase().includes(q)));
  const { key, dir } = st.sort;
  if (key !== "i" || dir !== 1) {
    rows = rows.slice().sort((a, b) => {
      const x = a[key], y = b[key];
      if (x === y) return a.i - b.i;
      if (x == null) return 1;
      if (y == null) return -1;
      return (x < y ? -1 : 1) * dir;
    });
  }
  return rows;
}

function renderTable(id, st) {
  const rows = filtered(st);
  const pages = Math.max(1, Math.ceil(rows.length / PAGE));
  st.page = Math.min(st.page, pages - 1);
  const shown = rows.slice(st.page * PAGE, (st.page + 1) * PAGE);
  const arrow = (k) => (st.sort.key === k ? (st.sort.dir > 0 ? " ▲" : " ▼") : "");
  let html = `<table id="trials" class="grid"><thead><tr>${COLUMNS
    .map(([k, label]) => `<th data-key="${k}" class="sortable">${label}${arrow(k)}</th>`).join("")}</tr></thead><tbody>`;
  for (const r of shown) {
    const outcome = r.passed ? '<span class="pass">pass</span>'
      : r.scored ? '<span class="fail">fail</span>' : '<span class="muted">not scored</span>';
    html += `<tr class="trial-row" data-i="${esc(r.i)}"><td><a href="#/run/${esc(id)}/trial/${esc(r.i)}">${esc(r.task)}</a></td>
      <td>${esc(r.category)}</td><td class="num">${count(r.attempt)}</td><td class="num">${num(r.reward)}</td>
      <td>${outcome}</td><td>${r.error ? `<span class="chip err-${esc(r.error)}" title="${esc(r.message)}">${esc(r.error)}</span>` : ""}</td>
      <td class="num">${count(r.turns)}</td><td class="num">${count(r.tool_calls)}${r.tool_errors ? ` <span class="fail">(${count(r.tool_errors)} failed)</span>` : ""}</td>
      <td class="num">${secs(r.duration_s)}</td></tr>`;
  }
  html += `</tbody></table><div id="pager"><button id="prev"${st.page ? "" : " disabled"}>‹ previous</button>
    <span id="page-info">${rows.length ? st.page * PAGE + 1 : 0}–${st.page * PAGE + shown.length} of ${rows.length}
    ${rows.length !== st.rows.length ? `(filtered from ${st.rows.length})` : "trials"}</span>
    <button id="next"${st.page < pages - 1 ? "" : " disabled"}>next ›</button></div>`;
  const box = $("#table");
  box.innerHTML = html;
  box.querySelectorAll("th.sortable").forEach((th) => th.addEventListener("click", () => {
    const k = th.dataset.key;
    st.sort = st.sort.key === k ? { key: k, dir: -st.sort.dir } : { key: k, dir: 1 };
    renderTable(id, st);
  }));
  $("#prev").addEventListener("click", () => { st.page--; renderTable(id, st); });
  $("#next").addEventListener("click", () => { st.page++; renderTable(id, st); });
  box.querySelectorAll("tr.trial-row").forEach((tr) => tr.addEventListener("click", (e) => {
    if (e.target.tagName !== "A") location.hash = `#/run/${id}/trial/${tr.dataset.i}`;
  }));
}

// ---- one trial ----
async function trialView(id, n, seq) {
  const d = await api(`/api/run/${enc(id)}/trial/${enc(n)}`);
  if (seq !== routeSeq) return;
  const r = d.record, res = d.agent_result || null, v = d.verifier || null;
  const usage = res && res.usage && typeof res.usage === "object" ? res.usage : null;
  crumbs([["runs", "#/"], [d.run, `#/run/${id}`], [`${r.task} #${r.attempt}`]]);
  const outcome = r.passed ? '<span class="pass">passed</span>'
    : r.error && !["infra", "task", "config"].includes(r.error.kind) ? '<span class="fail">failed</span>'
    : r.error ? '<span class="muted">not scored</span>' : '<span class="fail">failed</span>';
  const [prev, next] = neighbours(id, n);
  const step = (to, label, key) => (to == null ? `<span class="muted">${label}</span>`
    : `<a href="#/run/${esc(id)}/trial/${esc(to)}" id="${key}-trial" title="key: ${key === "prev" ? "k or ←" : "j or →"}">${label}</a>`);
  let html = `<nav class="steps">${step(prev, "‹ previous trial", "prev")} ${step(next, "next trial ›", "next")}
    <span class="muted">(in the run table's order and filters)</span></nav>
    <h1>${esc(r.task)} <span class="muted">attempt ${count(r.attempt)}</span></h1>
    <section id="trial-header"><div class="stats">
      <div class="stat"><b>${outcome}</b><span>reward ${num(r.reward, 3)}</span></div>
      <div class="stat"><b>${esc(r.category)}</b><span>category</span></div>
      <div class="stat"><b>${count(r.turns)}</b><span>turns (${esc(r.stop_reason || "–")})</span></div>
      <div class="stat"><b>${count(r.tool_calls)}</b><span>tool calls, ${count(r.tool_errors)} failed</span></div>
      <div class="stat"><b>${secs(r.duration_s)}</b><span>duration</span></div>
      ${usage ? `<div class="stat"><b>${count(usage.total_tokens)}</b><span>tokens (${count(usage.prompt_tokens)} prompt, ${count(usage.completion_tokens)} completion)</span></div>` : ""}
    </div>`;
  if (r.error) html += `<div class="error" id="trial-error"><b>${esc(r.error.kind)} error:</b> <pre>${esc(r.error.message)}</pre></div>`;
  if (Object.keys(r.rewards || {}).length) html += `<p>rewards: ${Object.entries(r.rewards).map(([k, x]) => `${esc(k)} ${num(x, 3)}`).join(", ")}</p>`;
  html += `</section>${timingsBar(r.timings)}`;
  const patch = d.diff || d.patch || (res && (res.diff || res.patch));
  const diff = typeof patch === "string" ? patch : "";
  const jump = (to, label) => `<button class="jump" data-jump="${to}">${label}</button>`;
  html += `<nav class="tabs">${jump("conversation", "conversation")} ${jump("verifier", "verifier")}${diff ? " " + jump("diff", "diff") : ""}${res && res.sequences ? " " + jump("tokens", "tokens") : ""}${res && res.installed ? " " + jump("agent-log", "agent's log") : ""}</nav>`;
  html += `<section id="conversation"><h2>Conversation</h2>${res ? conversation(res) : '<p class="muted">No conversation recorded (the attempt did not reach its agent).</p>'}</section>`;
  if (res && res.tool_errors && res.tool_errors.length) {
    html += `<section id="tool-errors"><h2>Tool errors</h2><table class="grid small"><thead><tr><th>turn</th><th>tool</th><th>arguments</th><th>error</th></tr></thead><tbody>${res.tool_errors
      .map((e) => `<tr><td class="num">${count(e.turn)}</td><td>${esc(e.tool)}</td><td><code>${esc(e.arguments)}</code></td><td>${esc(e.error)}</td></tr>`).join("")}</tbody></table></section>`;
  }
  html += `<section id="verifier"><h2>Verifier</h2>${verifier(v)}</section>`;
  const inst = res && res.installed && typeof res.installed === "object" ? res.installed : null;
  if (inst) {  // an installed agent: its own output and trajectory beside the gateway's record
    const calls = list(inst.gateway && inst.gateway.exchanges).length;
    html += `<section id="agent-log"><h2>The agent's own log</h2><p class="muted">${esc(inst.agent)} ${esc(inst.version)}: exit code ${count(inst.exit_code)}${inst.timed_out ? " (timed out)" : ""}, ${count(calls)} model calls through the gateway, install ${esc(inst.exposure)}</p>
      <h3>Output</h3>${folded(typeof inst.output === "string" ? inst.output : "")}${typeof inst.trajectory === "string" ? `<h3>Trajectory</h3>${folded(inst.trajectory)}` : ""}</section>`;
  }
  if (diff) html += `<section id="diff"><h2>The agent's diff</h2>${diffBlock(diff)}</section>`;
  if (res && res.sequences && res.sequences.length) {
    html += `<section id="tokens"><h2>Token sequences</h2><p class="muted">Trained tokens (mask) are highlighted; hover a token for its id and sampling logprob.</p>${res.sequences
      .map((s, i) => tokenBlock(`sequence ${i + 1}`, s.tokens, s.masks, s.logprobs, s.pieces)).join("")}</section>`;
  }
  app.innerHTML = html;
  bindTokenButtons();
  // in-page jumps are buttons: a "#section" link would be read as a route
  app.querySelectorAll("button.jump").forEach((b) => b.addEventListener("click", () =>
    document.getElementById(b.dataset.jump).scrollIntoView()));
}

// The trials before and after this one in the run table as last sorted and filtered.
function neighbours(id, n) {
  const st = runState[id];
  if (!st || !st.rows.length) return [n > 0 ? n - 1 : null, n + 1];
  const rows = filtered(st), at = rows.findIndex((r) => r.i === n);
  if (at < 0) return [null, null];
  return [at > 0 ? rows[at - 1].i : null, at < rows.length - 1 ? rows[at + 1].i : null];
}
document.addEventListener("keydown", (e) => {
  if (document.body.dataset.view !== "run" || !location.hash.includes("/trial/")) return;
  if (e.target.tagName === "INPUT" || e.target.tagName === "SELECT" || e.metaKey || e.ctrlKey) return;
  const to = e.key === "j" || e.key === "ArrowRight" ? "#next-trial" : e.key === "k" || e.key === "ArrowLeft" ? "#prev-trial" : null;
  const link = to && document.querySelector(to);
  if (link) location.hash = link.getAttribute("href");
});

function timingsBar(t) {
  if (!t) return "";
  const phases = ["acquire_s", "setup_s", "agent_s", "verify_s", "release_s"];
  const at = (k) => (isNum(t[k]) ? t[k] : 0);
  const total = phases.reduce((a, k) => a + at(k), 0);
  if (!total) return "";
  const seg = phases.filter((k) => at(k) > 0).map((k) =>
    `<i class="ph-${k.replace(/_s$/, "")}" style="width:${((100 * at(k)) / total).toFixed(2)}%" title="${k.replace(/_s$/, "")}: ${secs(t[k])}"></i>`).join("");
  const cells = Object.entries(t).map(([k, x]) => `<td><span class="sw ph-${esc(k.replace(/_s$/, ""))}"></span>${esc(k.replace(/_s$/, ""))} <b>${secs(x)}</b></td>`).join("");
  return `<section id="phase-timings"><h3>Time per phase</h3><div class="phasebar">${seg}</div>
    <table class="small legend"><tr>${cells}</tr></table></section>`;
}

function text(content) {
  if (content == null) return "";
  if (typeof content === "string") return content;
  if (Array.isArray(content)) return content.map((p) => (typeof p === "string" ? p : p.text ?? JSON.stringify(p))).join("\n");
  return JSON.stringify(content, null, 2);
}

function folded(body, cls = "") {
  const lines = body.split("\n");
  if (body.length <= FOLD_CHARS && lines.length <= FOLD_LINES) return `<pre class="${cls}">${esc(body)}</pre>`;
  const head = lines.slice(0, 3).join("\n").slice(0, 300);
  return `<details class="fold"><summary><pre class="${cls}">${esc(head)}</pre><span class="muted">… ${lines.length} lines, ${body.length} characters: click to unfold</span></summary><pre class="${cls}">${esc(body)}</pre></details>`;
}

function prettyArgs(raw) {
  try { return JSON.stringify(JSON.parse(raw), null, 2); } catch { return String(raw ?? ""); }
}

function conversation(res) {
  let turn = 0;
  return res.messages.map((m, idx) => {
    const role = m.role || "?";
    let body = "";
    if (role === "assistant") {
      const reasoning = m.reasoning_content || m.reasoning || (res.reasoning && res.reasoning[turn]);
      turn++;
      if (reasoning) body += `<details class="reasoning" open><summary>reasoning</summary>${folded(text(reasoning))}</details>`;
      if (text(m.content)) body += folded(text(m.content));
      for (const call of m.tool_calls || []) {
        const fn = call.function || {};
        body += `<div class="call"><span class="chip">tool call</span> <b>${esc(fn.name)}</b> <span class="muted">${esc(call.id || "")}</span>${folded(prettyArgs(fn.arguments), "args")}</div>`;
      }
    } else if (role === "tool") {
      // A tool's JSON (the terminal's and the oracle's {"output": ...}) as its text, decoded
      // by the server; esc() in folded() keeps it text.
      const out = typeof m.content_text === "string" ? m.content_text : text(m.content);
      const failed = /^(error|Error|tool error)/.test(out);
      body += `<div class="muted">result of <b>${esc(m.name || "")}</b> ${esc(m.tool_call_id || "")}</div>${folded(out, failed ? "tool-error" : "")}`;
    } else if (role === "system") {
      body += `<details class="fold"><summary>system prompt (${text(m.content).length} characters)</summary><pre>${esc(text(m.content))}</pre></details>`;
    } else {
      body += folded(text(m.content));
    }
    const label = role === "assistant" ? `assistant · turn ${turn}` : role;
    return `<div class="msg ${esc(role)}" data-index="${idx}"><div class="role">${esc(label)}</div>${body}</div>`;
  }).join("");
}

// Per-test outcomes from what the test script printed (pytest's -v and -rA lines).
function testOutcomes(output) {
  const found = new Map();
  const words = "PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS";
  const after = new RegExp(`^(${words})\\s+(\\S+)`), before = new RegExp(`^(\\S+::\\S+)\\s+(${words})\\b`);
  for (const line of (output || "").split("\n")) {
    let m = line.trim().match(after);
    if (m && m[2].includes("::")) found.set(m[2], m[1]);
    else if ((m = line.trim().match(before))) found.set(m[1], m[2]);
  }
  return [...found.entries()];
}

function verifier(v) {
  if (!v) return '<p class="muted">The verifier did not run.</p>';
  const output = typeof v.output === "string" ? v.output : "";
  const tests = testOutcomes(output);
  let html = `<p>reward <b>${num(v.reward, 3)}</b>${v.exit_code != null ? `, exit code ${count(v.exit_code)}` : ""}, ${secs(v.duration_s)}</p>`;
  if (tests.length) {
    html += `<table id="tests" class="grid small"><thead><tr><th>test</th><th>outcome</th></tr></thead><tbody>${tests
      .map(([name, o]) => `<tr class="test-${o.toLowerCase()}"><td><code>${esc(name)}</code></td><td class="${o === "PASSED" ? "pass" : o === "SKIPPED" ? "muted" : "fail"}">${esc(o.toLowerCase())}</td></tr>`).join("")}</tbody></table>`;
  }
  if (output) html += `<h3>Output</h3>${folded(output, "verifier-output")}`;
  return html;
}

function diffBlock(diff) {
  return `<pre class="diff">${diff.split("\n").map((l) => {
    const cls = l.startsWith("+++") || l.startsWith("---") ? "hd" : l.startsWith("+") ? "add" : l.startsWith("-") ? "del" : l.startsWith("@@") ? "hunk" : "";
    return `<span class="${cls}">${esc(l)}</span>`;
  }).join("\n")}</pre>`;
}

const tokenData = [];
function tokenBlock(title, tokens, masks, logprobs, pieces) {
  tokens = list(tokens);
  pieces = Array.isArray(pieces) ? pieces : null;
  const key = tokenData.push({ tokens, masks: list(masks), logprobs: list(logprobs), pieces }) - 1;
  const trained = list(masks).filter((m) => m !== -100).length;
  return `<div class="tokens-block"><h3>${esc(title)}: ${tokens.length} tokens, ${trained} trained</h3>
    <div class="tokens${pieces ? " text" : ""}" data-key="${key}">${tokenSpans(key, Math.min(tokens.length, TOKENS_SHOWN))}</div>
    ${tokens.length > TOKENS_SHOWN ? `<button class="all-tokens" data-key="${key}">show all ${tokens.length} tokens</button>` : ""}</div>`;
}
function tokenSpans(key, limit) {
  const { tokens, masks, logprobs, pieces } = tokenData[key];
  let out = "";
  for (let i = 0; i < limit; i++) {
    const trained = masks[i] !== undefined && masks[i] !== -100;
    const lp = logprobs[i];
    const tip = `#${i} id ${tokens[i]}${trained ? ` · trained · logprob ${isNum(lp) ? lp.toFixed(4) : "?"}` : " · context"}`;
    out += `<span class="tok${trained ? " trained" : ""}" title="${esc(tip)}">${esc(pieces ? pieces[i] : tokens[i])}</span>`;
  }
  return out;
}
function bindTokenButtons() {
  app.querySelectorAll("button.all-tokens").forEach((b) => b.addEventListener("click", () => {
    const key = +b.dataset.key;
    app.querySelector(`.tokens[data-key="${key}"]`).innerHTML = tokenSpans(key, tokenData[key].tokens.length);
    b.remove();
  }));
}

// ---- groups ----
function droppedText(stats) {
  if (!stats) return '<span class="muted">no stats file</span>';
  const parts = [["too few valid rollouts", stats.dropped_too_few_valid], ["all scores equal", stats.dropped_same_scores], ["too long", stats.dropped_overlong]]
    .filter(([, n]) => n).map(([why, n]) => `${n} ${why}`);
  return parts.length ? esc(parts.join(", ")) : "none";
}

async function groupsView(id) {
  const data = await api(`/api/groups/${enc(id)}`);
  const s = data.summary, st = s.stats;
  crumbs([["runs", "#/"], [s.name]]);
  let html = `<h1>${esc(s.name)} <span class="muted">scored groups</span></h1>
    <div class="stats"><div class="stat"><b>${count(s.n_groups)}</b><span>groups written</span></div>
    <div class="stat"><b>${count(s.n)}</b><span>rollouts</span></div>
    <div class="stat"><b>${num(s.mean_score, 3)}</b><span>mean score</span></div></div>`;
  html += `<section id="dropped"><h3>Why groups were dropped</h3>`;
  if (st) {
    html += `<table class="grid small"><tbody>
      <tr><td>groups produced</td><td class="num">${count(st.groups)}</td></tr>
      <tr><td>sent / written</td><td class="num">${count(st.groups_sent)}</td></tr>
      <tr><td>dropped: too few valid rollouts (infra or verifier errors)</td><td class="num">${count(st.dropped_too_few_valid)}</td></tr>
      <tr><td>dropped: all scores equal (no signal)</td><td class="num">${count(st.dropped_same_scores)}</td></tr>
      <tr><td>dropped: too long</td><td class="num">${count(st.dropped_overlong)}</td></tr>
      <tr><td>rollouts / infra errors / verifier errors / truncated</td><td class="num">${count(st.rollouts)} / ${count(st.infra_errors)} / ${count(st.verifier_errors)} / ${count(st.truncated)}</td></tr>
      </tbody></table>`;
  } else {
    html += `<p class="muted">No ${esc(s.name.replace(/\.jsonl$/, ".stats.json"))} beside the file: only the groups that were kept are known.</p>`;
  }
  html += `</section><table id="groups" class="grid"><thead><tr><th>group</th><th>scores</th><th>mean</th><th>tokens</th><th>trained</th></tr></thead><tbody>`;
  for (const g of data.rows) {
    html += `<tr class="group-row"><td><a href="#/groups/${esc(id)}/group/${esc(g.i)}">group ${count(g.i)}</a></td>
      <td>${list(g.scores).map((x) => `<span class="chip ${x > 0 ? "pass" : "fail"}">${num(x)}</span>`).join(" ")}</td>
      <td class="num">${num(g.mean, 3)}</td><td class="num">${list(g.tokens).map(count).join(", ")}</td><td class="num">${list(g.trained).map(count).join(", ")}</td></tr>`;
  }
  app.innerHTML = html + "</tbody></table>";
}

async function groupView(id, n) {
  const [data, g] = await Promise.all([api(`/api/groups/${enc(id)}`), api(`/api/groups/${enc(id)}/group/${enc(n)}`)]);
  crumbs([["runs", "#/"], [data.summary.name, `#/groups/${id}`], [`group ${n}`]]);
  const messages = list(g.messages), scores = list(g.scores);
  let html = `<h1>group ${count(n)} <span class="muted">${scores.length} rollouts side by side</span></h1><div class="rollouts" style="grid-template-columns:repeat(${scores.length}, minmax(22em, 1fr))">`;
  scores.forEach((score, i) => {
    const res = { messages: messages[i] || [], reasoning: [] };
    html += `<div class="rollout"><h3>rollout ${i} <span class="chip ${score > 0 ? "pass" : "fail"}">score ${num(score, 3)}</span></h3>
      ${conversation(res)}
      ${tokenBlock(`tokens`, list(g.tokens)[i], list(g.masks)[i], list(g.inference_logprobs)[i], list(g.pieces)[i])}</div>`;
  });
  app.innerHTML = html + "</div>";
  bindTokenButtons();
}

// ---- compare ----
async function compareView(a, b) {
  const [ra, rb] = await Promise.all([loadRun(a), loadRun(b)]);
  const sa = ra.overview.summary, sb = rb.overview.summary;
  crumbs([["runs", "#/"], [`compare ${sa.name} and ${sb.name}`]]);
  const d = sa.pass_rate != null && sb.pass_rate != null ? sb.pass_rate - sa.pass_rate : null;
  const interval = diffInterval(sa.n_passed, sa.n_scored, sb.n_passed, sb.n_scored);
  const perTask = (rows) => {
    const m = new Map();
    for (const r of rows) {
      if (!r.scored) continue;
      const t = m.get(r.task) || { passed: 0, n: 0, category: r.category, i: r.i };
      t.passed += r.passed ? 1 : 0;
      t.n++;
      m.set(r.task, t);
    }
    return m;
  };
  const ta = perTask(ra.rows), tb = perTask(rb.rows);
  const flipped = [];
  let same = 0;
  for (const [task, x] of ta) {
    const y = tb.get(task);
    if (!y) continue;
    const fa = x.passed / x.n, fb = y.passed / y.n;
    if (fa === fb) same++;
    else flipped.push({ task, category: x.category, fa, fb, ia: x.i, ib: y.i });
  }
  flipped.sort((p, q) => (q.fb - q.fa) - (p.fb - p.fa) || p.task.localeCompare(q.task));
  const onlyA = [...ta.keys()].filter((t) => !tb.has(t)).length, onlyB = [...tb.keys()].filter((t) => !ta.has(t)).length;
  const sign = (x) => (x > 0 ? "+" : "") + (100 * x).toFixed(1) + " pts";
  let html = `<h1>Compare</h1><section id="compare-summary"><div class="stats">
    <div class="stat"><b>${pct(sa.pass_rate)}</b><span>A: <a href="#/run/${esc(a)}">${esc(sa.name)}</a> ${ci(sa.ci95)}</span></div>
    <div class="stat"><b>${pct(sb.pass_rate)}</b><span>B: <a href="#/run/${esc(b)}">${esc(sb.name)}</a> ${ci(sb.ci95)}</span></div>
    <div class="stat"><b id="diff-rate">${d == null ? "–" : sign(d)}</b><span>B − A, 95% interval ${interval ? `[${sign(interval[0])}, ${sign(interval[1])}]` : "–"}</span></div>
    <div class="stat"><b>${flipped.length}</b><span>tasks flipped, ${same} unchanged${onlyA || onlyB ? `, ${onlyA} only in A, ${onlyB} only in B` : ""}</span></div></div>
    <p class="muted">The interval is Newcombe's (hybrid Wilson score) for two independent proportions.</p></section>`;
  const ca = ra.overview.metrics.by_category || {}, cb = rb.overview.metrics.by_category || {};
  const cats = [...new Set([...Object.keys(ca), ...Object.keys(cb)])].sort();
  if (cats.length) {
    html += `<h3>Per category</h3><table id="compare-categories" class="grid small"><thead><tr><th>category</th><th>A</th><th>B</th><th>B − A (95% interval)</th></tr></thead><tbody>`;
    for (const c of cats) {
      const x = ca[c], y = cb[c];
      const iv = x && y ? diffInterval(x.n_passed, x.n, y.n_passed, y.n) : null;
      const dd = x && y ? y.pass_rate - x.pass_rate : null;
      html += `<tr><td>${esc(c)}</td><td class="num">${x ? `${pct(x.pass_rate)} (${count(x.n_passed)}/${count(x.n)})` : "–"}</td>
        <td class="num">${y ? `${pct(y.pass_rate)} (${count(y.n_passed)}/${count(y.n)})` : "–"}</td>
        <td class="num ${dd > 0 ? "pass" : dd < 0 ? "fail" : ""}">${dd == null ? "–" : sign(dd)}${iv ? ` <span class="muted">[${sign(iv[0])}, ${sign(iv[1])}]</span>` : ""}</td></tr>`;
    }
    html += `</tbody></table><h3>Tasks that flipped</h3>`;
  }
  html += `<table id="flipped" class="grid"><thead><tr><th>task</th><th>category</th><th>A passed</th><th>B passed</th><th></th></tr></thead><tbody>`;
  for (const f of flipped) {
    html += `<tr class="${f.fb > f.fa ? "fixed" : "broke"}"><td>${esc(f.task)}</td><td>${esc(f.category)}</td>
      <td class="num"><a href="#/run/${esc(a)}/trial/${esc(f.ia)}">${pct(f.fa)}</a></td><td class="num"><a href="#/run/${esc(b)}/trial/${esc(f.ib)}">${pct(f.fb)}</a></td>
      <td>${f.fb > f.fa ? '<span class="pass">fixed in B</span>' : '<span class="fail">broken in B</span>'}</td></tr>`;
  }
  app.innerHTML = html + "</tbody></table>";
}
