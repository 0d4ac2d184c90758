// A git patch (changes.patch) as files of hunks of lines, rendered unified or side by side. Every
// line goes into the page as text: a patch is whatever the agent wrote.

import { h } from "./ui.js";

// [{name, oldName, newName, binary, hunks: [{header, lines: [{kind: " "|"+"|"-", text, old, new}]}]}]
export function parse(patch) {
  const files = [];
  let file = null;
  let hunk = null;
  let oldLine = 0;
  let newLine = 0;
  let oldLeft = 0;  // lines the hunk header says are still to come: what follows them is not the hunk's
  let newLeft = 0;
  for (const line of patch.split("\n")) {
    if (hunk && (oldLeft > 0 || newLeft > 0) && /^[ +-]/.test(line)) {
      const kind = line[0];
      hunk.lines.push({ kind, text: line.slice(1), old: kind === "+" ? null : oldLine, new: kind === "-" ? null : newLine });
      if (kind !== "+") { oldLine += 1; oldLeft -= 1; }
      if (kind !== "-") { newLine += 1; newLeft -= 1; }
    } else if (line.startsWith("diff --git ")) {
      const m = /^diff --git a\/(.*) b\/(.*)$/.exec(line);
      file = { name: m ? m[2] : line.slice(11), oldName: m ? m[1] : "", binary: false, hunks: [], meta: [] };
      files.push(file);
      hunk = null;
    } else if (file && line.startsWith("@@")) {
      const m = /^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@/.exec(line) || [];
      oldLine = Number(m[1] || 0);
      oldLeft = m[2] === undefined ? 1 : Number(m[2]);
      newLine = Number(m[3] || 0);
      newLeft = m[4] === undefined ? 1 : Number(m[4]);
      hunk = { header: line, lines: [] };
      file.hunks.push(hunk);
    } else if (file && !hunk) {
      if (line.startsWith("Binary files")) file.binary = true;
      if (line === "+++ /dev/null") file.name = file.oldName;
      if (!line.startsWith("--- ") && !line.startsWith("+++ ") && !line.startsWith("index ")) file.meta.push(line);
    }
    // anything else: the mail header before the first file, "\ No newline", the signature after the last
  }
  return files;
}

// Characters of one line drawn at most: a minified bundle's single line of 100,000 characters would
// wrap into a column tens of thousands of pixels tall (on a phone, most of all).
export const MAX_LINE_CHARS = 1000;

function code(text) {
  if (text.length <= MAX_LINE_CHARS) return text;
  return [text.slice(0, MAX_LINE_CHARS),
          h("span", { class: "diff-more" }, ` … ${(text.length - MAX_LINE_CHARS).toLocaleString("en")} more characters`)];
}

function ln(n) {
  return h("td", { class: "ln" }, n === null || n === undefined ? "" : String(n));
}

const KIND_CLASS = { "+": "add", "-": "del", " ": "ctx" };

function unifiedFile(file) {
  const rows = [];
  for (const hunk of file.hunks) {
    rows.push(h("tr", { class: "hunk" }, h("td", { colspan: "3" }, hunk.header)));
    for (const line of hunk.lines) {
      rows.push(h("tr", { class: KIND_CLASS[line.kind] }, ln(line.old), ln(line.new),
                  h("td", { class: "code" }, line.kind, code(line.text))));
    }
  }
  return h("table", { class: "diff-unified" }, h("tbody", {}, rows));
}

// Side by side: a run of deletions is paired with the additions that follow it, line by line.
function pairs(lines) {
  const out = [];
  let i = 0;
  while (i < lines.length) {
    if (lines[i].kind === " ") {
      out.push([lines[i], lines[i]]);
      i += 1;
      continue;
    }
    const dels = [];
    const adds = [];
    while (i < lines.length && lines[i].kind === "-") dels.push(lines[i++]);
    while (i < lines.length && lines[i].kind === "+") adds.push(lines[i++]);
    for (let j = 0; j < Math.max(dels.length, adds.length); j += 1) out.push([dels[j] || null, adds[j] || null]);
  }
  return out;
}

function side(line, which) {
  if (!line) return [ln(null), h("td", { class: "side empty-side" })];
  const changed = line.kind !== " ";
  return [ln(which === "old" ? line.old : line.new),
          h("td", { class: `side ${changed ? KIND_CLASS[line.kind] : ""}` }, code(line.text))];
}

function splitFile(file) {
  const rows = [];
  for (const hunk of file.hunks) {
    rows.push(h("tr", { class: "hunk" }, h("td", { colspan: "4" }, hunk.header)));
    for (const [left, right] of pairs(hunk.lines)) rows.push(h("tr", {}, side(left, "old"), side(right, "new")));
  }
  return h("table", { class: "diff-split" }, h("tbody", {}, rows));
}

// Lines of a patch drawn at most: an agent's patch can be any size, and a table of 60,000 rows
// holds the page for seconds. The rest is in the downloaded changes.patch.
export const MAX_LINES = 5000;

// `files` cut to their first `max` lines (whole hunks dropped past it, the last one shortened), and
// how many lines there were in all.
function firstLines(files, max) {
  let left = max;
  let total = 0;
  const kept = [];
  for (const file of files) {
    const hunks = [];
    for (const hunk of file.hunks) {
      total += hunk.lines.length;
      if (left > 0) hunks.push(hunk.lines.length <= left ? hunk : { ...hunk, lines: hunk.lines.slice(0, left) });
      left = Math.max(0, left - hunk.lines.length);
    }
    if (hunks.length || (left > 0 && !file.hunks.length)) kept.push({ ...file, hunks });
  }
  return { kept, total };
}

// The rendered patch: mode "unified" or "split".
export function render(patch, mode = "unified") {
  const files = parse(patch);
  if (!files.length) return h("div", { class: "empty" }, "The patch changes no files.");
  const { kept, total } = firstLines(files, MAX_LINES);
  const cut = total > MAX_LINES
    ? h("div", { class: "empty diff-cut", role: "note" }, `Showing the first ${MAX_LINES.toLocaleString("en")} of `
        + `${total.toLocaleString("en")} lines of ${files.length} file${files.length === 1 ? "" : "s"}: `
        + "download changes.patch (Artifacts) for all of it.")
    : null;
  return h("div", { class: `diff diff-${mode}` }, cut, kept.map((file) => h("div", { class: "diff-file" },
    h("div", { class: "diff-file-name" }, file.name),
    file.binary ? h("div", { class: "empty" }, "Binary file changed")
      : file.hunks.length ? (mode === "split" ? splitFile(file) : unifiedFile(file))
        : h("div", { class: "empty" }, file.meta.join(" ") || "No content changes"))), cut && cut.cloneNode(true));
}
