// One run: its phase timeline, facts (cost, compiled manifest hash...), conditions, Events, the log as
// it is written, artifacts to download, and changes.patch as a unified or side-by-side diff. The run
// and its Events are watched, so everything moves while the page is open. Cancel and Re-run are shown
// only to users the server would let do them (SelfSubjectAccessReview); the server checks anyway.

import * as diff from "../lib/diff.js";
import { h, age, badge, clear, confirmDialog, definitionList, duration, empty, errorBox, money, section, table,
         toast } from "../lib/ui.js";
import { runDuration } from "./runs.js";

const GROUP = "runtime.joch.dev";
const VERSION = "v1alpha1";
const FINISHED = new Set(["Succeeded", "Failed", "Cancelled"]);
const PATCH = "changes.patch";
const STEPS = ["Pending", "Queued", "Running"];
const LOG_LIMIT = 2_000_000;  // characters kept on the page; older output is dropped from the top
const LOG_LINES = 10_000;  // the server sends only the last lines of what is written so far (tailLines)

function phaseOf(run) {
  return (run.status || {}).phase || "Pending";
}

function condition(run, type) {
  return ((run.status || {}).conditions || []).find((c) => c.type === type);
}

// The steps a run went through, with when each began (as far as its status says).
function timeline(run) {
  const s = run.status || {};
  const phase = phaseOf(run);
  const approval = condition(run, "Approved") || condition(run, "AwaitingApproval");
  const steps = [{ name: "Pending", at: run.metadata.creationTimestamp }];
  if (approval || phase === "AwaitingApproval") steps.push({ name: "AwaitingApproval", at: approval && approval.lastTransitionTime });
  steps.push({ name: "Queued", at: (condition(run, "Accepted") || {}).lastTransitionTime });
  steps.push({ name: "Running", at: s.startedAt });
  const end = FINISHED.has(phase) ? phase : "Succeeded";
  steps.push({ name: end, at: s.finishedAt || (condition(run, end) || {}).lastTransitionTime });
  const current = steps.findIndex((step) => step.name === phase);
  return steps.map((step, i) => ({ ...step, done: current >= 0 && i <= current,
                                   current: i === current && !FINISHED.has(phase) }));
}

function renderTimeline(run) {
  return h("ol", { class: "timeline", "aria-label": "Phase timeline" }, timeline(run).map((step) =>
    h("li", { class: [step.done ? "done" : "", step.current ? "current" : "",
                      step.done && (step.name === "Failed" || step.name === "Cancelled") ? "failed" : ""].join(" "),
              dataset: { step: step.name } },
      h("span", { class: "dot" }), step.name, step.done && step.at ? age(step.at) : null)));
}

function usage(run) {
  const u = (run.status || {}).usage;
  if (!u) return "";
  return `${u.inputTokens || 0} in / ${u.outputTokens || 0} out${u.cachedTokens ? ` / ${u.cachedTokens} cached` : ""}`;
}

function facts(run) {
  const s = run.status || {};
  const spec = run.spec || {};
  const git = ((spec.execution || {}).coordinates || {}).git || {};
  const implementation = spec.implementationRef ? spec.implementationRef.name : spec.implementation ? "inline text" : "";
  const agent = (spec.agentRef || {}).name;
  return definitionList([
    ["Namespace", run.metadata.namespace],
    ["Agent", agent ? h("a", { href: `#/agents/${run.metadata.namespace}/${agent}` }, agent) : ""],
    ["Implementation", implementation],
    ["Repository", git.url ? `${git.url}${git.ref ? ` @ ${git.ref}` : ""}${git.path && git.path !== "." ? ` (${git.path})` : ""}` : ""],
    ["Created", run.metadata.creationTimestamp],
    ["Duration", duration(runDuration(run))],
    ["Attempt", s.attempt],
    ["Cost", money(s.costUsd) || "none reported"],
    ["Tokens", usage(run)],
    ["Exit code", s.exitCode],
    ["Reason", s.reason ? `${s.reason}${s.message ? `: ${s.message}` : ""}` : ""],
    ["Approval", phaseOf(run) === "AwaitingApproval" ? h("a", { href: "#/approvals" }, "waiting: open the approvals inbox") : ""],
    ["Compiled manifest", s.compiledManifestHash ? h("code", { id: "manifest-hash" }, s.compiledManifestHash) : ""],
    ["Base commit", s.baseCommit ? h("code", {}, s.baseCommit.slice(0, 12)) : ""],
    ["Created by", (run.metadata.annotations || {})["joch.dev/created-by"]],
  ]);
}

function conditionsTable(run) {
  const rows = (run.status || {}).conditions || [];
  if (!rows.length) return empty("No conditions yet.");
  return h("div", { class: "table-wrap conditions" }, table([
    { label: "Type", value: (c) => c.type },
    { label: "Status", value: (c) => badge(c.status) },
    { label: "Reason", value: (c) => c.reason || "" },
    { label: "Message", value: (c) => c.message || "" },
    { label: "Changed", value: (c) => age(c.lastTransitionTime), sort: (c) => c.lastTransitionTime },
  ], rows, { key: (c) => c.type, label: "Conditions" }));
}

function eventsTable(events) {
  const rows = [...events.values()].sort((a, b) => ((a.lastTimestamp || "") < (b.lastTimestamp || "") ? 1 : -1));
  if (!rows.length) return empty("No events.");
  return h("div", { class: "table-wrap" }, table([
    { label: "Type", value: (e) => h("span", { class: `badge ${e.type === "Warning" ? "tone-warn" : "tone-muted"}` },
                                     e.type || "Normal") },
    { label: "Reason", value: (e) => e.reason || "" },
    { label: "Message", value: (e) => e.message || "" },
    { label: "Count", value: (e) => e.count || 1, class: "num" },
    { label: "Last seen", value: (e) => age(e.lastTimestamp || e.metadata.creationTimestamp),
      sort: (e) => e.lastTimestamp || "" },
  ], rows, { key: (e) => e.metadata.uid, label: "Events" }));
}

async function download(ctx, path, name) {
  try {
    const response = await ctx.api.fetchRaw(path);
    const url = URL.createObjectURL(await response.blob());
    const a = h("a", { href: url, download: name, hidden: true });
    document.body.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10_000);
  } catch (err) {
    toast(`${name}: ${err.message}`, "error");
  }
}

function rerunObject(run) {
  const spec = { ...run.spec };
  delete spec.cancel;
  delete spec.idempotencyKey;  // the same key would answer with the old run
  return {
    apiVersion: `${GROUP}/${VERSION}`, kind: "AgentRun",
    metadata: { generateName: `${run.metadata.name.replace(/-rerun-[a-z0-9]*$/, "")}-rerun-`,
                labels: run.metadata.labels || {} },
    spec,
  };
}

export async function render(root, params, ctx) {
  const { namespace, name } = params;
  const runPath = ctx.api.resourcePath(GROUP, VERSION, "agentruns", namespace, name);
  const closers = [];
  let run;
  try {
    run = await ctx.api.get(runPath);
  } catch (err) {
    if (err.status === 401) throw err;
    root.append(h("p", {}, h("a", { href: "#/runs" }, "← Runs")), errorBox(err));
    return undefined;
  }
  const [mayCancel, mayCreate] = await Promise.all([
    ctx.can("patch", "agentruns", namespace, GROUP), ctx.can("create", "agentruns", namespace, GROUP)]);

  const phaseBadge = h("span", { id: "run-phase" });
  const cancelButton = h("button", { class: "button danger", id: "cancel-run", hidden: true, onclick: async () => {
    const answer = await confirmDialog(`Cancel run ${name}?`, { confirmLabel: "Cancel run",
                                                               message: "The agent is stopped; its work so far is kept." });
    if (!answer.ok) return;
    try {
      await ctx.api.patch(runPath, { spec: { cancel: true } });
      toast(`Cancel requested for ${name}`, "success");
    } catch (err) {
      toast(err.message, "error");
    }
  } }, "Cancel");
  const rerunButton = mayCreate ? h("button", { class: "button", id: "rerun", onclick: async () => {
    try {
      const created = await ctx.api.post(ctx.api.resourcePath(GROUP, VERSION, "agentruns", namespace), rerunObject(run));
      toast(`Started ${created.metadata.name}`, "success");
      ctx.navigate(`#/runs/${namespace}/${created.metadata.name}`);
    } catch (err) {
      toast(err.message, "error");
    }
  } }, "Re-run") : null;
  const timelineBox = h("div");
  const factsBox = h("div");
  const conditionsBox = h("div");
  const eventsBox = h("div");
  const log = h("pre", { class: "log", id: "log", tabindex: "0", "aria-label": "Log" });
  const logState = h("span", { class: "muted", id: "log-state" });
  const artifactsBox = h("div");
  const diffBox = h("div", { id: "diff" });
  let diffMode = localStorage.getItem("joch.diffMode") || "unified";
  let patchText = null;
  const modeButtons = ["unified", "split"].map((mode) => h("button", {
    type: "button", "aria-pressed": String(mode === diffMode), dataset: { mode },
    onclick: () => {
      diffMode = mode;
      localStorage.setItem("joch.diffMode", mode);
      modeButtons.forEach((b) => b.setAttribute("aria-pressed", String(b.dataset.mode === mode)));
      drawDiff();
    } }, mode === "unified" ? "Unified" : "Side by side"));

  const deleted = h("div", { class: "error-box", id: "run-deleted", role: "alert", hidden: true },
                  `Run ${name} was deleted: this page shows it as it was.`);
  root.append(
    h("p", {}, h("a", { href: "#/runs" }, "← Runs")),
    deleted,
    h("div", { class: "page-head" },
      h("div", {}, h("h1", {}, name, " ", phaseBadge), timelineBox),
      h("div", { class: "actions" }, mayCancel ? cancelButton : null, rerunButton)),
    h("div", { class: "grid" }, section("Details", factsBox), section("Conditions", conditionsBox)),
    section("Log", h("div", { class: "toolbar" }, logState,
                     h("button", { class: "button", type: "button", id: "download-log",
                                   onclick: () => download(ctx, `${runPath}/log`, `${name}.log`) }, "Download log")),
            log),
    section("Changes", h("div", { class: "toolbar" }, h("div", { class: "segmented", role: "group",
                                                                   "aria-label": "Diff layout" }, modeButtons)),
            diffBox),
    h("div", { class: "grid" }, section("Artifacts", artifactsBox), section("Events", eventsBox)));

  function drawRun() {
    clear(phaseBadge).append(badge(phaseOf(run)));
    clear(timelineBox).append(renderTimeline(run));
    clear(factsBox).append(facts(run));
    clear(conditionsBox).append(conditionsTable(run));
    cancelButton.hidden = FINISHED.has(phaseOf(run));
  }

  function drawDiff() {
    clear(diffBox);
    if (patchText === null) diffBox.append(empty(FINISHED.has(phaseOf(run)) ? "No changes.patch." : "The patch appears when the run ends."));
    else diffBox.append(diff.render(patchText, diffMode));
  }

  let artifactsLoaded = false;
  async function loadArtifacts() {
    if (artifactsLoaded || !FINISHED.has(phaseOf(run))) {
      if (!artifactsLoaded) clear(artifactsBox).append(empty("Artifacts are listed when the run ends."));
      drawDiff();
      return;
    }
    artifactsLoaded = true;
    try {
      const list = await ctx.api.get(`${runPath}/artifacts`);
      const items = list.items || [];
      clear(artifactsBox).append(items.length ? h("div", { class: "table-wrap" }, table([
        { label: "Name", value: (a) => a.name },
        { label: "Size", value: (a) => (a.size === undefined || a.size === null ? "" : `${a.size} B`), class: "num" },
        { label: "", value: (a) => h("button", { class: "button", onclick: () => download(ctx, `${runPath}/artifacts/${encodeURIComponent(a.name)}`, a.name) }, "Download") },
      ], items, { key: (a) => a.name, label: "Artifacts" })) : empty("No artifacts."));
      if (items.some((a) => a.name === PATCH)) patchText = await ctx.api.text(`${runPath}/artifacts/${PATCH}`);
    } catch (err) {
      if (err.status === 401) throw err;
      clear(artifactsBox).append(errorBox(err));
    }
    drawDiff();
  }

  // The log: read once when the run is over, followed (?follow=true) while it runs; either way the
  // server sends only its last LOG_LINES lines so far (?tailLines=), then what follows. What arrives
  // is kept as a string (its last LOG_LIMIT characters) and drawn at most once a frame: an agent may
  // write 50 MB, and redrawing the page for each chunk of it would hold the tab for seconds.
  const logAbort = new AbortController();
  closers.push(() => logAbort.abort());
  let logText = "";
  let logCut = false;
  let logLines = 0;  // newlines in the first LOG_LINES lines received: at LOG_LINES, older ones were left out
  let logFrame = 0;
  closers.push(() => cancelAnimationFrame(logFrame));
  function drawLog() {
    logFrame = 0;
    const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 8;
    log.textContent = logText;
    if (atBottom) log.scrollTop = log.scrollHeight;
  }
  function cutNote() {
    if (logCut) return `Showing the last ${LOG_LIMIT.toLocaleString("en")} characters: Download log for all of it.`;
    if (logLines >= LOG_LINES) return `Showing the last ${LOG_LINES.toLocaleString("en")} lines: Download log for all of it.`;
    return "";
  }
  async function followLog() {
    const follow = !FINISHED.has(phaseOf(run));
    logState.textContent = follow ? "Following the log…" : "";
    try {
      const response = await ctx.api.fetchRaw(`${runPath}/log`,
                                             { tailLines: String(LOG_LINES), ...(follow ? { follow: "true" } : {}) },
                                             logAbort.signal);
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        const text = decoder.decode(value, { stream: true });
        if (logLines < LOG_LINES) logLines += text.split("\n").length - 1;
        logText += text;
        if (logText.length > LOG_LIMIT) {
          logText = logText.slice(-LOG_LIMIT);
          if (!logCut) {
            logCut = true;
            logState.textContent = `${follow ? "Following the log… " : ""}${cutNote()}`;
          }
        }
        if (!logFrame) logFrame = requestAnimationFrame(drawLog);
      }
      cancelAnimationFrame(logFrame);
      drawLog();
      logState.textContent = logText ? cutNote() : "The log is empty.";
    } catch (err) {
      if (logAbort.signal.aborted) return;
      logState.textContent = err.status === 400 ? err.message : `The log could not be read: ${err.message}`;
    }
  }

  const events = new Map();
  async function watchEvents() {
    const query = { fieldSelector: `involvedObject.name=${name}` };
    try {
      const list = await ctx.api.get(`/api/v1/namespaces/${encodeURIComponent(namespace)}/events`, query);
      for (const e of list.items || []) events.set(e.metadata.uid, e);
      clear(eventsBox).append(eventsTable(events));
      const watcher = ctx.api.watch(`/api/v1/namespaces/${encodeURIComponent(namespace)}/events`,
                                    { ...query, resourceVersion: list.metadata.resourceVersion }, (event) => {
        if (event.type === "RESYNC") events.clear();
        else if (event.type === "DELETED") events.delete(event.object.metadata.uid);
        else events.set(event.object.metadata.uid, event.object);
        clear(eventsBox).append(eventsTable(events));
      });
      closers.push(() => watcher.close());
    } catch (err) {
      clear(eventsBox).append(errorBox(err));
    }
  }

  drawRun();
  loadArtifacts();
  followLog();
  watchEvents();
  const watcher = ctx.api.watch(ctx.api.resourcePath(GROUP, VERSION, "agentruns", namespace),
                                { fieldSelector: `metadata.name=${name}`, resourceVersion: run.metadata.resourceVersion },
                                (event) => {
    if (event.type === "DELETED") {  // the page stays, as the run was when it went, and says so
      deleted.hidden = false;
      cancelButton.remove();
      return;
    }
    if (event.type !== "ADDED" && event.type !== "MODIFIED") return;
    const wasFinished = FINISHED.has(phaseOf(run));
    run = event.object;
    drawRun();
    if (!wasFinished && FINISHED.has(phaseOf(run))) loadArtifacts();
  });
  closers.push(() => watcher.close());
  const tick = setInterval(drawRun, 10_000);
  closers.push(() => clearInterval(tick));
  return () => closers.forEach((close) => close());
}
