// #/budgets: every Budget's spend against its limit, as a bar, grouped by period (day, week, month,
// total). The figures are the Budget's status, which the budget controller keeps: spend metered in the
// current period, what runs in flight have reserved, and when the period started and ends.
import { bar, empty, errorBox, h, money } from "../lib/ui.js";
import { OPS, V, condition, conditionBadge, heading, listScoped, meta, note, useStyles, watching } from "./shared.js";

const PERIODS = ["day", "week", "month", "total"];
const TITLES = { day: "Daily", week: "Weekly", month: "Monthly", total: "In total" };

export async function render(root, params, ctx) {
  useStyles();
  const body = h("div", { class: "gov-body" });
  root.append(heading("Budgets"), body);

  async function draw() {
    let found;
    try {
      found = await listScoped(ctx, OPS, "budgets");
    } catch (err) {
      body.replaceChildren(errorBox(err));
      return;
    }
    if (!found.items.length) {
      body.replaceChildren(...[note(found.note), empty("No budgets: runs may spend without a limit.")].filter(Boolean));
      return;
    }
    const sections = PERIODS.map((period) => {
      const budgets = found.items.filter((b) => b.spec.period === period)
        .sort((a, b) => ratio(b) - ratio(a) || meta(a, "name").localeCompare(meta(b, "name")));
      if (!budgets.length) return null;
      return h("section", { class: "gov-period", "aria-label": `${TITLES[period]} budgets` },
        h("h2", {}, TITLES[period]), h("ul", { class: "gov-budgets" }, ...budgets.map(row)));
    });
    body.replaceChildren(...[note(found.note), ...sections].filter(Boolean));
  }

  await draw();
  return watching(ctx, [ctx.api.resourcePath(OPS, V, "budgets", ctx.namespace || undefined)], draw);
}

function row(budget) {
  const spec = budget.spec;
  const status = budget.status || {};
  const spend = status.spendUsd || 0;
  const reserved = status.reservedUsd || 0;
  const over = spend >= spec.limitUsd && spec.limitUsd > 0;
  return h("li", { class: `gov-budget${over ? " gov-over" : ""}`, "data-budget": meta(budget, "name") },
    h("div", { class: "gov-budget-head" },
      h("div", {}, h("strong", {}, meta(budget, "name")),
        h("span", { class: "muted" }, ` ${meta(budget, "namespace")} · ${scope(budget)}`)),
      standing(budget)),
    bar(spend, spec.limitUsd),
    h("div", { class: "gov-budget-figures" },
      h("span", {}, `${money(spend)} of ${money(spec.limitUsd)}`),
      reserved ? h("span", { class: "muted" }, `${money(reserved)} reserved by runs in flight`) : "",
      h("span", { class: "muted" }, `${money(status.remainingUsd ?? Math.max(0, spec.limitUsd - spend))} left`),
      h("span", { class: "muted" }, period(status)),
      h("span", { class: "muted" }, `when exceeded: ${spec.onExceed || "deny"} new runs`)));
}

// Exceeded, or how much of the limit is used; a Budget the controller does not count says why.
function standing(budget) {
  const ready = condition(budget, "Ready");
  if (ready && ready.status === "False") return conditionBadge(budget, "Ready");
  const exceeded = condition(budget, "Exceeded");
  if (exceeded && exceeded.status === "True") {
    return h("span", { class: "badge tone-bad", title: exceeded.message || "" }, "Exceeded");
  }
  const used = ratio(budget);
  const tone = used >= 1 ? "bad" : used >= 0.8 ? "warn" : "ok";
  return h("span", { class: `badge tone-${tone}` }, Number.isFinite(used) ? `${Math.round(used * 100)}% used` : "over");
}

function scope(budget) {
  const s = budget.spec.scope || {};
  const parts = [];
  if (s.namespace) parts.push(`namespace ${s.namespace}`);
  if (s.team) parts.push(`team ${s.team}`);
  if (s.agent) parts.push(`agent ${s.agent}`);
  return parts.length ? parts.join(", ") : "every run";
}

function period(status) {
  if (!status.periodStart) return "";
  const day = (t) => String(t).slice(0, 10);
  return status.periodEnd ? `${day(status.periodStart)} – ${day(status.periodEnd)}` : `since ${day(status.periodStart)}`;
}

function ratio(budget) {
  const limit = budget.spec.limitUsd || 0;
  const spend = (budget.status && budget.status.spendUsd) || 0;
  return limit ? spend / limit : spend ? Infinity : 0;
}
