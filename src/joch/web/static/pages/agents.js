// #/agents and #/agents/:namespace/:name: every Agent with whether it is Ready, what it refers to,
// and how its recent runs went (success rate over the finished ones) and what it spent (the metering
// routes, as `joch cost --by agent` reads them: the usage table, so runs since deleted still count).
import { age, badge, definitionList, duration, empty, errorBox, h, money } from "../lib/ui.js";
import { JOCH, RUNTIME, V, conditionBadge, grid, heading, link, listScoped, meta, newestFirst, note, runLink,
  useStyles, watching } from "./shared.js";

const RECENT = 20;
const SPEND_PERIOD = "30d";
const FINISHED = new Set(["Succeeded", "Failed", "Cancelled"]);

export async function render(root, params, ctx) {
  useStyles();
  const body = h("div", { class: "gov-body" });
  const one = params && params.name ? params : null;
  root.append(heading(one ? `Agent ${one.name}` : "Agents", one ? link("#/agents", "All agents") : ""), body);

  async function draw() {
    try {
      body.replaceChildren(...(one ? await detail(ctx, one) : await overview(ctx)));
    } catch (err) {
      body.replaceChildren(errorBox(err));
    }
  }

  await draw();
  const namespace = one ? one.namespace : ctx.namespace || undefined;
  return watching(ctx, [ctx.api.resourcePath(JOCH, V, "agents", namespace),
                        ctx.api.resourcePath(RUNTIME, V, "agentruns", namespace)], draw);
}

async function overview(ctx) {
  const [agents, runs] = await Promise.all([listScoped(ctx, JOCH, "agents"), listScoped(ctx, RUNTIME, "agentruns")]);
  const spend = await spendByAgent(ctx, agents.namespace);
  if (!agents.items.length) return [note(agents.note), empty("No agents in this namespace.")].filter(Boolean);
  const byAgent = runsByAgent(runs.items);
  const stats = (a) => summary(byAgent.get(key(meta(a, "namespace"), meta(a, "name"))) || []);
  const columns = [
    { label: "Agent", value: (a) => link(agentHash(a), meta(a, "name")), sort: (a) => meta(a, "name") },
    { label: "Namespace", value: (a) => meta(a, "namespace"), class: "wide" },
    { label: "Ready", value: (a) => conditionBadge(a, "Ready") },
    { label: "Provider", value: (a) => a.spec.providerRef.name, class: "wide" },
    { label: "Runs", value: (a) => String(stats(a).total), sort: (a) => stats(a).total },
    { label: "Success", value: (a) => rate(stats(a)), sort: (a) => stats(a).rate ?? -1 },
    { label: `Spend (${SPEND_PERIOD})`, value: (a) => money(spendOf(spend, a)), sort: (a) => spendOf(spend, a) },
    { label: "Last run", value: (a) => lastRun(stats(a)), class: "wide" },
  ];
  return [note(agents.note), grid(columns, agents.items, { key: (a) => meta(a, "uid"),
                                                            onRow: (a) => ctx.navigate(agentHash(a)) })]
    .filter(Boolean);
}

async function detail(ctx, { namespace, name }) {
  const path = ctx.api.resourcePath(JOCH, V, "agents", namespace, name);
  const [agent, runs, spend] = await Promise.all([
    ctx.api.get(path),
    ctx.api.list(RUNTIME, V, "agentruns", { namespace, fieldSelector: `spec.agentRef.name=${name}` }),
    spendByAgent(ctx, namespace),
  ]);
  const mine = (runs.items || []).sort(newestFirst(created));
  const stats = summary(mine);
  const status = agent.status || {};
  const facts = definitionList([
    ["Ready", conditionBadge(agent, "Ready")],
    ["Description", agent.spec.description || "—"],
    ["Runs", `${stats.total} recent, ${stats.finished} finished`],
    ["Success rate", rate(stats)],
    [`Spend (${SPEND_PERIOD})`, money(spendOf(spend, agent))],
    ["Compiled manifest", status.compiledManifestHash || "—"],
  ]);
  const columns = [
    { label: "Run", value: (r) => runLink(namespace, meta(r, "name")), sort: (r) => meta(r, "name") },
    { label: "Phase", value: (r) => badge(phaseOf(r)), sort: phaseOf },
    { label: "Age", value: (r) => age(created(r)), sort: created },
    { label: "Duration", value: (r) => runDuration(r), class: "wide" },
    { label: "Cost", value: (r) => money((r.status && r.status.costUsd) || 0), sort: (r) => (r.status && r.status.costUsd) || 0 },
  ];
  return [
    facts,
    h("h2", {}, "References"), references(agent),
    h("h2", {}, "Recent runs"),
    mine.length ? grid(columns, mine.slice(0, RECENT), { key: (r) => meta(r, "uid"),
                                                         onRow: (r) => ctx.navigate(`#/runs/${namespace}/${meta(r, "name")}`) })
      : empty("This agent has not run yet."),
  ];
}

// What the Agent points at, each with whether it exists (a missing one is what keeps it from Ready).
function references(agent) {
  const spec = agent.spec;
  const refs = [["AgentProvider", spec.providerRef && spec.providerRef.name]];
  for (const t of spec.tools || []) refs.push(["Tool", t.name]);
  for (const m of spec.mcpServers || []) refs.push(["MCP server", m.name]);
  if (spec.memoryRef) refs.push(["Memory", spec.memoryRef.name]);
  for (const p of spec.policies || []) refs.push(["Policy", p.name]);
  if (spec.modelRoute) refs.push(["Model route", spec.modelRoute]);
  return h("ul", { class: "gov-refs" },
    ...refs.filter(([, name]) => name).map(([what, name]) => h("li", {}, h("span", { class: "muted" }, `${what} `),
      h("code", {}, name))));
}

async function spendByAgent(ctx, namespace) {
  const path = namespace ? `/v1/namespaces/${encodeURIComponent(namespace)}/cost` : "/v1/cost";
  try {
    const report = await ctx.api.get(path, { by: "agent", since: SPEND_PERIOD });
    return new Map((report.items || []).map((i) => [key(i.namespace, i.agent), i.costUsd || 0]));
  } catch {
    return new Map(); // spend is a column, not the page: a user who may not read it still sees the agents
  }
}

function spendOf(spend, agent) {
  return spend.get(key(meta(agent, "namespace"), meta(agent, "name"))) || 0;
}

function runsByAgent(runs) {
  const out = new Map();
  for (const run of runs.sort(newestFirst(created))) {
    const k = key(meta(run, "namespace"), run.spec.agentRef.name);
    if (!out.has(k)) out.set(k, []);
    if (out.get(k).length < RECENT) out.get(k).push(run);
  }
  return out;
}

// Of the recent runs: how many finished, how many of those succeeded, and the newest.
function summary(runs) {
  const finished = runs.filter((r) => FINISHED.has(phaseOf(r)));
  const succeeded = finished.filter((r) => phaseOf(r) === "Succeeded").length;
  return { total: runs.length, finished: finished.length, succeeded,
           rate: finished.length ? succeeded / finished.length : null, last: runs[0] || null };
}

function rate(stats) {
  if (stats.rate === null) return h("span", { class: "muted" }, "—");
  const percent = Math.round(stats.rate * 100);
  return h("span", { class: `gov-rate ${percent >= 80 ? "gov-good" : percent >= 50 ? "gov-fair" : "gov-poor"}`,
                     title: `${stats.succeeded} of ${stats.finished} finished runs succeeded` }, `${percent}%`);
}

function lastRun(stats) {
  if (!stats.last) return h("span", { class: "muted" }, "never");
  return h("span", {}, badge(phaseOf(stats.last)), " ", age(created(stats.last)));
}

function runDuration(run) {
  const status = run.status || {};
  if (!status.startedAt) return "—";
  const end = status.finishedAt ? Date.parse(status.finishedAt) : Date.now();
  return duration(Math.max(0, (end - Date.parse(status.startedAt)) / 1000));
}

function agentHash(agent) {
  return `#/agents/${encodeURIComponent(meta(agent, "namespace"))}/${encodeURIComponent(meta(agent, "name"))}`;
}

function phaseOf(run) {
  return (run.status && run.status.phase) || "Pending";
}

function created(obj) {
  return meta(obj, "creationTimestamp");
}

function key(namespace, name) {
  return `${namespace}/${name}`;
}
