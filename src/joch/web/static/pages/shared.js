// What the governance pages (approvals, agents, budgets, sources, audit, apply) share: reading a
// kind in the selected namespace, redrawing when it changes, and a few small views.
// Everything is built with ui.h (textContent only): no data ever goes through innerHTML.
import { h, table } from "../lib/ui.js";

export const JOCH = "joch.dev";
export const RUNTIME = "runtime.joch.dev";
export const OPS = "ops.joch.dev";
export const V = "v1alpha1";

let styled = false;

// The pages' own stylesheet (a file of the server's origin, as the CSP asks), added once.
export function useStyles() {
  if (styled) return;
  styled = true;
  const link = document.createElement("link");
  link.rel = "stylesheet";
  link.href = new URL("./governance.css", import.meta.url).href;
  document.head.append(link);
}

// The items of a kind in the selected namespace ("" = all). A user who may not list every
// namespace (a RoleBinding outside joch-system) gets the default namespace's, with a note saying so.
export async function listScoped(ctx, group, plural, options = {}) {
  const namespace = ctx.namespace || undefined;
  try {
    const list = await ctx.api.list(group, V, plural, { ...options, namespace });
    return { items: list.items || [], namespace: ctx.namespace || "", note: null, continueToken: continued(list) };
  } catch (err) {
    if (namespace || err.status !== 403) throw err;
    const list = await ctx.api.list(group, V, plural, { ...options, namespace: "default" });
    return { items: list.items || [], namespace: "default", continueToken: continued(list),
             note: "You may not list every namespace: showing the default namespace." };
  }
}

function continued(list) {
  return (list.metadata && list.metadata.continue) || null;
}

export function condition(obj, type) {
  return ((obj.status && obj.status.conditions) || []).find((c) => c.type === type) || null;
}

// "True", "False", "Unknown" as a badge, the condition's message as its title.
export function conditionBadge(obj, type) {
  const c = condition(obj, type);
  const status = c ? c.status : "Unknown";
  const tone = status === "True" ? "ok" : status === "False" ? "bad" : "muted";
  const reason = c && c.reason ? ` (${c.reason})` : "";
  return h("span", { class: `badge tone-${tone}`, title: c && c.message ? c.message : "" },
    status === "True" ? type : status === "False" ? `Not ${type.toLowerCase()}${reason}` : `${type}?`);
}

export function link(hash, text) {
  return h("a", { href: hash }, text);
}

export function runLink(namespace, name) {
  return link(`#/runs/${encodeURIComponent(namespace)}/${encodeURIComponent(name)}`, name);
}

export function heading(title, ...actions) {
  return h("div", { class: "page-head" }, h("h1", {}, title), h("div", { class: "actions" }, ...actions));
}

export function note(text) {
  return text ? h("p", { class: "gov-note", role: "status" }, text) : null;
}

export function meta(obj, key) {
  return (obj.metadata && obj.metadata[key]) || "";
}

export function newestFirst(stamp) {
  return (a, b) => String(stamp(b) || "").localeCompare(String(stamp(a) || ""));
}

// ui.table ([{label, value(row) -> text or Node, sort?(row)}]) in the shell's scrolling frame.
export function grid(columns, rows, options = {}) {
  return h("div", { class: "table-wrap" }, table(columns, rows, options));
}

// Re-render ``draw`` when any of the watched lists change (debounced); returns the cleanup.
export function watching(ctx, paths, draw) {
  let timer = null;
  const again = () => {
    clearTimeout(timer);
    timer = setTimeout(draw, 250);
  };
  const watches = paths.map((path) => ctx.api.watch(path, {}, again));
  return () => {
    clearTimeout(timer);
    watches.forEach((w) => w.close());
  };
}
