// Runs: a live table. One page is listed (limit PAGE, so the first paint is as fast on 10,000 runs as
// on ten), then a watch from that list's resourceVersion keeps it current: new runs appear and phases
// change without a reload. Agent and phase filter on the server (field selectors), labels with a label
// selector; the search box filters the rows already here. Filters live in the hash (#/runs?phase=Failed)
// so a filtered view can be shared.

import { h, age, badge, duration, empty, errorBox, money, table, field, select } from "../lib/ui.js";

const GROUP = "runtime.joch.dev";
const VERSION = "v1alpha1";
const PAGE = 100;
const PHASES = ["Pending", "AwaitingApproval", "Queued", "Running", "Succeeded", "Failed", "Cancelled"];
const TICK_MS = 10_000;

export function runDuration(run) {
  const s = run.status || {};
  if (!s.startedAt) return null;
  const end = s.finishedAt ? Date.parse(s.finishedAt) : Date.now();
  return Math.max(0, (end - Date.parse(s.startedAt)) / 1000);
}

function selectors(filters) {
  const fields = [];
  if (filters.agent) fields.push(`spec.agentRef.name=${filters.agent}`);
  if (filters.phase) fields.push(`status.phase=${filters.phase}`);
  return { fieldSelector: fields.join(","), labelSelector: filters.label || "" };
}

function columns(ctx) {
  const cols = [
    { label: "Name", value: (r) => h("a", { href: `#/runs/${r.metadata.namespace}/${r.metadata.name}` }, r.metadata.name),
      sort: (r) => r.metadata.name },
    { label: "Agent", value: (r) => (r.spec.agentRef || {}).name || "", class: "wide" },
    { label: "Phase", value: (r) => badge((r.status || {}).phase || "Pending"), sort: (r) => (r.status || {}).phase || "" },
    { label: "Age", value: (r) => age(r.metadata.creationTimestamp), sort: (r) => r.metadata.creationTimestamp },
    { label: "Duration", value: (r) => duration(runDuration(r)), sort: (r) => runDuration(r) ?? -1, class: "num wide" },
    { label: "Cost", value: (r) => money((r.status || {}).costUsd), sort: (r) => (r.status || {}).costUsd ?? -1, class: "num wide" },
  ];
  if (!ctx.namespace) cols.splice(1, 0, { label: "Namespace", value: (r) => r.metadata.namespace, class: "wide" });
  return cols;
}

function newestFirst(a, b) {
  const x = a.metadata.creationTimestamp || "";
  const y = b.metadata.creationTimestamp || "";
  return x < y ? 1 : x > y ? -1 : a.metadata.name.localeCompare(b.metadata.name);
}

export async function render(root, params, ctx) {
  const query = params.query || new URLSearchParams();
  const filters = { agent: query.get("agent") || "", phase: query.get("phase") || "", label: query.get("label") || "",
                    search: query.get("q") || "" };
  const runs = new Map();  // uid -> run
  const deleted = new Set();  // uids the watch saw deleted
  let continueToken = "";
  let watcher = null;
  let tick = null;
  let frame = 0;
  let closed = false;

  function setFilter(key, value) {
    filters[key] = value.trim();
    const next = new URLSearchParams();
    for (const [k, v] of Object.entries({ agent: filters.agent, phase: filters.phase, label: filters.label,
                                          q: filters.search })) {
      if (v) next.set(k, v);
    }
    const text = next.toString();
    ctx.navigate(`#/runs${text ? `?${text}` : ""}`);
  }

  const search = h("input", { class: "input", type: "search", placeholder: "Filter by name or agent   /",
                              value: filters.search, "aria-label": "Filter runs", dataset: { filter: "" },
                              oninput: (e) => { filters.search = e.target.value.trim(); schedule(); } });
  const agentInput = h("input", { class: "input", placeholder: "any", value: filters.agent, "aria-label": "Agent",
                                  onchange: (e) => setFilter("agent", e.target.value) });
  const labelInput = h("input", { class: "input", placeholder: "app=web,tier!=test", value: filters.label,
                                  "aria-label": "Label selector", onchange: (e) => setFilter("label", e.target.value) });
  const phaseSelect = select("Phase", [["", "any"], ...PHASES.map((p) => [p, p])], filters.phase,
                             (value) => setFilter("phase", value));
  const summary = h("span", { class: "muted", id: "runs-summary" });
  const live = h("span", { class: "badge tone-muted", id: "live", title: "Changes arrive as they happen" }, "connecting");
  const more = h("button", { class: "button", hidden: true, onclick: () => loadPage() }, "Load more");
  const messages = h("div");

  const tbl = table(columns(ctx), [], { key: (r) => r.metadata.uid, label: "Runs",
                                        onRow: (r) => ctx.navigate(`#/runs/${r.metadata.namespace}/${r.metadata.name}`) });
  const wrap = h("div", { class: "table-wrap" }, tbl);
  const none = empty("No runs match. Start one with joch run, or apply an AgentRun on the Apply page.");

  root.append(
    h("div", { class: "page-head" }, h("div", {}, h("h1", {}, "Runs"), h("div", {}, summary, " ", live))),
    h("div", { class: "toolbar" },
      field("Search", search), field("Agent", agentInput), field("Phase", phaseSelect), field("Labels", labelInput)),
    messages, wrap, none, h("div", { class: "more" }, more));

  function visible() {
    const needle = filters.search.toLowerCase();
    const rows = [...runs.values()].filter((r) => !needle || r.metadata.name.toLowerCase().includes(needle)
      || ((r.spec.agentRef || {}).name || "").toLowerCase().includes(needle));
    return rows.sort(newestFirst);
  }

  function draw() {
    frame = 0;
    const rows = visible();
    tbl.update(rows);
    wrap.hidden = rows.length === 0;
    none.hidden = rows.length !== 0;
    summary.textContent = `${rows.length} run${rows.length === 1 ? "" : "s"}${continueToken ? " shown (more to load)" : ""}`;
    more.hidden = !continueToken;
  }

  function schedule() {
    if (!frame) frame = requestAnimationFrame(draw);
  }

  function flash(uid) {
    requestAnimationFrame(() => {
      const row = tbl.rowOf(uid);
      if (row) row.classList.add("flash");
    });
  }

  const base = selectors(filters);

  async function loadPage() {
    const list = await ctx.api.list(GROUP, VERSION, "agentruns", { namespace: ctx.namespace, limit: PAGE,
                                                                    continueToken, ...base });
    // A later page is the first page's snapshot: what the watch brought since is newer, and what it
    // deleted stays deleted.
    for (const run of list.items || []) {
      if (!runs.has(run.metadata.uid) && !deleted.has(run.metadata.uid)) runs.set(run.metadata.uid, run);
    }
    continueToken = (list.metadata || {}).continue || "";
    schedule();
    return list;
  }

  function onEvent(event) {
    if (event.type === "DELETED") {
      runs.delete(event.object.metadata.uid);
      deleted.add(event.object.metadata.uid);
    } else if (event.type === "ADDED" || event.type === "MODIFIED") {
      const uid = event.object.metadata.uid;
      const before = runs.get(uid);
      runs.set(uid, event.object);
      if (!before || (before.status || {}).phase !== (event.object.status || {}).phase) flash(uid);
    }
    live.textContent = "live";
    live.className = "badge tone-ok";
    schedule();
  }

  // List the first page, then watch from its resourceVersion; again from the start if that expires.
  async function begin() {
    runs.clear();
    deleted.clear();
    continueToken = "";
    const first = await loadPage();
    draw();
    performance.mark("joch:runs-rendered");  // bench/console_bench.py reads it: navigation to the first rows
    const path = ctx.api.resourcePath(GROUP, VERSION, "agentruns", ctx.namespace);
    watcher = ctx.api.watch(path, { resourceVersion: first.metadata.resourceVersion, ...base }, onEvent, {
      onError: (err) => {
        live.textContent = err.status === 403 ? "not live" : "reconnecting";
        live.className = "badge tone-warn";
      },
      onExpired: () => closed || begin().catch(failed),
    });
    live.textContent = "live";
    live.className = "badge tone-ok";
  }

  function failed(err) {
    messages.append(errorBox(err));
    wrap.hidden = true;
    none.hidden = true;
  }

  try {
    await begin();
  } catch (err) {
    if (err.status === 401) throw err;
    failed(err);
  }
  tick = setInterval(schedule, TICK_MS);  // ages and running durations move on

  return () => {
    closed = true;
    if (watcher) watcher.close();
    clearInterval(tick);
    if (frame) cancelAnimationFrame(frame);
  };
}
