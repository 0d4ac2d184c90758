"""``joch describe``: one object and its events as a page a person reads top to bottom.

The header (Name, Namespace, Labels, Annotations, API Version, Kind, Metadata) follows
``kubectl describe``. Spec and Status are printed as indented YAML-ish blocks that keep the
*field names* as written in manifests (``providerRef``, not kubectl's ``Provider Ref``), so what
a user reads is the path they would edit or see in an admission error. Empty lists and maps are
left out: admission defaults many of them and they are noise on a page meant for reading.

Conditions get their own table (Type, Status, Reason, Message, Age since the last transition)
because they are what a user looks at first when something is not Ready; an AgentRun's
``status.artifacts`` get one too (Name, Size, SHA256), under ``Artifacts:``, since a digest is
unreadable as a YAML block. What ran gets its own blocks after them: ``Invocation:`` (the
executable's path, version and sha256, the argv as one shell-quoted line — the runner redacted
secrets in it — and the environment's variable *names*; values are never recorded), ``Base Commit``,
``Manifest Hash``, ``Sandbox``, ``Session`` (resumed from which attempt, or started over) and the
files ``changes.patch`` left out (``Omitted:``). An ImplementationSource gets ``Sync:`` (when it last
synced, its cursor, the issues it holds and what the last sync changed, a rate limit, the last error).
A kind that keeps its fields at the top level, as a RoleBinding keeps
``roleRef`` and ``subjects``, gets a block per field (``roleRef:``, ``subjects:``) instead of Spec.
Events are the ``events.ops.joch.dev`` whose ``spec.involvedObject`` names this object
(``reading`` finds them), oldest first. Rendering is a pure function of the object, its events
and ``now``.

A ``Secret``'s values are never printed: like ``kubectl describe secret``, each key shows only its
size under ``Data:``, ``token:  12 bytes`` — from ``status.keys``, which is all the server returns of
a Secret (``joch.api.secrets``); a ``spec.data`` or ``spec.stringData`` in the object (an older
server) is shown as sizes too.
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import shlex
from collections.abc import Sequence
from typing import Any

from joch.api import columns
from joch.cli import printers
from joch.cli.resolve import ResourceType

HEADER_WIDTH = len("Annotations:  ")
INDENT = "  "
SECRET = ("ops.joch.dev", "Secret")
AGENT_RUN = ("runtime.joch.dev", "AgentRun")
SOURCE = ("joch.dev", "ImplementationSource")
TOP_LEVEL = ("apiVersion", "kind", "metadata", "spec", "status")
RUN_OWN_BLOCKS = ("artifacts", "invocation", "baseCommit", "compiledManifestHash", "sandbox", "session", "omitted")


def describe(
    obj: dict[str, Any], rt: ResourceType, *, events: Sequence[dict[str, Any]], now: dt.datetime
) -> str:
    meta = obj.get("metadata") or {}
    lines = [_header("Name", meta.get("name", ""))]
    if rt.namespaced:
        lines.append(_header("Namespace", meta.get("namespace", "")))
    lines += _pairs("Labels", meta.get("labels"))
    lines += _pairs("Annotations", meta.get("annotations"))
    lines += [_header("API Version", obj.get("apiVersion", rt.api_version)), _header("Kind", rt.kind)]
    lines += _section("Metadata", _metadata(meta), 0)
    top = _top_fields(obj)
    if "spec" in obj or not top:
        spec = obj.get("spec")
        lines += _section("Spec", _sizes_only(spec) if (rt.group, rt.kind) == SECRET else spec, 0)
    for key, value in top.items():  # a kind shaped like Kubernetes' RoleBinding
        lines += _section(key, value, 0)
    status = obj.get("status") or {}
    if (rt.group, rt.kind) == AGENT_RUN:
        lines += _status({k: v for k, v in status.items() if k not in RUN_OWN_BLOCKS}, now)
        lines += _artifacts(status.get("artifacts") or [])
        lines += _what_ran(status)
    elif (rt.group, rt.kind) == SECRET:
        listed = {str(k.get("name")): f"{k.get('size')} bytes" for k in status.get("keys") or [] if isinstance(k, dict)}
        lines += _section("Data", listed, 0)
        lines += _status({k: v for k, v in status.items() if k != "keys"}, now)
    elif not top or "status" in obj:  # a kind such as RoleBinding has no status: no "Status: <none>"
        lines += _status(status, now)
    if (rt.group, rt.kind) == SOURCE:
        lines += _sync(status)
    lines += _events(events, now)
    return "\n".join(lines) + "\n"


def _top_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """The fields of a kind that keeps them at the top level, as Kubernetes' RoleBinding keeps
    ``roleRef`` and ``subjects`` (``KindInfo.body == "top"``); empty for every other kind."""
    return {k: v for k, v in obj.items() if k not in TOP_LEVEL}


def _header(label: str, value: Any) -> str:
    return f"{label}:".ljust(HEADER_WIDTH) + _text(value)


def _pairs(label: str, mapping: dict[str, str] | None) -> list[str]:
    if not mapping:
        return [_header(label, columns.NONE)]
    items = [f"{k}={v}" for k, v in sorted(mapping.items())]
    return [_header(label, items[0]), *(" " * HEADER_WIDTH + item for item in items[1:])]


def _metadata(meta: dict[str, Any]) -> dict[str, Any]:
    keys = ("uid", "creationTimestamp", "deletionTimestamp", "resourceVersion", "generation",
            "generateName", "finalizers", "ownerReferences")
    return {k: meta[k] for k in keys if meta.get(k) not in (None, "", [], {})}


def _sizes_only(spec: Any) -> Any:
    """A Secret's spec with every value replaced by its size in bytes."""
    if not isinstance(spec, dict):
        return spec
    shown = dict(spec)
    for field, encoded in (("data", True), ("stringData", False)):
        values = spec.get(field)
        if isinstance(values, dict):
            shown[field] = {key: _size(value, encoded) for key, value in values.items()}
    return shown


def _size(value: Any, encoded: bool) -> str:
    text = value if isinstance(value, str) else str(value)
    if not encoded:
        return f"{len(text.encode())} bytes"
    try:
        return f"{len(base64.b64decode(text, validate=True))} bytes"
    except (binascii.Error, ValueError):
        return f"{len(text.encode())} bytes (not valid base64)"


def _section(title: str, value: Any, indent: int) -> list[str]:
    pad = INDENT * indent
    if _empty(value):
        return [f"{pad}{title}:".ljust(HEADER_WIDTH) + columns.NONE] if indent == 0 else []
    if _is_scalar(value):
        return [f"{pad}{title}:  {_text(value)}"]
    return [f"{pad}{title}:", *_block(value, indent + 1)]


def _block(value: Any, indent: int) -> list[str]:
    if isinstance(value, dict):
        return _mapping(value, indent)
    if isinstance(value, list):
        return _sequence(value, indent)
    return [INDENT * indent + line for line in _text(value).splitlines()]


def _mapping(mapping: dict[str, Any], indent: int) -> list[str]:
    pad = INDENT * indent
    entries = [(str(k), v) for k, v in mapping.items() if not _empty(v)]
    width = max((len(k) for k, v in entries if _one_line(v)), default=0) + len(":  ")
    lines = []
    for key, value in entries:
        if _one_line(value):
            lines.append(f"{pad}{(key + ':').ljust(width)}{_text(value)}")
        elif isinstance(value, str):
            lines += [f"{pad}{key}:  |", *(pad + INDENT + line for line in value.splitlines())]
        else:
            lines += [f"{pad}{key}:", *_block(value, indent + 1)]
    return lines


def _sequence(items: list[Any], indent: int) -> list[str]:
    pad = INDENT * indent
    lines = []
    for item in items:
        if _one_line(item):
            lines.append(f"{pad}- {_text(item)}")
            continue
        nested = _block(item, indent + 1)
        lines += [pad + "- " + nested[0].lstrip(), *nested[1:]]
    return lines


def _status(status: dict[str, Any], now: dt.datetime) -> list[str]:
    rest = {k: v for k, v in status.items() if k != "conditions"}
    lines = _section("Status", rest, 0) if rest else ["Status:"]
    conditions = status.get("conditions") or []
    if not conditions:
        return lines if rest else [f"{'Status:'.ljust(HEADER_WIDTH)}{columns.NONE}"]
    headers = ["Type", "Status", "Reason", "Message", "Age"]
    rows = [
        [_text(c.get("type")), _text(c.get("status")), _text(c.get("reason")), _text(c.get("message")),
         columns.age(c.get("lastTransitionTime"), now)]
        for c in conditions
    ]
    table = printers.render_table(headers, rows)
    return [*lines, f"{INDENT}Conditions:", *(INDENT * 2 + line for line in table)]


def _artifacts(artifacts: Sequence[dict[str, Any]]) -> list[str]:
    if not artifacts:
        return [f"{'Artifacts:'.ljust(HEADER_WIDTH)}{columns.NONE}"]
    headers = ["Name", "Size", "SHA256"]
    rows = [[_text(a.get("name")), _text(a.get("size")), _text(a.get("sha256"))] for a in artifacts]
    table = printers.render_table(headers, [["-" * len(h) for h in headers], *rows])
    return ["Artifacts:", *(INDENT + line for line in table)]


def _what_ran(status: dict[str, Any]) -> list[str]:
    """An AgentRun's record of what ran: the invocation, the commit and manifest it started from,
    its sandbox and session, the files its patch left out."""
    lines: list[str] = []
    invocation = status.get("invocation")
    if isinstance(invocation, dict) and invocation:
        argv = [str(a) for a in invocation.get("argv") or []]
        env = [str(e) for e in invocation.get("env") or []]
        rows = [("Executable", invocation.get("executable")), ("Version", invocation.get("version")),
                ("SHA256", invocation.get("sha256")), ("Argv", " ".join(_quoted(a) for a in argv) if argv else None),
                ("Env", ", ".join(env) if env else None)]
        lines += ["Invocation:", *(f"{INDENT}{(k + ':').ljust(12)}{_text(v)}" for k, v in rows)]
    else:
        lines.append(f"{'Invocation:'.ljust(16)}{columns.NONE}")
    lines.append(f"{'Base Commit:'.ljust(16)}{_text(status.get('baseCommit'))}")
    lines.append(f"{'Manifest Hash:'.ljust(16)}{_text(status.get('compiledManifestHash'))}")
    lines.append(f"{'Sandbox:'.ljust(16)}{_sandbox(status.get('sandbox'))}")
    lines.append(f"{'Session:'.ljust(16)}{_session(status.get('session'))}")
    omitted = [o for o in status.get("omitted") or [] if isinstance(o, dict)]
    if omitted:
        headers = ["Path", "Size", "Why"]
        rows2 = [[_text(o.get("path")), _text(o.get("size")), _text(o.get("message"))] for o in omitted]
        table = printers.render_table(headers, [["-" * len(h) for h in headers], *rows2])
        lines += ["Omitted from changes.patch:", *(INDENT + line for line in table)]
    return lines


def _sync(status: dict[str, Any]) -> list[str]:
    """An ImplementationSource's sync at a glance: when, how far, what it holds, what went wrong."""
    given = status.get("counts")
    counts: dict[str, Any] = given if isinstance(given, dict) else {}
    held = f"{counts.get('issues', 0)} (last sync: " + ", ".join(
        f"{counts.get(k, 0)} {k}" for k in ("created", "updated", "stale", "diverged")) + ")"
    rows = [("Last Synced", status.get("lastSyncedAt") or "never"), ("Cursor", status.get("cursor")),
            ("Issues", held if counts else None), ("Rate Limited", status.get("rateLimitedUntil")),
            ("Token Expires", status.get("tokenExpiresAt")), ("Last Error", status.get("lastError"))]
    return ["Sync:", *(f"{INDENT}{(k + ':').ljust(15)}{_text(v)}" for k, v in rows)]


def _sandbox(box: Any) -> str:
    if not isinstance(box, dict) or not box.get("mode"):
        return columns.NONE
    if box["mode"] == "none":
        return "none" + (f" ({box['reason']})" if box.get("reason") else "")
    said = [f"user {box['user']}"] if box.get("user") is not None else []
    said += [f"network {box['network']}"] if box.get("network") else []
    return f"{box['mode']}" + (f" ({', '.join(said)})" if said else "")


def _quoted(arg: str) -> str:
    """``arg`` as a shell reads it, on one line: a prompt's line breaks as ``$'…\\n…'`` (bash's
    ANSI-C quoting), so a multi-line argument does not break the page's indentation."""
    if arg.isprintable():
        return shlex.quote(arg)
    escaped = "".join(_ESCAPES.get(c, c if c.isprintable() else f"\\x{ord(c):02x}" if ord(c) < 0x100
                                   else f"\\u{ord(c):04x}") for c in arg)
    return f"$'{escaped}'"


_ESCAPES = {"\\": "\\\\", "'": "\\'", "\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _session(session: Any) -> str:
    if not isinstance(session, dict) or not (session.get("id") or session.get("resumedFromAttempt")):
        return columns.NONE
    name = _text(session.get("id"))
    earlier = session.get("resumedFromAttempt")
    if earlier:
        return f"{name} (resumed from attempt {earlier})"
    # A first attempt has nothing to resume; a later one that did not resume started over.
    attempt = session.get("attempt")
    later = isinstance(attempt, int) and attempt > 1
    return f"{name} (started over)" if later else f"{name} (new session)"


def _events(events: Sequence[dict[str, Any]], now: dt.datetime) -> list[str]:
    if not events:
        return [f"{'Events:'.ljust(HEADER_WIDTH)}{columns.NONE}"]
    headers = ["Type", "Reason", "Age", "From", "Message"]
    dashes = ["-" * len(h) for h in headers]
    rows = [_event_row(e.get("spec") or {}, e.get("metadata") or {}, now) for e in events]
    table = printers.render_table(headers, [dashes, *rows])
    return ["Events:", *(INDENT + line for line in table)]


def _event_row(spec: dict[str, Any], meta: dict[str, Any], now: dt.datetime) -> list[str]:
    last = spec.get("lastTimestamp") or spec.get("firstTimestamp") or meta.get("creationTimestamp")
    age = columns.age(last, now)
    count = spec.get("count") or 1
    if count > 1:
        age += f" (x{count} over {columns.age(spec.get('firstTimestamp'), now)})"
    source = _text((spec.get("source") or {}).get("component"))
    return [_text(spec.get("type")), _text(spec.get("reason")), age, source, _text(spec.get("message"))]


def event_timestamp(event: dict[str, Any]) -> str:
    spec = event.get("spec") or {}
    meta = event.get("metadata") or {}
    return str(spec.get("lastTimestamp") or spec.get("firstTimestamp") or meta.get("creationTimestamp") or "")


def event_order(event: dict[str, Any]) -> tuple[str, int]:
    """Oldest first: by time, then (timestamps have whole seconds) by the revision that wrote it."""
    version = str((event.get("metadata") or {}).get("resourceVersion") or "")
    return event_timestamp(event), int(version) if version.isdigit() else 0


def involves(event: dict[str, Any], obj: dict[str, Any]) -> bool:
    target = (event.get("spec") or {}).get("involvedObject") or {}
    meta = obj.get("metadata") or {}
    if target.get("uid") and meta.get("uid"):
        return bool(target["uid"] == meta["uid"])
    return bool(target.get("name") == meta.get("name") and target.get("kind") == obj.get("kind"))


def _empty(value: Any) -> bool:
    return value is None or value == "" or value == [] or value == {}


def _is_scalar(value: Any) -> bool:
    return not isinstance(value, dict | list)


def _one_line(value: Any) -> bool:
    return _is_scalar(value) and not (isinstance(value, str) and "\n" in value)


def _text(value: Any) -> str:
    if value is None or value == "":
        return columns.NONE
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
