// Small DOM helpers shared by every page. Text always goes in as text nodes (textContent), never as
// HTML: whatever an agent or a user wrote stays inert.

export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "class") el.className = value;
    else if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2).toLowerCase(), value);
    else if (key === "dataset") Object.assign(el.dataset, value);
    else if (key in el && typeof value !== "string") el[key] = value;
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

const PHASE_TONES = {
  Succeeded: "ok", Ready: "ok", Approved: "ok", True: "ok", Synced: "ok", Allowed: "ok",
  Failed: "bad", Denied: "bad", Error: "bad", False: "muted",
  Running: "run", Dispatching: "run",
  AwaitingApproval: "warn", WaitingForApproval: "warn", Pending: "muted", Queued: "muted",
  Cancelled: "warn", Expired: "warn",
};

export function badge(phase) {
  const text = phase || "Unknown";
  return h("span", { class: `badge tone-${PHASE_TONES[text] || "muted"}`, dataset: { phase: text } }, text);
}

function seconds(timestamp) {
  const t = Date.parse(timestamp);
  return Number.isNaN(t) ? null : Math.max(0, (Date.now() - t) / 1000);
}

export function duration(total) {
  if (total === null || total === undefined || Number.isNaN(total)) return "";
  const s = Math.round(total);
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${s % 60 ? `${s % 60}s` : ""}`;
  if (s < 86400) return `${Math.floor(s / 3600)}h${Math.floor((s % 3600) / 60) ? `${Math.floor((s % 3600) / 60)}m` : ""}`;
  return `${Math.floor(s / 86400)}d${Math.floor((s % 86400) / 3600) ? `${Math.floor((s % 86400) / 3600)}h` : ""}`;
}

// "3m" for a timestamp three minutes ago, with the exact time as the tooltip.
export function age(timestamp) {
  const s = seconds(timestamp);
  return h("time", { datetime: timestamp || "", title: timestamp || "" }, s === null ? "" : duration(s));
}

export function money(usd) {
  if (usd === null || usd === undefined || usd === "") return "";
  const n = Number(usd);
  if (Number.isNaN(n)) return "";
  return n !== 0 && Math.abs(n) < 0.01 ? `$${n.toFixed(4)}` : `$${n.toFixed(2)}`;
}

export function empty(message) {
  return h("div", { class: "empty" }, message);
}

export function errorBox(err) {
  const reason = err && err.reason ? `${err.reason}: ` : "";
  return h("div", { class: "error-box", role: "alert" }, `${reason}${(err && err.message) || err}`);
}

export function bar(value, limit) {
  const v = Number(value) || 0;
  const l = Number(limit) || 0;
  const ratio = l > 0 ? v / l : 0;
  const tone = ratio >= 1 ? "bad" : ratio >= 0.8 ? "warn" : "ok";
  const fill = h("div", { class: `bar-fill tone-${tone}` });
  fill.style.width = `${Math.min(100, ratio * 100).toFixed(1)}%`;
  return h("div", { class: "bar", role: "meter", "aria-valuemin": "0", "aria-valuemax": String(l),
                    "aria-valuenow": String(v) }, fill);
}

export function toast(message, kind = "info") {
  const box = document.getElementById("toasts");
  if (!box) return;
  const item = h("div", { class: `toast tone-${kind === "error" ? "bad" : kind === "success" ? "ok" : "run"}` },
                 message);
  box.append(item);
  setTimeout(() => item.remove(), kind === "error" ? 8000 : 4000);
}

// A modal that asks to confirm; with reasonField a reason text box too. Esc cancels.
export function confirmDialog(title, { reasonField = false, confirmLabel = "Confirm", message = "" } = {}) {
  return new Promise((resolve) => {
    const reason = reasonField ? h("textarea", { class: "input", rows: "3", "aria-label": "Reason",
                                                 placeholder: "Reason (recorded with the decision)" }) : null;
    const dialog = h("dialog", { class: "dialog" },
      h("form", { method: "dialog" },
        h("h2", {}, title),
        message ? h("p", {}, message) : null,
        reason,
        h("div", { class: "dialog-buttons" },
          h("button", { type: "submit", value: "cancel", class: "button" }, "Cancel"),
          h("button", { type: "submit", value: "ok", class: "button primary" }, confirmLabel))));
    dialog.addEventListener("close", () => {
      const ok = dialog.returnValue === "ok";
      dialog.remove();
      resolve({ ok, reason: reason ? reason.value.trim() : "" });
    });
    document.body.append(dialog);
    dialog.showModal();
    (reason || dialog.querySelector("button.primary")).focus();
  });
}

function sortValue(column, row) {
  const v = column.sort ? column.sort(row) : column.value ? column.value(row) : "";
  return v === null || v === undefined ? "" : v;
}

// A table of `rows`; columns: [{label, value(row) -> text|Node, sort(row)?, class?}].
// Headers sort (click or Enter); rows are focusable and Enter/click calls onRow(row).
// Returns the <table> with `.update(rows)` (keeps the sort) and `.rowOf(key)`.
export function table(columns, rows, { key = (r) => r.metadata && r.metadata.uid, onRow, label = "" } = {}) {
  let sorted = { index: -1, dir: 1 };
  let current = rows;
  const tbody = h("tbody");
  const heads = columns.map((c, i) => h("th", { scope: "col", class: c.class, tabindex: "0", "aria-sort": "none",
                                               onclick: () => sortBy(i), onkeydown: (e) => {
                                                 if (e.key === "Enter") sortBy(i);
                                               } }, c.label));
  const el = h("table", { class: "table", "aria-label": label }, h("thead", {}, h("tr", {}, heads)), tbody);

  function sortBy(i) {
    sorted = { index: i, dir: sorted.index === i ? -sorted.dir : 1 };
    heads.forEach((th, j) => th.setAttribute("aria-sort", j !== i ? "none" : sorted.dir > 0 ? "ascending" : "descending"));
    render();
  }

  function ordered() {
    if (sorted.index < 0) return current;
    const c = columns[sorted.index];
    return [...current].sort((a, b) => {
      const x = sortValue(c, a);
      const y = sortValue(c, b);
      return (x < y ? -1 : x > y ? 1 : 0) * sorted.dir;
    });
  }

  function cell(c, row) {
    const v = c.value ? c.value(row) : "";
    return h("td", { class: c.class, dataset: { label: c.label } }, v === null || v === undefined ? "" : v);
  }

  function render() {
    const focused = document.activeElement && document.activeElement.dataset
      ? document.activeElement.dataset.key : undefined;
    clear(tbody);
    for (const row of ordered()) {
      const k = String(key(row));
      const tr = h("tr", { dataset: { key: k }, tabindex: onRow ? "0" : undefined, class: onRow ? "clickable" : "" },
                   columns.map((c) => cell(c, row)));
      if (onRow) {
        tr.addEventListener("click", (e) => {
          if (!e.target.closest("a, button")) onRow(row);
        });
        tr.addEventListener("keydown", (e) => {
          if (e.key === "Enter") onRow(row);
          else if (e.key === "ArrowDown" || e.key === "j") (tr.nextElementSibling || tr).focus();
          else if (e.key === "ArrowUp" || e.key === "k") (tr.previousElementSibling || tr).focus();
          else return;
          e.preventDefault();
        });
      }
      tbody.append(tr);
      if (focused === k) tr.focus();
    }
  }

  el.update = (next) => {
    current = next;
    render();
  };
  el.rowOf = (k) => tbody.querySelector(`tr[data-key="${CSS.escape(String(k))}"]`);
  render();
  return el;
}

// A labelled <select> of options [[value, text]].
export function select(labelText, options, value, onChange, attrs = {}) {
  const el = h("select", { class: "input", "aria-label": labelText, ...attrs, onchange: (e) => onChange(e.target.value) },
               options.map(([v, t]) => h("option", { value: v, selected: v === value }, t)));
  return el;
}

export function field(labelText, control) {
  return h("label", { class: "field" }, h("span", { class: "field-label" }, labelText), control);
}

export function section(title, ...children) {
  return h("section", { class: "card" }, h("h2", { class: "card-title" }, title), ...children);
}

export function definitionList(pairs) {
  return h("dl", { class: "facts" }, pairs.filter(([, v]) => v !== undefined && v !== null && v !== "")
    .map(([k, v]) => [h("dt", {}, k), h("dd", {}, v)]));
}
