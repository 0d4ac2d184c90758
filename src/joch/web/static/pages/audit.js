// #/audit: the audit log, newest first, filtered as `joch audit` filters it (GET /v1/audit: user,
// verb, kind, namespace, name, decision, since/until). Pages go back in time with the server's
// continue token, so rows written meanwhile never shift what "Older" shows.
import { empty, errorBox, field, h } from "../lib/ui.js";
import { grid, heading, useStyles } from "./shared.js";

const PAGE = 100;
const FIELDS = [
  ["actor", "User", "alice"],
  ["verb", "Verb", "create, update, approve…"],
  ["kind", "Resource", "agents, runs, Policy…"],
  ["namespace", "Namespace", "default"],
  ["name", "Name", ""],
  ["since", "Since", "1h, 7d or 2026-01-31T00:00:00Z"],
  ["until", "Until", "RFC 3339 time or duration"],
];

export async function render(root, params, ctx) {
  useStyles();
  const inputs = new Map();
  const decision = h("select", { name: "decision", class: "input", "aria-label": "Decision" },
    h("option", { value: "" }, "any decision"), h("option", { value: "allowed" }, "allowed"),
    h("option", { value: "denied" }, "denied"));
  const form = h("form", { class: "gov-filters", role: "search", onsubmit: (e) => { e.preventDefault(); search(); } },
    ...FIELDS.map(([name, label, placeholder]) => {
      const input = h("input", { name, placeholder, class: "input", "aria-label": label, autocomplete: "off" });
      if (name === "namespace" && ctx.namespace) input.value = ctx.namespace;
      inputs.set(name, input);
      return field(label, input);
    }),
    field("Decision", decision),
    h("div", { class: "gov-filter-buttons" },
      h("button", { type: "submit", class: "button primary" }, "Filter"),
      h("button", { type: "button", class: "button", onclick: () => { form.reset(); search(); } }, "Clear")));
  const results = h("div", { class: "gov-body" });
  root.append(heading("Audit log"), form, results);

  let rows = [];
  let next = null;

  function query() {
    const q = { limit: String(PAGE) };
    for (const [name, input] of inputs) if (input.value.trim()) q[name] = input.value.trim();
    if (decision.value) q.decision = decision.value;
    return q;
  }

  async function load(token) {
    const q = query();
    if (token) q.continue = token;
    const page = await ctx.api.get("/v1/audit", q);
    next = (page.metadata && page.metadata.continue) || null;
    return page.items || [];
  }

  async function search() {
    try {
      rows = await load(null);
      draw();
    } catch (err) {
      results.replaceChildren(errorBox(err));
    }
  }

  async function older() {
    try {
      rows = rows.concat(await load(next));
      draw();
    } catch (err) {
      results.append(errorBox(err));
    }
  }

  function draw() {
    if (!rows.length) {
      results.replaceChildren(empty("No audit events match."));
      return;
    }
    const columns = [
      { label: "Time", value: (r) => h("time", { datetime: r.time }, r.time.replace("T", " ").replace(/\.\d+/, "")),
        sort: (r) => r.time },
      { label: "User", value: (r) => h("span", { title: (r.groups || []).join(", ") }, r.actor) },
      { label: "Verb", value: (r) => r.verb },
      { label: "Resource", value: (r) => [r.kind, r.name].filter(Boolean).join("/") },
      { label: "Namespace", value: (r) => r.namespace || "—", class: "wide" },
      { label: "Decision", value: (r) => h("span", { class: `gov-decision gov-${r.decision}` }, r.decision) },
      { label: "Reason", value: (r) => r.reason || "" },
    ];
    results.replaceChildren(
      grid(columns, rows, { key: (r) => String(r.id) }),
      h("p", { class: "more" }, `${rows.length} events`,
        next ? h("button", { type: "button", class: "button", onclick: older }, "Older") : ""));
  }

  await search();
}
