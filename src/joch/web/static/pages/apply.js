// #/apply: paste or edit YAML, run it through the server as a dry run, see each problem next to the
// line it is about, then apply. The server does the work: POST /v1/resources/apply?dryRun=All admits
// every document exactly as a real apply would (schema, references, Policies), and its 422 gives every
// cause the line and column of its field (joch.admission.positions); a YAML syntax error's 400 gives
// its own. Apply is offered once a dry run of the text as it is now has passed. The text is never
// stored anywhere (it may hold a Secret's stringData); only what the server answers is shown.
import { errorBox, h, toast } from "../lib/ui.js";
import { heading, useStyles } from "./shared.js";

const APPLY = "/v1/resources/apply";
const PLACEHOLDER = "apiVersion: joch.dev/v1alpha1\nkind: Agent\nmetadata:\n  name: my-agent\nspec:\n  providerRef:\n    name: demo-agent\n";

export async function render(root, params, ctx) {
  useStyles();
  const gutter = h("div", { class: "gov-gutter", "aria-hidden": "true" });
  const band = h("div", { class: "gov-bands", "aria-hidden": "true" });
  const notes = h("div", { class: "gov-notes", "aria-hidden": "true" });
  const editor = h("textarea", { class: "gov-code", spellcheck: "false", wrap: "off", autocapitalize: "off",
                                 "aria-label": "Manifests (YAML or JSON)", placeholder: PLACEHOLDER });
  const frame = h("div", { class: "gov-editor" }, gutter, h("div", { class: "gov-code-area" }, band, editor, notes));
  const dryRun = h("button", { type: "button", class: "button primary", onclick: () => send(true),
                               title: "Ctrl+Enter" }, "Dry run");
  const apply = h("button", { type: "button", class: "button", disabled: true, onclick: () => send(false) }, "Apply");
  const where = h("span", { class: "muted" },
    ctx.namespace ? `Documents without a namespace go to ${ctx.namespace}.` : "Documents without a namespace go to default.");
  const report = h("div", { class: "gov-report", role: "status", "aria-live": "polite" });
  root.append(heading("Apply", where), frame, h("div", { class: "gov-actions" }, dryRun, apply), report);

  let passed = null; // the text whose dry run passed: Apply sends exactly that
  let marks = [];

  editor.addEventListener("input", () => {
    if (passed !== null && editor.value !== passed) apply.disabled = true;
    if (marks.length) mark([]);
    numberLines();
  });
  editor.addEventListener("scroll", follow);
  editor.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) {
      e.preventDefault();
      send(true);
    } else if (e.key === "Tab" && !e.shiftKey && !e.ctrlKey && !e.altKey) {
      e.preventDefault(); // YAML indents with spaces; Escape then Tab leaves the editor
      editor.setRangeText("  ", editor.selectionStart, editor.selectionEnd, "end");
      editor.dispatchEvent(new Event("input"));
    } else if (e.key === "Escape") {
      editor.blur();
    }
  });

  function lineHeight() {
    return parseFloat(getComputedStyle(editor).lineHeight) || 20;
  }

  function numberLines() {
    const count = editor.value.split("\n").length;
    if (gutter.childElementCount === count && !marks.length) return;
    const flagged = new Map(marks.map((m) => [m.line, m]));
    gutter.replaceChildren(...Array.from({ length: count }, (_, i) => {
      const m = flagged.get(i + 1);
      if (!m) return h("div", {}, String(i + 1));
      return h("div", { class: "gov-line-error", "data-diagnostic-line": String(i + 1),
                        title: m.messages.join("\n") }, String(i + 1));
    }));
    follow();
  }

  function follow() {
    const y = `translateY(${-editor.scrollTop}px)`;
    gutter.style.transform = y;
    band.style.transform = y;
    notes.style.transform = y;
  }

  // Highlight the lines the causes are about; put the first message of each next to it.
  function mark(found) {
    const byLine = new Map();
    for (const d of found) {
      if (!byLine.has(d.line)) byLine.set(d.line, { line: d.line, messages: [] });
      byLine.get(d.line).messages.push(d.text);
    }
    marks = [...byLine.values()];
    const lh = lineHeight();
    band.replaceChildren(...marks.map((m) => {
      const b = h("div", { class: "gov-band" });
      b.style.top = `${(m.line - 1) * lh}px`;
      b.style.height = `${lh}px`;
      return b;
    }));
    notes.replaceChildren(...marks.map((m) => {
      const n = h("div", { class: "gov-inline-note", "data-note-line": String(m.line) },
        m.messages.length > 1 ? `${m.messages[0]} (+${m.messages.length - 1} more)` : m.messages[0]);
      n.style.top = `${(m.line - 1) * lh}px`;
      n.style.height = `${lh}px`;
      return n;
    }));
    gutter.replaceChildren();
    numberLines();
  }

  function goTo(line) {
    const lines = editor.value.split("\n");
    const start = lines.slice(0, line - 1).reduce((n, l) => n + l.length + 1, 0);
    editor.focus();
    editor.setSelectionRange(start, start + (lines[line - 1] || "").length);
    editor.scrollTop = Math.max(0, (line - 3) * lineHeight());
    follow();
  }

  async function send(dry) {
    const text = dry ? editor.value : passed;
    if (!text || !text.trim()) {
      report.replaceChildren(h("p", { class: "muted" }, "Paste or write some manifests first."));
      return;
    }
    dryRun.disabled = true;
    apply.disabled = true;
    const query = {};
    if (dry) query.dryRun = "All";
    if (ctx.namespace) query.namespace = ctx.namespace;
    const path = Object.keys(query).length ? `${APPLY}?${new URLSearchParams(query)}` : APPLY;
    try {
      const result = await ctx.api.post(path, text, { contentType: "application/yaml" });
      mark([]);
      passed = dry ? text : null;
      apply.disabled = !dry || editor.value !== text;
      report.replaceChildren(succeeded(result, dry));
      if (!dry) toast(`Applied ${result.items.length} object${result.items.length === 1 ? "" : "s"}`, "success");
    } catch (err) {
      passed = null;
      const found = diagnostics(err);
      mark(found.filter((d) => d.line));
      report.replaceChildren(failed(err, found));
    } finally {
      dryRun.disabled = false;
    }
  }

  function failed(err, found) {
    if (!found.length) return errorBox(err);
    return h("div", { class: "gov-diagnostics" },
      h("p", { class: "gov-error" }, err.message),
      h("ul", {}, ...found.map((d) => h("li", {},
        d.line ? h("button", { type: "button", class: "button gov-goto", onclick: () => goTo(d.line),
                               "aria-label": `Go to line ${d.line}` }, `line ${d.line}`) : h("span", {}, "—"),
        h("span", { class: "muted" }, ` ${d.where} `),
        h("span", {}, d.text)))));
  }

  numberLines();
  editor.focus();
}

// What the server said, one entry per cause: {line?, where, text}. A rejected batch's causes are in
// details.documents (each with its line); a YAML syntax error has details.line.
function diagnostics(err) {
  const details = err.details || {};
  if (Array.isArray(details.documents)) {
    return details.documents.flatMap((doc) => (doc.causes || []).map((c) => ({
      line: c.line || doc.line || null,
      where: `${label(doc)}${c.field ? ` ${c.field}` : ""}`,
      text: c.message,
    })));
  }
  if (details.line) return [{ line: details.line, where: "YAML", text: err.message }];
  return [];
}

function label(doc) {
  const ref = `documents[${doc.index}]${doc.item !== undefined ? `.items[${doc.item}]` : ""}`;
  return `${ref} ${doc.kind || "?"}/${doc.name || "?"}`;
}

function succeeded(result, dry) {
  const warnings = (result.items || []).flatMap((i) => (i.warnings || []).map((w) => `${i.kind}/${i.name}: ${w}`));
  return h("div", { class: dry ? "gov-dry-ok" : "gov-applied" },
    h("p", {}, dry ? "The dry run passed: nothing was written. Apply to write it." : "Applied."),
    h("ul", { class: "gov-lines" }, ...(result.lines || []).map((l) => h("li", {}, h("code", {}, l)))),
    warnings.length ? h("ul", { class: "gov-warnings" }, ...warnings.map((w) => h("li", { class: "gov-warn" }, w))) : "");
}
