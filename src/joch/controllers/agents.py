"""The Agent controller: compile every Agent and say in its status whether it can run.

For each Agent it compiles the ``CompiledAgentManifest`` from the informer caches
(``joch.compiler.manifest``) and writes the outcome to status:

* ``ReferencesResolved`` — True/``Resolved`` when the provider, the Secrets its ``secretEnv`` names
  and the Agent's Policies all exist; otherwise False with the first missing one's reason
  (``ProviderNotFound``, ``SecretNotFound``, ``SecretKeyNotFound``, ``PolicyNotFound``) and every
  missing one in the message. This controller is the condition's only writer: admission warns
  about a missing provider when the Agent is applied, and leaves status alone.
* ``Ready`` — True/``Compiled`` with the manifest hash, or False with the first problem's reason
  (a reference, ``SecretNotAllowed``, ``TemplateError``, ``InvalidPath``…) and every problem's
  message, so one look says everything there is to fix.
* ``compiledManifestHash`` (only while Ready) and ``observedGeneration``.

Design decisions:

* A reference the caches do not have is confirmed with the store before it is reported missing.
  Informers of different kinds lag each other: an Agent and its provider applied in one atomic
  batch may reach the Agent's cache first, and the Agent must not flap to ``ProviderNotFound`` (with
  a Warning event) for a provider that exists. Only misses cost a store read.
* Status is written only when it changed, with the cached object's resourceVersion as precondition:
  a stale cache is a ``Conflict`` the manager retries once the cache caught up. Conditions go
  through ``set_condition``, so ``lastTransitionTime`` moves only when a status flips, and a
  re-reconcile of an unchanged Agent writes nothing (no event storm on resync).
* An Event is recorded, in the same transaction as the status, when the Agent becomes Ready with a
  new manifest (``Compiled``) or stops being Ready / changes why (a Warning with the problem's reason).
* Secondary kinds map back to Agents through the Agent cache: an AgentProvider to the Agents in its
  namespace that name it, a Secret to the Agents whose provider's ``secretEnv`` uses it, a Policy
  to the Agents that list it. A deleted provider reaches its Agents the same way, and they turn
  ``ReferencesResolved=False``.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from typing import Any, Literal

from joch.api import errors
from joch.api.kinds import AGENT, AGENT_PROVIDER, POLICY, SECRET
from joch.api.meta import dig, set_condition
from joch.api.registry import KindInfo
from joch.compiler import manifest as compiler
from joch.controllers import events
from joch.controllers.base import Context, Controller, Key, Mapper, Result
from joch.store.base import Obj

REFERENCES_RESOLVED = "ReferencesResolved"
READY = "Ready"
COMPONENT = "agent-controller"


class AgentController(Controller):
    name = "agents"
    kind = AGENT

    def __init__(self) -> None:
        self._ctx: Context | None = None

    @property
    def ctx(self) -> Context:
        if self._ctx is None:
            raise RuntimeError("AgentController.setup() was not called")
        return self._ctx

    def setup(self, ctx: Context) -> None:
        self._ctx = ctx

    def secondary(self) -> Sequence[tuple[KindInfo, Mapper]]:
        return ((AGENT_PROVIDER, self._agents_of_provider), (SECRET, self._agents_of_secret),
                (POLICY, self._agents_of_policy))

    def reconcile(self, key: Key) -> Result | None:
        agent = self.ctx.cache(AGENT).get(key.namespace, key.name)
        if agent is None or agent["metadata"].get("deletionTimestamp"):
            return None
        compiled = compiler.compile_agent(self._read, agent)
        old = agent.get("status") or {}
        status = desired_status(agent, compiled)
        if status == old:
            return None
        reported = _event(old, status, compiled)
        with self.ctx.store.transaction() as tx:
            written = tx.update_status(AGENT, {**agent, "status": status})
            if reported is not None:
                reason, message, type_ = reported
                events.record(tx, written, reason=reason, message=message, type=type_, component=COMPONENT)
        return None

    def _read(self, kind: KindInfo, namespace: str | None, name: str) -> Obj | None:
        cached = self.ctx.cache(kind).get(namespace or "", name)
        if cached is not None:
            return cached
        try:
            return self.ctx.store.get(kind, namespace, name)
        except errors.NotFound:
            return None

    # --- mappers ---------------------------------------------------------------------------------

    def _agents_of_provider(self, provider: Obj) -> list[Key]:
        return list(self._agents_using(provider["metadata"].get("namespace") or "", {provider["metadata"]["name"]}))

    def _agents_of_secret(self, secret: Obj) -> list[Key]:
        namespace, name = secret["metadata"].get("namespace") or "", secret["metadata"]["name"]
        providers = {p["metadata"]["name"] for p in self.ctx.cache(AGENT_PROVIDER).list(namespace)
                     if any(dig(e, "secretRef.name") == name for e in dig(p, "spec.secretEnv") or [])}
        return list(self._agents_using(namespace, providers)) if providers else []

    def _agents_of_policy(self, policy: Obj) -> list[Key]:
        namespace, name = policy["metadata"].get("namespace") or "", policy["metadata"]["name"]
        return [Key.of(a) for a in self.ctx.cache(AGENT).list(namespace)
                if any(isinstance(p, dict) and p.get("name") == name for p in dig(a, "spec.policies") or [])]

    def _agents_using(self, namespace: str, providers: set[str]) -> Iterator[Key]:
        for agent in self.ctx.cache(AGENT).list(namespace):
            if dig(agent, "spec.providerRef.name") in providers:
                yield Key.of(agent)


def desired_status(agent: Obj, compiled: compiler.Compiled) -> dict[str, Any]:
    """The Agent's status after ``compiled``: the stored status with this controller's fields set."""
    generation = agent["metadata"].get("generation")
    status: dict[str, Any] = copy.deepcopy(agent.get("status") or {})
    missing = [p for p in compiled.problems if p.reason in compiler.REFERENCE_REASONS]
    if missing:
        refs = _condition(REFERENCES_RESOLVED, "False", missing[0].reason, _joined(missing), generation)
    else:
        refs = _condition(REFERENCES_RESOLVED, "True", "Resolved", "all references resolve", generation)
    if compiled.ok and compiled.hash:
        ready = _condition(READY, "True", "Compiled", f"compiled manifest {compiled.hash}", generation)
        status["compiledManifestHash"] = compiled.hash
    else:
        reason = compiled.problems[0].reason if compiled.problems else "CompileFailed"
        ready = _condition(READY, "False", reason, _joined(compiled.problems) or "the agent did not compile",
                           generation)
        status.pop("compiledManifestHash", None)
    conditions = set_condition(list(status.get("conditions") or []), refs)
    status["conditions"] = set_condition(conditions, ready)
    status["observedGeneration"] = generation
    return status


def _condition(type_: str, status: str, reason: str, message: str, generation: Any) -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": reason, "message": message,
            "observedGeneration": generation}


def _joined(problems: Sequence[compiler.Problem]) -> str:
    return "; ".join(p.message for p in problems)


def _ready(status: dict[str, Any]) -> dict[str, Any]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == READY), {})


def _event(
    old: dict[str, Any], new: dict[str, Any], compiled: compiler.Compiled,
) -> tuple[str, str, Literal["Normal", "Warning"]] | None:
    before, after = _ready(old), _ready(new)
    if after.get("status") == "True":
        if before.get("status") != "True" or old.get("compiledManifestHash") != new.get("compiledManifestHash"):
            return "Compiled", f"compiled the agent manifest {compiled.hash}", "Normal"
        return None
    if (before.get("status"), before.get("reason"), before.get("message")) != (
            after.get("status"), after.get("reason"), after.get("message")):
        return str(after.get("reason")), str(after.get("message")), "Warning"
    return None
