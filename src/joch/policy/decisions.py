"""What the policies say about one write (admission), one run about to be queued (dispatch), or one
write to a tracker about to be sent (write back: ``write_back``).

Each reads through a ``Source``: ``StoreSource`` over a store or an open transaction's writer (admission:
so Policies written earlier in the same batch count; the run controller: so a Policy applied just
before a run counts, which its informer caches might not show yet), or any other ``get``/``list``
(``joch policy test`` reads its files). A ``StoreSource`` lists each namespace's Policies and the
Environments once, compiles them once, and keeps them for its own life, which is one batch: a
100-document apply reads them once, not 100 times.

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

import builtins
from collections.abc import Mapping
from typing import Any, Protocol

from joch.api import errors, kinds
from joch.api.identity import current_request
from joch.api.registry import KindInfo
from joch.policy import rules
from joch.policy.expressions import Activation
from joch.store.base import ListOptions, Obj, Writer

CREATED_BY = "joch.dev/created-by"


class Source(Protocol):
    def get(self, kind: KindInfo, namespace: str | None, name: str) -> Obj | None: ...

    def list(self, kind: KindInfo, namespace: str | None) -> list[Obj]: ...


class StoreSource:
    """Reads through a store or a transaction's writer, each object and list once: create one per
    batch, after the batch's writes (what it read is not refreshed)."""

    def __init__(self, reader: Writer) -> None:
        self.reader = reader
        self._lists: dict[tuple[str, str | None], list[Obj]] = {}
        self._gets: dict[tuple[str, str | None, str], Obj | None] = {}
        self._compiled: dict[str | None, builtins.list[rules.Policy]] = {}
        self.activation = Activation()

    def get(self, kind: KindInfo, namespace: str | None, name: str) -> Obj | None:
        key = (kind.key, namespace, name)
        if key not in self._gets:
            try:
                self._gets[key] = self.reader.get(kind, namespace, name)
            except errors.NotFound:
                self._gets[key] = None
        return self._gets[key]

    def list(self, kind: KindInfo, namespace: str | None) -> list[Obj]:
        key = (kind.key, namespace)
        if key not in self._lists:
            self._lists[key] = self.reader.list(kind, ListOptions(namespace=namespace)).items
        return self._lists[key]

    def prefetch(self, queries: builtins.list[tuple[KindInfo, str | None]]) -> None:
        """Read the lists of ``queries`` not read yet, in one ``list_many`` (one statement in a
        transaction instead of one per list)."""
        missing = [(kind, ns) for kind, ns in queries if (kind.key, ns) not in self._lists]
        if len(missing) > 1:
            for (kind, ns), items in zip(missing, self.reader.list_many(missing), strict=True):
                self._lists[(kind.key, ns)] = items

    def compiled(self, namespace: str | None) -> builtins.list[rules.Policy]:
        """The candidate Policies for ``namespace``, compiled, once per source (their lists and the
        Environments read together)."""
        if namespace not in self._compiled:
            wanted = [(kinds.POLICY, rules.SYSTEM_NAMESPACE), (kinds.ENVIRONMENT, None)]
            if namespace and namespace != rules.SYSTEM_NAMESPACE:
                wanted.append((kinds.POLICY, namespace))
            self.prefetch(wanted)
            self._compiled[namespace] = rules.compile_all(candidates(self, namespace))
        return self._compiled[namespace]


def candidates(source: Source, namespace: str | None) -> list[Obj]:
    """The Policies that may apply to an object in ``namespace``: its own and ``joch-system``'s."""
    found = list(source.list(kinds.POLICY, rules.SYSTEM_NAMESPACE))
    if namespace and namespace != rules.SYSTEM_NAMESPACE:
        found += source.list(kinds.POLICY, namespace)
    return found


def _reuse(source: Source) -> Activation | None:
    return source.activation if isinstance(source, StoreSource) else None


def _compiled(source: Source, namespace: str | None) -> list[rules.Policy]:
    if isinstance(source, StoreSource):
        return source.compiled(namespace)
    return rules.compile_all(candidates(source, namespace))


def admission(source: Source, obj: Obj, old: Obj | None) -> list[rules.Outcome]:
    """The admission rules that fire on writing ``obj`` (``old``: the stored object, on update)."""
    namespace = (obj.get("metadata") or {}).get("namespace")
    policies = _compiled(source, namespace)
    if not policies:
        return []
    environments = rules.environments_of(namespace, source.list(kinds.ENVIRONMENT, None))
    selected = rules.select(policies, obj, environments)
    if not any(p.phase("admission") for p in selected):
        return []
    wanted = rules.referenced(selected, "admission")
    ctx = current_request()
    user = ctx.user if ctx else None
    request = rules.request_variable(user.name if user else "", user.groups if user else (),
                                     "create" if old is None else "update")
    variables = {**_references(source, obj, wanted), "object": obj, "oldObject": old, "request": request,
                 "namespace": rules.namespace_variable(namespace, environments),
                 "environment": rules.environment_variable(environments)}
    return rules.evaluate(selected, "admission", variables, reuse=_reuse(source))


def dispatch(source: Source, run: Obj) -> list[rules.Outcome]:
    """The dispatch rules that fire on queueing ``run``."""
    m = run.get("metadata") or {}
    namespace = m.get("namespace")
    policies = _compiled(source, namespace)
    if not policies:
        return []
    environments = rules.environments_of(namespace, source.list(kinds.ENVIRONMENT, None))
    selected = rules.select(policies, run, environments)
    if not any(p.phase("dispatch") for p in selected):
        return []
    return _evaluate_for_run(source, "dispatch", selected, run, run, environments)


def write_back(source: Source, intent: Obj, run: Obj) -> list[rules.Outcome]:
    """The writeBack rules that fire before ``intent`` (a WriteIntent) is sent for ``run``. A Policy
    applies when its selector matches the intent or its run (``kinds: [AgentRun]`` and the run's
    labels work as they do at dispatch); ``object`` is the intent, ``run``/``agent``/``provider``/
    ``implementation`` those of the run, and ``request`` the run's creator with verb ``writeBack``."""
    namespace = (intent.get("metadata") or {}).get("namespace")
    policies = _compiled(source, namespace)
    if not policies:
        return []
    environments = rules.environments_of(namespace, source.list(kinds.ENVIRONMENT, None))
    matched = {p.ref for p in rules.select(policies, intent, environments)}
    matched |= {p.ref for p in rules.select(policies, run, environments)}
    selected = [p for p in policies if p.ref in matched]
    if not any(p.phase("writeBack") for p in selected):
        return []
    return _evaluate_for_run(source, "writeBack", selected, intent, run, environments)


def _evaluate_for_run(source: Source, phase: rules.Phase, selected: list[rules.Policy], obj: Obj, run: Obj,
                      environments: list[Mapping[str, Any]]) -> list[rules.Outcome]:
    """Evaluate ``phase``'s rules of ``selected`` on ``obj``, in the context of ``run``: its references,
    and its creator as the request's user with ``phase`` as the verb."""
    namespace = (obj.get("metadata") or {}).get("namespace")
    creator = ((run.get("metadata") or {}).get("annotations") or {}).get(CREATED_BY) or ""
    variables = {**_references(source, run, rules.referenced(selected, phase)), "object": obj,
                 "oldObject": None,
                 "request": rules.request_variable(creator, (), phase),
                 "namespace": rules.namespace_variable(namespace, environments),
                 "environment": rules.environment_variable(environments)}
    return rules.evaluate(selected, phase, variables, reuse=_reuse(source))


def _references(source: Source, obj: Obj, wanted: frozenset[str]) -> dict[str, Any]:
    """``run``, ``agent``, ``provider``, ``implementation``; only those a rule reads are looked up."""
    out: dict[str, Any] = {"run": None, "agent": None, "provider": None, "implementation": None}
    if not wanted & {"run", "agent", "provider", "implementation"}:
        return out
    namespace = (obj.get("metadata") or {}).get("namespace")
    spec: Mapping[str, Any] = obj.get("spec") or {}
    agent: Obj | None = None
    if obj.get("kind") == "AgentRun":
        out["run"] = obj
        agent_name = (spec.get("agentRef") or {}).get("name")
        agent = source.get(kinds.AGENT, namespace, agent_name) if agent_name else None
        out["agent"] = agent
        if "implementation" in wanted:
            out["implementation"] = _implementation(source, namespace, spec)
    elif obj.get("kind") == "Agent":
        agent = obj
    if agent is not None and "provider" in wanted:
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
