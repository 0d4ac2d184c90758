"""The Agent controller against the real store (SQLite and Postgres): ``reconcile`` driven directly
through a store-backed Context, and once under the real Manager."""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from joch.admission.apply import apply_documents
from joch.admission.documents import load_documents
from joch.api import errors
from joch.api.kinds import AGENT, AGENT_PROVIDER, EVENT, POLICY, SECRET
from joch.api.namespaces import NAMESPACE, namespace_object
from joch.api.registry import KindInfo
from joch.compiler.manifest import compile_agent, store_reader
from joch.controllers.agents import AgentController
from joch.controllers.base import Key
from joch.controllers.events import INVOLVED_UID
from joch.controllers.manager import Manager
from joch.controllers.options import ControllerOptions
from joch.store import Store
from joch.store.base import ListOptions, Obj


class StoreCache:
    """A Cache that reads through to the store: always current, which is what a synced informer is
    between events. ``stale`` pins old copies; ``lagging`` names objects the cache has not seen yet."""

    def __init__(self, store: Store, kind: KindInfo, stale: dict[tuple[str, str], Obj],
                 lagging: set[tuple[str, str, str]]) -> None:
        self.store, self.kind, self.stale, self.lagging = store, kind, stale, lagging

    def get(self, namespace: str, name: str) -> Obj | None:
        if (namespace, name) in self.stale:
            return self.stale[(namespace, name)]
        if (self.kind.kind, namespace, name) in self.lagging:
            return None
        try:
            return self.store.get(self.kind, namespace or None, name)
        except errors.NotFound:
            return None

    def list(self, namespace: str | None = None) -> list[Obj]:
        return self.store.list(self.kind, ListOptions(namespace=namespace)).items


class Clock:
    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class StoreContext:
    """The Context protocol over a store; ``stale`` pins objects the cache has not caught up with."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self.clock = Clock()
        self.enqueued: list[tuple[str, Key, float]] = []
        self.stale: dict[tuple[str, str], Obj] = {}
        self.lagging: set[tuple[str, str, str]] = set()

    def cache(self, kind: KindInfo) -> StoreCache:
        return StoreCache(self.store, kind, self.stale if kind is AGENT else {}, self.lagging)

    def enqueue(self, controller: str, key: Key, *, after: float = 0.0) -> None:
        self.enqueued.append((controller, key, after))


@pytest.fixture
def ctx(store: Store) -> StoreContext:
    return StoreContext(store)


@pytest.fixture
def controller(ctx: StoreContext) -> AgentController:
    c = AgentController()
    c.setup(ctx)
    return c


CODER = Key("default", "coder")


def apply(store: Store, *objs: dict[str, Any]) -> None:
    apply_documents(store, load_documents("\n---\n".join(json.dumps(o) for o in objs)))


def provider(name: str = "codex", **spec: Any) -> dict[str, Any]:
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "AgentProvider", "metadata": {"name": name},
            "spec": {"binary": "codex", "argsTemplate": ["exec", "{{ implementation.text }}"], **spec}}


def agent(name: str = "coder", provider_name: str = "codex", namespace: str | None = None,
          **spec: Any) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": "joch.dev/v1alpha1", "kind": "Agent", "metadata": meta,
            "spec": {"providerRef": {"name": provider_name}, **spec}}


def secret(name: str = "openai", **data: str) -> dict[str, Any]:
    return {"apiVersion": "ops.joch.dev/v1alpha1", "kind": "Secret", "metadata": {"name": name},
            "spec": {"stringData": data or {"api-key": "sk-test"}}}


def uses(secret_name: str = "openai", key: str = "api-key") -> dict[str, Any]:
    return {"secretEnv": [{"name": "OPENAI_API_KEY", "secretRef": {"name": secret_name, "key": key}}]}


def conditions(store: Store, name: str = "coder") -> dict[str, dict[str, Any]]:
    status = store.get(AGENT, "default", name).get("status") or {}
    return {c["type"]: c for c in status.get("conditions") or []}


def summary(store: Store, name: str = "coder") -> dict[str, tuple[str, str]]:
    return {t: (c["status"], c["reason"]) for t, c in conditions(store, name).items()}


def events(store: Store, name: str = "coder") -> list[tuple[str, str, str]]:
    uid = store.get(AGENT, "default", name)["metadata"]["uid"]
    found = store.list(EVENT, ListOptions(namespace="default", label_selector=f"{INVOLVED_UID}={uid}")).items
    found.sort(key=lambda e: int(e["metadata"]["resourceVersion"]))
    return [(e["spec"]["type"], e["spec"]["reason"], e["spec"]["message"]) for e in found]


# --- reconcile -----------------------------------------------------------------------------------

def test_an_agent_with_its_provider_becomes_ready(store: Store, controller: AgentController) -> None:
    apply(store, provider(), agent())
    assert controller.reconcile(CODER) is None

    obj = store.get(AGENT, "default", "coder")
    expected = compile_agent(store_reader(store), obj).hash
    assert expected and obj["status"]["compiledManifestHash"] == expected
    assert obj["status"]["observedGeneration"] == 1
    cond = conditions(store)
    assert list(cond) == ["ReferencesResolved", "Ready"]
    assert {k: v for k, v in cond["ReferencesResolved"].items() if k != "lastTransitionTime"} == {
        "type": "ReferencesResolved", "status": "True", "reason": "Resolved", "message": "all references resolve",
        "observedGeneration": 1}
    assert (cond["Ready"]["status"], cond["Ready"]["reason"], cond["Ready"]["message"]) == (
        "True", "Compiled", f"compiled manifest {expected}")
    assert cond["Ready"]["lastTransitionTime"]
    assert events(store) == [("Normal", "Compiled", f"compiled the agent manifest {expected}")]


def test_reconciling_an_unchanged_agent_writes_nothing(store: Store, controller: AgentController) -> None:
    apply(store, provider(), agent())
    controller.reconcile(CODER)
    before = store.get(AGENT, "default", "coder")
    revision = store.current_revision()
    for _ in range(3):
        controller.reconcile(CODER)
    assert store.get(AGENT, "default", "coder") == before
    assert store.current_revision() == revision
    assert len(events(store)) == 1


def test_a_missing_provider_and_its_arrival_and_departure(store: Store, controller: AgentController) -> None:
    apply(store, agent())
    controller.reconcile(CODER)
    cond = conditions(store)
    message = ('AgentProvider "codex" not found in namespace "default": create it (joch apply -f provider.yaml) or '
               "fix spec.providerRef.name")
    assert (cond["ReferencesResolved"]["status"], cond["ReferencesResolved"]["reason"],
            cond["ReferencesResolved"]["message"]) == ("False", "ProviderNotFound", message)
    assert (cond["Ready"]["status"], cond["Ready"]["reason"], cond["Ready"]["message"]) == (
        "False", "ProviderNotFound", message)
    assert "compiledManifestHash" not in store.get(AGENT, "default", "coder")["status"]
    assert events(store) == [("Warning", "ProviderNotFound", message)]

    apply(store, provider())
    controller.reconcile(CODER)
    assert summary(store) == {"ReferencesResolved": ("True", "Resolved"), "Ready": ("True", "Compiled")}
    assert store.get(AGENT, "default", "coder")["status"]["compiledManifestHash"].startswith("sha256:")

    store.delete(AGENT_PROVIDER, "default", "codex")
    controller.reconcile(CODER)
    assert summary(store) == {"ReferencesResolved": ("False", "ProviderNotFound"),
                              "Ready": ("False", "ProviderNotFound")}
    assert "compiledManifestHash" not in store.get(AGENT, "default", "coder")["status"]
    assert [e[1] for e in events(store)] == ["ProviderNotFound", "Compiled", "ProviderNotFound"]


def test_last_transition_time_moves_only_when_the_status_flips(store: Store, controller: AgentController) -> None:
    apply(store, provider(), agent())
    controller.reconcile(CODER)
    obj = store.get(AGENT, "default", "coder")
    old = copy.deepcopy(obj["status"])
    for c in old["conditions"]:
        c["lastTransitionTime"] = "2020-01-01T00:00:00Z"
    store.update_status(AGENT, {**obj, "status": old})

    apply(store, agent(systemPrompt="be brief"))  # a new generation: new hash, still Ready
    controller.reconcile(CODER)
    after = store.get(AGENT, "default", "coder")["status"]
    assert after["observedGeneration"] == 2
    assert after["compiledManifestHash"] != obj["status"]["compiledManifestHash"]
    assert [c["lastTransitionTime"] for c in after["conditions"]] == ["2020-01-01T00:00:00Z"] * 2
    assert [c["observedGeneration"] for c in after["conditions"]] == [2, 2]
    assert [e[1] for e in events(store)] == ["Compiled", "Compiled"]

    store.delete(AGENT_PROVIDER, "default", "codex")
    controller.reconcile(CODER)
    assert all(c["lastTransitionTime"] != "2020-01-01T00:00:00Z" for c in conditions(store).values())


def test_secret_problems(store: Store, controller: AgentController) -> None:
    apply(store, provider(**uses()), agent())
    controller.reconcile(CODER)
    cond = conditions(store)
    assert summary(store) == {"ReferencesResolved": ("False", "SecretNotFound"), "Ready": ("False", "SecretNotAllowed")}
    assert cond["Ready"]["message"] == (
        'AgentProvider "codex" spec.secretEnv[0] (OPENAI_API_KEY) uses Secret "openai", which Agent "coder" does not '
        "allow: add \"openai\" to the Agent's spec.security.allowedSecrets; "
        'Secret "openai" not found in namespace "default" (AgentProvider "codex" spec.secretEnv[0] (OPENAI_API_KEY)): '
        "create it (joch apply -f secret.yaml) or fix spec.secretEnv[0].secretRef.name")
    assert cond["ReferencesResolved"]["message"] == cond["Ready"]["message"].split("; ", 1)[1]

    apply(store, agent(security={"allowedSecrets": ["openai"]}))
    controller.reconcile(CODER)
    assert summary(store) == {"ReferencesResolved": ("False", "SecretNotFound"), "Ready": ("False", "SecretNotFound")}

    apply(store, secret(token="x"))
    controller.reconcile(CODER)
    assert summary(store) == {"ReferencesResolved": ("False", "SecretKeyNotFound"),
                              "Ready": ("False", "SecretKeyNotFound")}

    apply(store, secret())
    controller.reconcile(CODER)
    assert summary(store) == {"ReferencesResolved": ("True", "Resolved"), "Ready": ("True", "Compiled")}
    status_text = json.dumps(store.get(AGENT, "default", "coder")["status"])
    assert "sk-test" not in status_text


def test_a_broken_template_is_not_ready_before_any_run(store: Store, controller: AgentController) -> None:
    apply(store, provider(argsTemplate=["exec", "{{ implementation.titel }}"]), agent())
    controller.reconcile(CODER)
    cond = conditions(store)
    assert summary(store) == {"ReferencesResolved": ("True", "Resolved"), "Ready": ("False", "TemplateError")}
    assert cond["Ready"]["message"] == (
        'AgentProvider/codex spec.argsTemplate[1]: undefined variable "implementation.titel"; implementation has '
        "acceptanceCriteria, description, labels, source, summary, text")


def test_a_missing_policy(store: Store, controller: AgentController) -> None:
    apply(store, provider(), agent(policies=[{"name": "no-prod"}]))
    controller.reconcile(CODER)
    assert summary(store) == {"ReferencesResolved": ("False", "PolicyNotFound"), "Ready": ("False", "PolicyNotFound")}


def test_a_stale_cache_is_a_conflict_for_the_manager_to_retry(store: Store, ctx: StoreContext,
                                                              controller: AgentController) -> None:
    apply(store, provider(), agent())
    ctx.stale[("default", "coder")] = store.get(AGENT, "default", "coder")
    apply(store, agent(description="changed since the cache saw it"))
    with pytest.raises(errors.Conflict):
        controller.reconcile(CODER)
    ctx.stale.clear()
    controller.reconcile(CODER)
    assert summary(store)["Ready"] == ("True", "Compiled")


def test_a_provider_the_cache_has_not_seen_yet_is_not_reported_missing(store: Store, ctx: StoreContext,
                                                                      controller: AgentController) -> None:
    # an Agent and its provider applied in one batch: the Agent's informer may deliver first
    apply(store, provider(**uses()), agent(security={"allowedSecrets": ["openai"]}), secret())
    ctx.lagging |= {("AgentProvider", "default", "codex"), ("Secret", "default", "openai")}
    controller.reconcile(CODER)
    assert summary(store) == {"ReferencesResolved": ("True", "Resolved"), "Ready": ("True", "Compiled")}
    assert [e[:2] for e in events(store)] == [("Normal", "Compiled")]


def test_a_deleted_or_deleting_agent_is_left_alone(store: Store, controller: AgentController) -> None:
    assert controller.reconcile(Key("default", "ghost")) is None
    apply(store, provider(), agent())
    obj = store.get(AGENT, "default", "coder")
    obj["metadata"]["finalizers"] = ["example.com/hold"]
    store.update(AGENT, obj)
    store.delete(AGENT, "default", "coder")
    revision = store.current_revision()
    assert controller.reconcile(CODER) is None
    assert store.current_revision() == revision


# --- mapping secondary objects to agents ---------------------------------------------------------

def mapper(controller: AgentController, kind: KindInfo) -> Callable[[Obj], Any]:
    return dict(controller.secondary())[kind]


def test_a_provider_maps_to_the_agents_in_its_namespace_that_name_it(store: Store,
                                                                     controller: AgentController) -> None:
    store.create(NAMESPACE, namespace_object("team-b"))
    apply(store, agent("a"), agent("b"), agent("other", provider_name="aider"), agent("a", namespace="team-b"))
    codex = {"kind": "AgentProvider", "metadata": {"name": "codex", "namespace": "default"}}
    assert sorted(mapper(controller, AGENT_PROVIDER)(codex)) == [Key("default", "a"), Key("default", "b")]


def test_a_secret_maps_to_the_agents_whose_provider_uses_it(store: Store, controller: AgentController) -> None:
    apply(store, provider("codex", **uses("openai")), provider("aider", **uses("anthropic")), provider("plain"),
          agent("a", "codex"), agent("b", "aider"), agent("c", "plain"), agent("d", "codex"))
    openai = {"kind": "Secret", "metadata": {"name": "openai", "namespace": "default"}}
    unused = {"kind": "Secret", "metadata": {"name": "unused", "namespace": "default"}}
    assert sorted(mapper(controller, SECRET)(openai)) == [Key("default", "a"), Key("default", "d")]
    assert list(mapper(controller, SECRET)(unused)) == []


def test_a_policy_maps_to_the_agents_that_list_it(store: Store, controller: AgentController) -> None:
    apply(store, agent("a", policies=[{"name": "p"}]), agent("b"))
    p = {"kind": "Policy", "metadata": {"name": "p", "namespace": "default"}}
    assert list(mapper(controller, POLICY)(p)) == [Key("default", "a")]


def test_the_controller_declares_itself() -> None:
    c = AgentController()
    assert (c.name, c.kind) == ("agents", AGENT)
    assert [k for k, _ in c.secondary()] == [AGENT_PROVIDER, SECRET, POLICY]
    with pytest.raises(RuntimeError, match="setup"):
        c.reconcile(CODER)


# --- under the Manager ---------------------------------------------------------------------------

def wait_for(store: Store, expected: dict[str, tuple[str, str]], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            seen = summary(store)
        except errors.NotFound:
            seen = {}
        if seen == expected:
            return
        assert time.monotonic() < deadline, f"expected {expected}, still {seen}"
        time.sleep(0.05)


def test_under_the_manager(store: Store, tmp_path: Path) -> None:
    options = ControllerOptions(data_dir=tmp_path, leader_election=False, resync_period=60.0)
    manager = Manager(store, [AgentController()], options)
    manager.start()
    try:
        assert manager.wait_started(10)
        apply(store, provider(), agent())
        wait_for(store, {"ReferencesResolved": ("True", "Resolved"), "Ready": ("True", "Compiled")})
        store.delete(AGENT_PROVIDER, "default", "codex")
        wait_for(store, {"ReferencesResolved": ("False", "ProviderNotFound"), "Ready": ("False", "ProviderNotFound")})
        apply(store, provider())
        wait_for(store, {"ReferencesResolved": ("True", "Resolved"), "Ready": ("True", "Compiled")})
        apply(store, provider(**uses()), agent(security={"allowedSecrets": ["openai"]}))
        wait_for(store, {"ReferencesResolved": ("False", "SecretNotFound"), "Ready": ("False", "SecretNotFound")})
        apply(store, secret())
        wait_for(store, {"ReferencesResolved": ("True", "Resolved"), "Ready": ("True", "Compiled")})
    finally:
        manager.stop()
