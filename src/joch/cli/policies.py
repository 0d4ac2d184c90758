"""``joch policy test``: a Policy's rules against objects, offline (no server).

The files hold Policies, the objects to test, and whatever those objects refer to (an Agent's
AgentProvider, a run's Agent and ImplementationSpec, the Environments). Policies and Environments
are admitted the way the server would (a dry-run apply into a throwaway SQLite store), so a rule
that does not compile is reported exactly as ``joch apply`` would report it. Then every other
object is evaluated as the server would: the Policies of its namespace and ``joch-system``,
narrowed by their selectors; admission rules for every object, dispatch rules for AgentRuns too,
writeBack rules for WriteIntents (with the run the intent names, when the files hold it).
``--user``/``--group`` are the ``request`` the admission rules see; a run's dispatch rules see its
creator (``joch.dev/created-by``), which is ``--user`` unless the run's manifest records one.

Output: per object, one line per rule that applies to it — ``ALLOW``, ``DENY``, ``WARN`` or
``REQUIRE-APPROVAL`` with the policy, the rule, its phase and (unless allowed) its message.
Exit code: 0 when nothing is denied (warnings and approvals included), 10 (``DENIED_EXIT_CODE``)
when some rule denies some object, 2 when a document is invalid.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from joch.admission import apply_documents
from joch.admission.documents import Document
from joch.admission.validation import resolve_kind
from joch.api import errors, kinds
from joch.api.identity import RequestContext, UserInfo, acting_as
from joch.api.namespaces import NAMESPACE, namespace_object
from joch.api.registry import KindInfo
from joch.policy import decisions, rules
from joch.store import Store, open_store
from joch.store.base import Obj

DENIED_EXIT_CODE = 10
_WORDS = {"deny": "DENY", "warn": "WARN", "requireApproval": "REQUIRE-APPROVAL"}
_DEFINITIONS = ("Policy", "Environment")


class _Objects:
    """The documents as a ``decisions.Source``: what the evaluation reads instead of a store."""

    def __init__(self, objects: Iterable[Obj]) -> None:
        self._by: dict[tuple[str, str | None, str], Obj] = {}
        for obj in objects:
            m = obj.get("metadata") or {}
            self._by[(str(obj.get("kind")), m.get("namespace"), str(m.get("name")))] = obj

    def get(self, kind: KindInfo, namespace: str | None, name: str) -> Obj | None:
        return self._by.get((kind.kind, namespace if kind.namespaced else None, name))

    def list(self, kind: KindInfo, namespace: str | None) -> list[Obj]:
        return [o for (k, ns, _), o in self._by.items() if k == kind.kind and (namespace is None or ns == namespace)]


def test(docs: list[Document], *, namespace: str, explicit: bool, user: str | None, groups: list[str],
         echo: Callable[[str], None]) -> int:
    """Evaluate; print the results with ``echo``; return the exit code. ``namespace`` is given to
    documents naming none; ``explicit`` (``-n``): a document naming another one is an error."""
    objects = [_placed(doc, namespace) for doc in docs]
    definitions = [dataclasses.replace(d, obj=_placed(d, namespace, uid=False))
                   for d, o in zip(docs, objects, strict=True) if o.get("kind") in _DEFINITIONS]
    stored = _admitted(definitions, namespace if explicit else None)
    others = [_created_by(o, user) for o in objects if o.get("kind") not in _DEFINITIONS]
    source = _Objects([*others, *stored])
    if not any(o.get("kind") == "Policy" for o in stored):
        raise errors.BadRequest("no Policy in the files: give the Policy with -f as well as the objects to test")
    denied = False
    ctx = RequestContext(user=UserInfo(user or "", tuple(groups)), verb="create")
    with acting_as(ctx):
        for obj in others:
            m = obj.get("metadata") or {}
            where = f"{m.get('namespace')}/{m.get('name')}" if m.get("namespace") else str(m.get("name"))
            echo(f"{obj.get('kind')} {where}")
            lines, deny = _evaluate(source, obj)
            denied = denied or deny
            for line in lines or ["  (no rule applies)"]:
                echo(line)
    return DENIED_EXIT_CODE if denied else 0


def _evaluate(source: _Objects, obj: Obj) -> tuple[list[str], bool]:
    namespace = (obj.get("metadata") or {}).get("namespace")
    environments = rules.environments_of(namespace, source.list(kinds.ENVIRONMENT, None))
    selected = rules.applicable(decisions.candidates(source, namespace), obj, environments)
    fired = {(o.policy.ref, o.rule.name, o.rule.phase): o for o in decisions.admission(source, obj, None)}
    phases = ["admission"]
    if obj.get("kind") == "AgentRun":
        phases.append("dispatch")
        fired.update({(o.policy.ref, o.rule.name, o.rule.phase): o for o in decisions.dispatch(source, obj)})
    if obj.get("kind") == "WriteIntent":
        # A write's rules see its run (from the files; a bare one named by spec.runRef otherwise), and
        # a Policy selecting the run applies to the write too.
        run_name = str((((obj.get("spec") or {}).get("runRef") or {}).get("name")) or "")
        run = source.get(kinds.AGENT_RUN, namespace, run_name) or {
            "apiVersion": kinds.AGENT_RUN.api_version, "kind": "AgentRun",
            "metadata": {"name": run_name, "namespace": namespace}, "spec": {}}
        phases.append("writeBack")
        known = {p.ref for p in selected}
        selected += [p for p in rules.applicable(decisions.candidates(source, namespace), run, environments)
                     if p.ref not in known]
        fired.update({(o.policy.ref, o.rule.name, o.rule.phase): o for o in decisions.write_back(source, obj, run)})
    lines, denied = [], False
    for policy in selected:
        for rule in policy.rules:
            if rule.phase not in phases:
                continue
            outcome = fired.get((policy.ref, rule.name, rule.phase))
            word = "ALLOW" if outcome is None else _WORDS[outcome.action]
            denied = denied or word == "DENY"
            said = "" if outcome is None else f": {outcome.message}"
            lines.append(f"  {word:<16} {policy.ref} {rule.name} ({rule.phase}){said}")
    return lines, denied


def _placed(doc: Document, namespace: str, *, uid: bool = True) -> Obj:
    """The document with the namespace the server would give it, and a uid (rules may read it)."""
    obj: dict[str, Any] = dict(doc.obj)
    try:
        kind = resolve_kind(obj)
    except errors.Invalid as exc:
        raise errors.Invalid(f"{doc.label()}: {exc.message}", causes=exc.causes) from None
    metadata = dict(obj.get("metadata") or {})
    if kind.namespaced and not metadata.get("namespace"):
        metadata["namespace"] = namespace
    if uid:
        metadata.setdefault("uid", f"policy-test-{doc.source}-{doc.index}-{doc.item}")
    obj["metadata"] = metadata
    return obj


def _created_by(obj: Obj, user: str | None) -> Obj:
    """A run's dispatch rules see its creator as ``request.user``; offline, that is ``--user``
    unless the run records one."""
    if obj.get("kind") != "AgentRun" or not user:
        return obj
    metadata = dict(obj["metadata"])
    annotations = dict(metadata.get("annotations") or {})
    annotations.setdefault(decisions.CREATED_BY, user)
    return {**obj, "metadata": {**metadata, "annotations": annotations}}


def _with_namespaces(store: Store, docs: list[Document], namespace: str | None) -> None:
    """The scratch store holds every namespace the documents name: offline, none is missing."""
    named = {namespace} | {(d.obj.get("metadata") or {}).get("namespace") for d in docs if isinstance(d.obj, dict)
                           and isinstance(d.obj.get("metadata"), dict)}
    with store.transaction() as writer:
        existing = {o["metadata"]["name"] for o in writer.list(NAMESPACE).items}
        for name in sorted(n for n in named if isinstance(n, str) and n and n not in existing):
            writer.create(NAMESPACE, namespace_object(name))


def _admitted(docs: list[Document], namespace: str | None) -> list[Obj]:
    """The Policies and Environments as the server would store them (or its error)."""
    if not docs:
        return []
    with tempfile.TemporaryDirectory(prefix="joch-policy-test-") as tmp:
        store = open_store(f"sqlite:///{Path(tmp) / 'joch.db'}", history=None)
        try:
            _with_namespaces(store, docs, namespace)
            result = apply_documents(store, docs, dry_run=True, namespace=namespace)
        except errors.Invalid as exc:  # the test applies nothing: say so, not apply's "nothing was applied"
            message = exc.message.replace("; nothing was applied", "; nothing was tested")
            raise errors.Invalid(message, kind=exc.kind, name=exc.name, causes=exc.causes, extra=exc.extra) from None
        finally:
            store.close()
    # A dry run's objects have no uid or resourceVersion: give them one so compiled rules are cached.
    out = []
    for i, item in enumerate(result.items):
        m = {**item.object["metadata"], "uid": f"policy-test-{i}", "resourceVersion": str(i + 1)}
        out.append({**item.object, "metadata": m})
    return out
