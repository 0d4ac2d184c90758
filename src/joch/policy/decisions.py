"""What the policies say about one write (admission) or one run about to be queued (dispatch).

Both read through a ``Source``: ``StoreSource`` over a store or an open transaction's writer
(admission: so Policies written earlier in the same batch count), ``CacheSource`` over anything
with ``get``/``list`` callables (the run controller's informer caches). A ``StoreSource`` lists
each namespace's Policies and the Environments once and keeps them for its own life, which is one
batch: a 100-document apply lists them once, not 100 times.

Variables (every expression sees all of them; those that do not apply are ``null``):

* ``object``, ``oldObject`` (``null`` on create); at dispatch ``object`` is the run.
* ``request``: ``{user, groups, verb}``. At admission the user is the authenticated caller
  (``joch.api.identity.current_request``; empty when a write is made in-process) and ``verb`` is
  what happens to this object, ``create`` or ``update`` (an apply that changes an object is an
  update). At dispatch the user is the run's creator when it was recorded
  (``metadata.annotations["joch.dev/created-by"]``, which only the server writes), and ``verb`` is
  ``dispatch``.
* ``namespace``: ``{name, environment}`` (the name of the first Environment, by name, whose
  ``spec.namespaces`` holds the namespace, or ``null``); ``environment``: that Environment object.
* ``run``, ``agent``, ``provider``, ``implementation``: at dispatch the run, its Agent, the Agent's
  AgentProvider and the implementation spec (the ImplementationSpec's ``spec`` or the run's inline
  one). At admission they are filled in where the object names them: an Agent sees its
  ``provider``; an AgentRun sees its ``agent``, ``provider`` and ``implementation`` — so a rule on
  Agents can read the binary of the provider it uses (``provider.spec.binary``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from joch.api import errors, kinds
from joch.api.identity import current_request
from joch.api.registry import KindInfo
from joch.policy import rules
from joch.store.base import ListOptions, Obj, Writer

CREATED_BY = "joch.dev/created-by"


class Source(Protocol):
    def get(self, kind: KindInfo, namespace: str | None, name: str) -> Obj | None: ...

    def list(self, kind: KindInfo, namespace: str | None) -> list[Obj]: ...


class StoreSource:
    """Reads through a store or a transaction's writer, listing each (kind, namespace) once."""

    def __init__(self, reader: Writer) -> None:
        self.reader = reader
        self._lists: dict[tuple[str, str | None], list[Obj]] = {}

    def get(self, kind: KindInfo, namespace: str | None, name: str) -> Obj | None:
        try:
            return self.reader.get(kind, namespace, name)
        except errors.NotFound:
            return None

    def list(self, kind: KindInfo, namespace: str | None) -> list[Obj]:
        key = (kind.key, namespace)
        if key not in self._lists:
            self._lists[key] = self.reader.list(kind, ListOptions(namespace=namespace)).items
        return self._lists[key]

    def forget(self) -> None:
        """Drop what was listed (call after writing a Policy or an Environment in the batch)."""
        self._lists.clear()


class CacheSource:
    def __init__(self, get: Callable[[KindInfo, str | None, str], Obj | None],
                 list_: Callable[[KindInfo, str | None], list[Obj]]) -> None:
        self._get, self._list = get, list_

    def get(self, kind: KindInfo, namespace: str | None, name: str) -> Obj | None:
        return self._get(kind, namespace, name)

    def list(self, kind: KindInfo, namespace: str | None) -> list[Obj]:
        return self._list(kind, namespace)


def candidates(source: Source, namespace: str | None) -> list[Obj]:
    """The Policies that may apply to an object in ``namespace``: its own and ``joch-system``'s."""
    found = list(source.list(kinds.POLICY, rules.SYSTEM_NAMESPACE))
    if namespace and namespace != rules.SYSTEM_NAMESPACE:
        found += source.list(kinds.POLICY, namespace)
    return found


def admission(source: Source, obj: Obj, old: Obj | None) -> list[rules.Outcome]:
    """The admission rules that fire on writing ``obj`` (``old``: the stored object, on update)."""
    namespace = (obj.get("metadata") or {}).get("namespace")
    policies = candidates(source, namespace)
    if not policies:
        return []
    environments = rules.environments_of(namespace, source.list(kinds.ENVIRONMENT, None))
    selected = rules.applicable(policies, obj, environments)
    if not any(r.phase == "admission" for p in selected for r in p.rules):
        return []
    ctx = current_request()
    user = ctx.user if ctx else None
    request = rules.request_variable(user.name if user else "", user.groups if user else (),
                                     "create" if old is None else "update")
    variables = {**_references(source, obj), "object": obj, "oldObject": old, "request": request,
                 "namespace": rules.namespace_variable(namespace, environments),
                 "environment": rules.environment_variable(environments)}
    return rules.evaluate(selected, "admission", variables)


def dispatch(source: Source, run: Obj) -> list[rules.Outcome]:
    """The dispatch rules that fire on queueing ``run``."""
    m = run.get("metadata") or {}
    namespace = m.get("namespace")
    policies = candidates(source, namespace)
    if not policies:
        return []
    environments = rules.environments_of(namespace, source.list(kinds.ENVIRONMENT, None))
    selected = rules.applicable(policies, run, environments)
    if not any(r.phase == "dispatch" for p in selected for r in p.rules):
        return []
    creator = (m.get("annotations") or {}).get(CREATED_BY) or ""
    variables = {**_references(source, run), "object": run, "oldObject": None,
                 "request": rules.request_variable(creator, (), "dispatch"),
                 "namespace": rules.namespace_variable(namespace, environments),
                 "environment": rules.environment_variable(environments)}
    return rules.evaluate(selected, "dispatch", variables)


def _references(source: Source, obj: Obj) -> dict[str, Any]:
    out: dict[str, Any] = {"run": None, "agent": None, "provider": None, "implementation": None}
    namespace = (obj.get("metadata") or {}).get("namespace")
    spec: Mapping[str, Any] = obj.get("spec") or {}
    agent: Obj | None = None
    if obj.get("kind") == "AgentRun":
        out["run"] = obj
        agent_name = (spec.get("agentRef") or {}).get("name")
        agent = source.get(kinds.AGENT, namespace, agent_name) if agent_name else None
        out["agent"] = agent
        out["implementation"] = _implementation(source, namespace, spec)
    elif obj.get("kind") == "Agent":
        agent = obj
    if agent is not None:
        provider = ((agent.get("spec") or {}).get("providerRef") or {}).get("name")
        out["provider"] = source.get(kinds.AGENT_PROVIDER, namespace, provider) if provider else None
    return out


def _implementation(source: Source, namespace: str | None, spec: Mapping[str, Any]) -> Any:
    inline = (spec.get("implementation") or {}).get("inline")
    if inline is not None:
        return inline
    name = (spec.get("implementationRef") or {}).get("name")
    found = source.get(kinds.IMPLEMENTATION_SPEC, namespace, name) if name else None
    return (found or {}).get("spec")
