// #/approvals: the inbox. Pending approvals first (oldest first: they have waited longest), then the
// decided and expired ones, newest first. Approve and Deny (with a reason) go to the decide route, as
// `joch approve` does; the buttons are shown only to a user the server lets decide in that namespace
// (update on approvals/decide), and the server refuses anyone else anyway.
//
// The server selects (fieldSelector on status.phase) and pages: every approval still waiting is listed
// (they are few, and each needs a decision), the decided ones a page of DECIDED_PAGE at a time, with
// "More" for the next page, so a namespace with years of decisions opens as fast as a new one.
import { age, badge, confirmDialog, empty, errorBox, h, toast } from "../lib/ui.js";
import { RUNTIME, V, grid, heading, listScoped, meta, note, runLink, useStyles, watching } from "./shared.js";

const ORDER = { Pending: 0 };
const DECIDED = ["Approved", "Denied", "Expired"];
const WAITING = DECIDED.map((phase) => `status.phase!=${phase}`).join(",");  // also one with no phase yet
const DECIDED_PAGE = 100;
const WAITING_PAGE = 500;

export async function render(root, params, ctx) {
  useStyles();
  let showAll = true;
  let decidedShown = DECIDED_PAGE;  // how many decided approvals "More" has asked for so far
  const body = h("div", { class: "gov-body" });
  const toggle = h("label", { class: "gov-toggle" },
    h("input", { type: "checkbox", checked: true, id: "show-decided",
                 onchange: (e) => { showAll = e.target.checked; draw(); } }),
    " Show decided");
  root.append(heading("Approvals", toggle), body);

  async function decide(approval, approve) {
    const namespace = meta(approval, "namespace");
    const name = meta(approval, "name");
    const run = approval.spec.runRef.name;
    const answer = await confirmDialog(`${approve ? "Approve" : "Deny"} run ${run}?`, {
      reasonField: true, confirmLabel: approve ? "Approve" : "Deny",
      message: approve ? "The run is dispatched as soon as it is approved." : "The run is not dispatched.",
    });
    if (!answer || !answer.ok) return;
    const decision = { decision: approve ? "approve" : "deny" };
    if (answer.reason) decision.reason = answer.reason;
    try {
      const path = `/v1/namespaces/${encodeURIComponent(namespace)}/approvals/${encodeURIComponent(name)}/decide`;
      await ctx.api.post(path, decision);
      toast(`Run ${run} ${approve ? "approved" : "denied"}`, "success");
    } catch (err) {
      toast(err.message || String(err), "error");
    }
    await draw();
  }

  async function actions(approval) {
    const phase = (approval.status && approval.status.phase) || "Pending";
    if (phase !== "Pending") return decidedBy(approval);
    if (!(await ctx.can("update", "approvals/decide", meta(approval, "namespace"), RUNTIME))) {
      return h("span", { class: "muted" }, "awaiting an approver");
    }
    const run = approval.spec.runRef.name;
    return h("div", { class: "gov-actions" },
      h("button", { class: "button primary gov-approve", "aria-label": `Approve run ${run}`, onclick: () => decide(approval, true) },
        "Approve"),
      h("button", { class: "button gov-deny", "aria-label": `Deny run ${run}`, onclick: () => decide(approval, false) },
        "Deny"));
  }

  // Every waiting approval, page by page; then, when shown, the first `decidedShown` decided ones.
  async function load() {
    const waiting = await listScoped(ctx, RUNTIME, "approvals", { fieldSelector: WAITING, limit: String(WAITING_PAGE) });
    let token = waiting.continueToken;
    while (token) {
      const page = await ctx.api.list(RUNTIME, V, "approvals", { namespace: waiting.namespace || undefined,
        fieldSelector: WAITING, limit: String(WAITING_PAGE), continueToken: token });
      waiting.items.push(...(page.items || []));
      token = (page.metadata && page.metadata.continue) || null;
    }
    let decided = [];
    let more = false;
    if (showAll) {
      const found = await listScoped(ctx, RUNTIME, "approvals", { fieldSelector: "status.phase!=Pending",
                                                                  limit: String(decidedShown) });
      const waitingUids = new Set(waiting.items.map((a) => meta(a, "uid")));
      decided = found.items.filter((a) => !waitingUids.has(meta(a, "uid")));
      more = Boolean(found.continueToken);
    }
    return { items: [...waiting.items, ...decided], note: waiting.note, more };
  }

  async function draw() {
    let found;
    try {
      found = await load();
    } catch (err) {
      body.replaceChildren(errorBox(err));
      return;
    }
    const rows = found.items
      .filter((a) => showAll || phaseOf(a) === "Pending")
      .sort(byInbox);
    if (!rows.length) {
      body.replaceChildren(note(found.note) || "", empty(showAll ? "No approvals yet." : "Nothing waits for a decision."));
      return;
    }
    const cells = await Promise.all(rows.map(actions));
    const decisions = new Map(rows.map((row, i) => [row, cells[i]]));
    // The decision next to the run, so a phone shows the buttons without scrolling ("wide": not on a phone).
    const columns = [
      { label: "Phase", value: (a) => badge(phaseOf(a)), sort: phaseOf },
      { label: "Run", value: (a) => runLink(meta(a, "namespace"), a.spec.runRef.name), sort: (a) => a.spec.runRef.name },
      { label: "Decision", value: (a) => decisions.get(a) },
      { label: "Why", value: why, class: "gov-wrap" },
      { label: "Action", value: (a) => a.spec.action || "dispatch", class: "wide" },
      { label: "Requested by", value: (a) => a.spec.requestedBy || "", class: "wide" },
      { label: "Namespace", value: (a) => meta(a, "namespace"), class: "wide" },
      { label: "Age", value: (a) => age(meta(a, "creationTimestamp")), sort: (a) => meta(a, "creationTimestamp") },
    ];
    const more = found.more
      ? h("p", { class: "more" }, `${rows.length} approvals`,
          h("button", { type: "button", class: "button", id: "more-approvals",
                        onclick: () => { decidedShown += DECIDED_PAGE; draw(); } }, "More"))
      : "";
    body.replaceChildren(...[note(found.note), grid(columns, rows, { key: (a) => meta(a, "uid") }), more]
      .filter(Boolean));
  }

  await draw();
  return watching(ctx, [ctx.api.resourcePath(RUNTIME, V, "approvals", ctx.namespace || undefined)], draw);
}

function phaseOf(approval) {
  return (approval.status && approval.status.phase) || "Pending";
}

function byInbox(a, b) {
  const pa = ORDER[phaseOf(a)] ?? 1;
  const pb = ORDER[phaseOf(b)] ?? 1;
  if (pa !== pb) return pa - pb;
  const ta = meta(a, "creationTimestamp");
  const tb = meta(b, "creationTimestamp");
  return pa === 0 ? ta.localeCompare(tb) : tb.localeCompare(ta);
}

// Why the run waits: the Approval's reason (a Policy's says which rule asked), else its Policy, else
// the Agent's requiresApproval.
function why(approval) {
  const spec = approval.spec;
  if (spec.reason) return spec.reason;
  if (spec.policyRef) {
    const rule = spec.policyRef.rule ? ` rule "${spec.policyRef.rule}"` : "";
    return `Policy ${spec.policyRef.namespace || meta(approval, "namespace")}/${spec.policyRef.name}${rule}`;
  }
  return "the agent requires approval";
}

function decidedBy(approval) {
  const status = approval.status || {};
  if (status.phase === "Expired") return h("span", { class: "muted" }, "expired");
  const reason = status.reason ? ` — ${status.reason}` : "";
  return h("span", { title: status.decidedAt || "" }, `${status.decidedBy || "?"}${reason}`);
}
