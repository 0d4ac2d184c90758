// #/sources: where work comes from. ImplementationSources with their sync status (Ready, last sync,
// what the last sync changed, the last error, a rate limit being waited out), and TriggerRules, each
// with its most recent TriggerExecutions: the decision taken on an event (Dispatched, Deduplicated,
// Rejected), why, and the run it started. A source's credentials are Secrets: never read here.
import { age, badge, empty, errorBox, h } from "../lib/ui.js";
import { JOCH, RUNTIME, V, conditionBadge, grid, heading, listScoped, meta, newestFirst, note, runLink, useStyles,
  watching } from "./shared.js";

const RECENT = 5;
const TRIGGERS = ["issue", "comment", "schedule", "webhook"];
const DECISIONS = { Dispatched: "Succeeded", Deduplicated: "Pending", Rejected: "Failed" };

export async function render(root, params, ctx) {
  useStyles();
  const body = h("div", { class: "gov-body" });
  root.append(heading("Sources and triggers"), body);

  async function draw() {
    try {
      const [sources, rules, executions] = await Promise.all([
        listScoped(ctx, JOCH, "implementationsources"),
        listScoped(ctx, JOCH, "triggerrules"),
        listScoped(ctx, RUNTIME, "triggerexecutions").catch((err) => ({ items: [], note: null, error: err })),
      ]);
      body.replaceChildren(...[
        note(sources.note),
        h("h2", {}, "Implementation sources"),
        sourceTable(sources.items),
        h("h2", {}, "Trigger rules"),
        executions.error ? errorBox(executions.error) : null,
        ruleList(rules.items, executions.items),
      ].filter(Boolean));
    } catch (err) {
      body.replaceChildren(errorBox(err));
    }
  }

  await draw();
  const namespace = ctx.namespace || undefined;
  return watching(ctx, [ctx.api.resourcePath(JOCH, V, "implementationsources", namespace),
                        ctx.api.resourcePath(JOCH, V, "triggerrules", namespace),
                        ctx.api.resourcePath(RUNTIME, V, "triggerexecutions", namespace)], draw);
}

function sourceTable(sources) {
  if (!sources.length) return empty("No implementation sources: specs come from manifests only.");
  const columns = [
    { label: "Source", value: (s) => meta(s, "name"), sort: (s) => meta(s, "name") },
    { label: "Namespace", value: (s) => meta(s, "namespace"), class: "wide" },
    { label: "Follows", value: follows, class: "wide" },
    { label: "Status", value: (s) => (s.spec.suspend ? badge("Suspended") : conditionBadge(s, "Ready")) },
    { label: "Last sync", value: (s) => (s.status && s.status.lastSyncedAt ? age(s.status.lastSyncedAt) : "never"),
      sort: (s) => (s.status && s.status.lastSyncedAt) || "" },
    { label: "Issues", value: counts },
    { label: "Problem", value: problem, class: "gov-wrap" },
  ];
  return grid(columns, sources, { key: (s) => meta(s, "uid") });
}

function follows(source) {
  const spec = source.spec;
  if (spec.provider === "github" && spec.github) return `github ${spec.github.owner}/${spec.github.repo}`;
  if (spec.provider === "linear" && spec.linear) return `linear team ${spec.linear.teamKey}`;
  return spec.provider;
}

function counts(source) {
  const c = (source.status && source.status.counts) || null;
  if (!c) return "—";
  const changed = [c.created && `${c.created} new`, c.updated && `${c.updated} updated`, c.stale && `${c.stale} stale`,
                   c.diverged && `${c.diverged} edited by hand`].filter(Boolean);
  return `${c.issues}${changed.length ? ` (last sync: ${changed.join(", ")})` : ""}`;
}

function problem(source) {
  const status = source.status || {};
  if (status.rateLimitedUntil) return h("span", { class: "gov-warn" }, `rate limited until ${status.rateLimitedUntil}`);
  if (status.lastError) return h("span", { class: "gov-error" }, status.lastError);
  return h("span", { class: "muted" }, "—");
}

function ruleList(rules, executions) {
  if (!rules.length) return empty("No trigger rules: runs start only when someone creates them.");
  const byRule = new Map();
  for (const e of executions.slice().sort(newestFirst((x) => x.spec.evaluatedAt))) {
    const k = `${meta(e, "namespace")}/${e.spec.ruleRef.name}`;
    if (!byRule.has(k)) byRule.set(k, []);
    byRule.get(k).push(e);
  }
  const sorted = rules.slice().sort((a, b) => meta(a, "name").localeCompare(meta(b, "name")));
  return h("div", { class: "gov-rules" }, ...sorted.map((rule) =>
    ruleCard(rule, byRule.get(`${meta(rule, "namespace")}/${meta(rule, "name")}`) || [])));
}

function ruleCard(rule, executions) {
  const spec = rule.spec;
  const status = rule.status || {};
  const fired = status.lastFiredAt ? [", last fired ", age(status.lastFiredAt), " ago"] : [", never fired"];
  const next = status.nextScheduleTime ? `, next at ${status.nextScheduleTime}` : "";
  return h("section", { class: "gov-rule", "data-rule": meta(rule, "name"), "aria-label": `Trigger rule ${meta(rule, "name")}` },
    h("div", { class: "gov-rule-head" },
      h("strong", {}, meta(rule, "name")),
      h("span", { class: "muted" }, ` ${meta(rule, "namespace")}`),
      spec.enabled === false ? badge("Disabled") : conditionBadge(rule, "Ready")),
    h("p", { class: "gov-rule-what" },
      `${trigger(rule)} → runs agent ${spec.run.agentRef.name}`,
      h("span", { class: "muted" }, ` · ${status.executions || 0} executions`, ...fired, next)),
    executions.length ? executionTable(executions.slice(0, RECENT)) : h("p", { class: "muted" }, "No executions yet."));
}

function trigger(rule) {
  const spec = rule.spec;
  const which = TRIGGERS.find((t) => spec[t]);
  const source = spec.sourceRef ? ` of ${spec.sourceRef.name}` : "";
  if (which === "issue") {
    return spec.issue.label ? `issue labelled ${spec.issue.label}${source}` : `issue opened${source}`;
  }
  if (which === "comment") return `comment "${spec.comment.command || "/joch run"}"${source}`;
  if (which === "schedule") return `schedule ${spec.schedule.cron}${spec.schedule.timeZone ? ` (${spec.schedule.timeZone})` : ""}`;
  if (which === "webhook") return "webhook";
  return "manual (joch trigger fire)";
}

function executionTable(executions) {
  const columns = [
    { label: "Decision", value: (e) => decision(e.spec.decision) },
    { label: "Event", value: event, class: "wide" },
    { label: "Why", value: (e) => [e.spec.reason, e.spec.message].filter(Boolean).join(": ") || "—", class: "gov-wrap" },
    { label: "Run", value: (e) => (e.spec.runRef ? runLink(meta(e, "namespace"), e.spec.runRef.name) : "—") },
    { label: "When", value: (e) => age(e.spec.evaluatedAt), sort: (e) => e.spec.evaluatedAt },
  ];
  return grid(columns, executions, { key: (e) => meta(e, "uid") });
}

// A decision shown with the colour of the phase it resembles: dispatched green, rejected red.
function decision(value) {
  const b = badge(DECISIONS[value] || "Pending");
  b.textContent = value;
  return b;
}

function event(execution) {
  const e = execution.spec.event;
  const parts = [e.kind, e.action, e.item, e.actor && `by ${e.actor}`].filter(Boolean).join(" ");
  // Only web links: a URL from an event is data, and javascript: must never become a link.
  const web = typeof e.url === "string" && /^https?:\/\//i.test(e.url);
  return web ? h("a", { href: e.url, rel: "noreferrer noopener", target: "_blank" }, parts) : parts;
}
