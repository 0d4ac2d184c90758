"""Policy preflight: admission of Policy objects, and the admission rules on every write.

* **A Policy is compiled when it is applied.** Every rule's expression is compiled by
  ``joch.policy``; one that does not compile rejects the Policy with a cause at
  ``spec.rules[i].expression`` naming the rule, the line and the column (``rule_causes``).
* **Rules see what would be stored.** ``enforce`` runs after the batch's objects are written, inside
  the same transaction, with the Policies and Environments read through that transaction: a
  Policy applied in the same batch as the objects it selects applies to them (a file holding a
  Policy and an object it denies is refused as a whole). ``object`` is the object as stored
  (uid, creationTimestamp and all); an object an apply leaves ``unchanged`` is not written and not
  evaluated.
* **Deny** is ``errors.Invalid`` (HTTP 422, reason ``Invalid``), the status kube-apiserver gives a
  ValidatingAdmissionPolicy denial by default; the cause has reason ``FieldValueForbidden`` and the
  message ``Policy ns/name rule "r" denied the request: message``. Its field is the most specific
  field of ``object`` the rule reads that the object holds (``spec.binary`` for
  ``object.spec.binary in [...]``), so an editor can show the denial at that line; a rule that
  reads no such field denies at the object (field ``""``). In a batch it is one more invalid
  document, so nothing of the batch is written.
  (403 Forbidden is for RBAC: who may write, not what may be written.)
* **Warn** is an admission warning (the server sends it as a ``Warning: 299`` header, kubectl
  prints it) and a ``Warning`` Event on the object with reason ``PolicyWarning``, written in the
  transaction: a write that rolls back leaves no Event.
* **Audit.** A warning is audited in the transaction (decision ``allowed``); a denial is audited
  after the transaction rolled back (decision ``denied``), through ``collecting``, which the
  write paths wrap around their transaction.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from joch.admission.diagnostics import format_path
from joch.api import errors, kinds
from joch.api.audit import AuditEntry
from joch.api.errors import Cause
from joch.api.events import event
from joch.api.identity import current_request
from joch.api.registry import KindInfo
from joch.policy import decisions, rules
from joch.store.base import Obj, Store, Writer
from joch.telemetry import tracing

COMPONENT = "joch-admission"
_DENIALS: contextvars.ContextVar[list[AuditEntry] | None] = contextvars.ContextVar("joch_policy_denials",
                                                                                    default=None)


def rule_causes(kind: KindInfo, spec: Mapping[str, Any]) -> list[Cause]:
    """A Policy's rules that do not compile, each at ``spec.rules[i].expression``."""
    if kind is not kinds.POLICY:
        return []
    given = spec.get("rules") or []
    causes = []
    for i, error in rules.compile_rules(given):
        name = given[i].get("name") or f"#{i}"
        causes.append(Cause(f"spec.rules[{i}].expression", f'rule "{name}" does not compile: line {error.line}, '
                            f"column {error.column}: {error.message}", "FieldValueInvalid"))
    return causes


def enforce(writer: Writer, source: decisions.StoreSource, kind: KindInfo, stored: Obj, old: Obj | None,
            *, name: str) -> list[str]:
    """Run the admission rules on ``stored`` (just written in ``writer``'s transaction): raise
    ``errors.Invalid`` on a denial, else return the warnings (with their Events written)."""
    with tracing.object_span("joch.admission.policies", stored):
        outcomes = decisions.admission(source, stored, old)
    if not outcomes:
        return []
    verb = "create" if old is None else "update"
    denied = [o for o in outcomes if o.action == "deny"]
    if denied:
        found = _DENIALS.get()
        for outcome in denied:
            entry = _entry(verb, kind, stored, "denied", outcome)
            if found is not None:
                found.append(entry)
        causes = [Cause(_field_read(o.rule, stored),
                        f'Policy {o.policy.ref} rule "{o.rule.name}" denied the request: {o.message}',
                        "FieldValueForbidden") for o in denied]
        shown = "; ".join(c.message for c in causes)
        raise errors.Invalid(f'{kind.kind}.{kind.group} "{name}" is invalid: {shown}', kind=kind.kind, name=name,
                             causes=causes)
    warnings = []
    for outcome in outcomes:
        text = f'Policy {outcome.policy.ref} rule "{outcome.rule.name}": {outcome.message}'
        warnings.append(text)
        writer.create(kinds.EVENT, event(stored, reason="PolicyWarning", message=text, type="Warning",
                                         component=COMPONENT))
        writer.audit(_entry(verb, kind, stored, "allowed", outcome))
    return warnings


def _field_read(rule: rules.Rule, obj: Obj) -> str:
    """The longest path of ``object`` that ``rule`` reads and ``obj`` holds (the first in order
    among equals), as a cause names a field; ``""`` when there is none."""
    read = rule.expression.paths.get("object") if rule.expression is not None else None
    held = sorted(path for path in read or () if _holds(obj, path))
    if not held:
        return ""
    longest: tuple[str, ...] = max(held, key=len)
    return format_path(longest)


def _holds(obj: Any, path: tuple[str, ...]) -> bool:
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            return False
        obj = obj[key]
    return True


@contextmanager
def collecting(store: Store) -> Iterator[None]:
    """Audit the denials ``enforce`` records in the block once it failed: after the rollback, each
    in a transaction of its own, so the record of a refused write survives the refusal."""
    token = _DENIALS.set([])
    try:
        yield
    except BaseException:
        for entry in _DENIALS.get() or []:
            store.audit(entry)
        raise
    finally:
        _DENIALS.reset(token)


def _entry(verb: str, kind: KindInfo, obj: Obj, decision: Any, outcome: rules.Outcome) -> AuditEntry:
    m = obj.get("metadata") or {}
    ctx = current_request()
    return AuditEntry(verb=(ctx.verb if ctx and ctx.verb else verb), kind=kind.kind, namespace=m.get("namespace"),
                      name=m.get("name"), decision=decision, reason=outcome.reason)
