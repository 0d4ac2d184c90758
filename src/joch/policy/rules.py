"""Policies compiled, selected and evaluated.

* ``compiled(policy)`` compiles every rule of a stored Policy once per (uid, resourceVersion) and
  keeps the result in a bounded cache, so the hot path (every write, every dispatch) only
  evaluates. A rule that does not compile (a Policy stored before admission checked it) is kept
  with its error and denies whatever it selects, saying why.
* ``applicable(policies, obj, environments)`` narrows Policies to those whose ``selector`` matches
  the object: its kind, its labels, and the Environments its namespace belongs to. Which Policies
  are candidates (the object's namespace and ``joch-system``) is the caller's read.
* ``evaluate(policies, phase, variables)`` runs the rules of one phase and returns an ``Outcome``
  per rule that fired. An expression is true when its action applies (``deny`` when true, warn when
  true, require approval when true). A rule whose expression fails or does not return a bool
  fails closed: a ``deny`` or ``requireApproval`` rule denies, with the error in the message; a
  ``warn`` rule warns with the error (a warning never blocks, whatever happens to it).
"""

from __future__ import annotations

import functools
import threading
import types
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from joch.api.errors import NotFound
from joch.api.registry import REGISTRY
from joch.policy.expressions import (
    PRUNABLE,
    Activation,
    CompileError,
    EvaluationError,
    Expression,
    Trie,
    activation,
    compile_expression,
    prune,
    trie,
)

SYSTEM_NAMESPACE = "joch-system"
Phase = Literal["admission", "dispatch", "writeBack"]
PHASES: tuple[Phase, ...] = ("admission", "dispatch", "writeBack")
Action = Literal["deny", "requireApproval", "warn"]
CACHE_SIZE = 1024


@dataclass(frozen=True)
class Rule:
    name: str
    phase: Phase
    action: Action
    message: str
    source: str
    expression: Expression | None
    error: CompileError | None = None


@dataclass(frozen=True)
class Policy:
    namespace: str
    name: str
    kinds: frozenset[str]
    match_labels: Mapping[str, str]
    environments: frozenset[str]
    separation_of_duties: bool
    rules: tuple[Rule, ...]

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def phase(self, phase: Phase) -> tuple[Rule, ...]:
        return self._rules[phase]

    def reads(self, phase: Phase) -> frozenset[str]:
        return self._reads[phase]

    def paths(self, phase: Phase) -> Mapping[str, frozenset[tuple[str, ...]] | None]:
        """Per ``PRUNABLE`` variable the ``phase`` rules read, the fields they read (None: whole)."""
        return self._paths[phase]

    def __post_init__(self) -> None:
        by_phase: dict[str, tuple[Rule, ...]] = {}
        reads_by: dict[str, frozenset[str]] = {}
        paths_by: dict[str, Mapping[str, frozenset[tuple[str, ...]] | None]] = {}
        for phase in PHASES:
            chosen = tuple(r for r in self.rules if r.phase == phase)
            reads = frozenset(v for r in chosen if r.expression is not None for v in r.expression.variables)
            paths: dict[str, frozenset[tuple[str, ...]] | None] = {}
            for rule in chosen:
                if rule.expression is None:
                    continue
                for name in PRUNABLE:
                    if name not in rule.expression.variables:
                        continue
                    own = rule.expression.paths.get(name)
                    known = paths.get(name, frozenset())
                    paths[name] = None if own is None or known is None else known | own
            by_phase[phase], reads_by[phase], paths_by[phase] = chosen, reads, paths
        object.__setattr__(self, "_rules", by_phase)
        object.__setattr__(self, "_reads", reads_by)
        object.__setattr__(self, "_paths", paths_by)

    _rules: Mapping[str, tuple[Rule, ...]] = field(default_factory=dict, init=False, repr=False, compare=False)
    _reads: Mapping[str, frozenset[str]] = field(default_factory=dict, init=False, repr=False, compare=False)
    _paths: Mapping[str, Mapping[str, frozenset[tuple[str, ...]] | None]] = field(
        default_factory=dict, init=False, repr=False, compare=False)


@dataclass(frozen=True)
class Outcome:
    """A rule that fired: its action (``deny`` also for a rule that failed), and the message."""

    policy: Policy
    rule: Rule
    action: Action
    message: str
    failed: bool = False

    @property
    def reason(self) -> str:
        """``Policy ns/name rule r: message``, as audit rows, Events and errors say it."""
        return f'Policy {self.policy.ref} rule "{self.rule.name}": {self.message}'


# --- compiling -----------------------------------------------------------------------------------

def compile_rules(rules: Sequence[Mapping[str, Any]]) -> list[tuple[int, CompileError]]:
    """The rules of a Policy spec that do not compile: (index, error). Admission calls this."""
    problems: list[tuple[int, CompileError]] = []
    for i, rule in enumerate(rules):
        source = rule.get("expression")
        if isinstance(source, str) and source:
            try:
                compile_expression(source)
            except CompileError as exc:
                problems.append((i, exc))
    return problems


_cache: OrderedDict[tuple[str, str, str], Policy] = OrderedDict()
_lock = threading.Lock()


def compiled(policy: Mapping[str, Any]) -> Policy:
    m = policy.get("metadata") or {}
    key = (str(m.get("uid") or ""), str(m.get("resourceVersion") or ""), str(m.get("name") or ""))
    if key[0] and key[1]:
        with _lock:
            found = _cache.get(key)
            if found is not None:
                _cache.move_to_end(key)
                return found
    built = _build(policy)
    if key[0] and key[1]:
        with _lock:
            _cache[key] = built
            while len(_cache) > CACHE_SIZE:
                _cache.popitem(last=False)
    return built


def _build(policy: Mapping[str, Any]) -> Policy:
    m = policy.get("metadata") or {}
    spec = policy.get("spec") or {}
    selector = spec.get("selector") or {}
    rules = []
    for rule in spec.get("rules") or []:
        source = str(rule.get("expression") or "")
        expression: Expression | None = None
        error: CompileError | None = None
        try:
            expression = compile_expression(source)
        except CompileError as exc:
            error = exc
        rules.append(Rule(name=str(rule.get("name") or ""), phase=rule.get("phase") or "admission",
                          action=rule.get("action") or "deny", message=str(rule.get("message") or ""),
                          source=source, expression=expression, error=error))
    return Policy(namespace=str(m.get("namespace") or ""), name=str(m.get("name") or ""),
                  kinds=frozenset(_kind_name(k) for k in selector.get("kinds") or []),
                  match_labels=dict(selector.get("matchLabels") or {}),
                  environments=frozenset(selector.get("environments") or []),
                  separation_of_duties=bool(spec.get("separationOfDuties")), rules=tuple(rules))


def _kind_name(name: str) -> str:
    try:
        return REGISTRY.resolve(name).kind
    except NotFound:  # an unknown kind selects nothing (admission refuses it anyway)
        return name


# --- selecting -----------------------------------------------------------------------------------

def environments_of(namespace: str | None, environments: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The Environments whose ``spec.namespaces`` include ``namespace``, by name."""
    found = [e for e in environments if namespace and namespace in ((e.get("spec") or {}).get("namespaces") or [])]
    return sorted(found, key=lambda e: str((e.get("metadata") or {}).get("name") or ""))


def compile_all(policies: Iterable[Mapping[str, Any]]) -> list[Policy]:
    """Compiled, ``joch-system``'s first, then by namespace and name (the order rules are reported)."""
    out = [compiled(raw) for raw in policies]
    return sorted(out, key=lambda p: (p.namespace != SYSTEM_NAMESPACE, p.namespace, p.name))


def applicable(
    policies: Iterable[Mapping[str, Any]], obj: Mapping[str, Any], environments: Sequence[Mapping[str, Any]],
) -> list[Policy]:
    """The Policies (compiled) whose selector matches ``obj``; ``environments`` are the object's
    namespace's (``environments_of``)."""
    return select(compile_all(policies), obj, environments)


def select(policies: Iterable[Policy], obj: Mapping[str, Any], environments: Sequence[Mapping[str, Any]],
           ) -> list[Policy]:
    """``applicable`` for Policies compiled already (``compile_all``); keeps their order."""
    kind = str(obj.get("kind") or "")
    labels = (obj.get("metadata") or {}).get("labels") or {}
    names = {str((e.get("metadata") or {}).get("name") or "") for e in environments} if environments else set()
    out = []
    for policy in policies:
        if policy.kinds and kind not in policy.kinds:
            continue
        if any(labels.get(k) != v for k, v in policy.match_labels.items()):
            continue
        if policy.environments and not (policy.environments & names):
            continue
        out.append(policy)
    return out


# --- evaluating ----------------------------------------------------------------------------------

def referenced(policies: Sequence[Policy], phase: Phase) -> frozenset[str]:
    """The variables the ``phase`` rules of ``policies`` read (``namespace`` as ``namespaceObject``)."""
    names: set[str] = set()
    for policy in policies:
        names |= policy.reads(phase)
    return frozenset(names)


def evaluate(policies: Sequence[Policy], phase: Phase, variables: dict[str, Any], *,
             reuse: Activation | None = None) -> list[Outcome]:
    """Run every ``phase`` rule of ``policies`` on ``variables``; the rules that fired. Only the
    variables some rule reads are converted for CEL (converting is most of the cost); ``reuse``
    keeps what was converted for the previous object (see ``Activation``)."""
    rules = [(p, r) for p in policies for r in p.phase(phase)]
    if not rules:
        return []
    wanted = referenced(policies, phase)
    chosen = {k: v for k, v in variables.items() if _alias(k) in wanted}
    for name, selected in _tries(policies, phase).items():
        if chosen.get(name) is not None:
            chosen[name] = prune(chosen[name], selected)
    context = reuse.bind(chosen) if reuse is not None else activation(chosen)
    out: list[Outcome] = []
    for policy, rule in rules:
        # The common case inline (a rule that is false): a call per rule less is a tenth of the cost.
        if rule.expression is not None:
            try:
                value = rule.expression.program.execute(context)
            except BaseException as exc:  # _run runs it again and reports the failure
                if isinstance(exc, (KeyboardInterrupt, SystemExit, GeneratorExit)):
                    raise
                value = None
            if value is False:
                continue
        outcome = _run(policy, rule, context)
        if outcome is not None:
            out.append(outcome)
    return out


def _tries(policies: Sequence[Policy], phase: Phase) -> dict[str, Trie]:
    """Per prunable variable some rule reads, the fields all of them read (left out: read whole)."""
    merged: dict[str, frozenset[tuple[str, ...]] | None] = {}
    for policy in policies:
        for name, paths in policy.paths(phase).items():
            known = merged.get(name, frozenset())
            merged[name] = None if paths is None or known is None else known | paths
    return {name: trie(paths) for name, paths in merged.items() if paths is not None}


def _run(policy: Policy, rule: Rule, context: Any) -> Outcome | None:
    failure: str | None = None
    if rule.expression is None:
        error = rule.error
        failure = f"the expression does not compile ({error})" if error else "the expression does not compile"
    else:
        try:
            if not rule.expression.evaluate(context):
                return None
        except EvaluationError as exc:
            failure = f"the expression failed: {exc}"
    if failure is None:
        return Outcome(policy, rule, rule.action, rule.message or f"rule {rule.name} matched")
    action: Action = "warn" if rule.action == "warn" else "deny"
    said = f"{rule.message} ({failure})" if rule.message else failure
    return Outcome(policy, rule, action, said, failed=True)


def _alias(name: str) -> str:
    return "namespaceObject" if name == "namespace" else name


def request_variable(user: str, groups: Iterable[str], verb: str) -> Mapping[str, Any]:
    """``request``; the same (read-only) mapping for the same values, so ``Activation`` converts it once."""
    return _request(user, tuple(groups), verb)


@functools.lru_cache(maxsize=256)
def _request(user: str, groups: tuple[str, ...], verb: str) -> Mapping[str, Any]:
    return types.MappingProxyType({"user": user, "groups": list(groups), "verb": verb})


def namespace_variable(namespace: str | None, environments: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
    first = environments[0] if environments else None
    return _namespace(namespace or "", str(((first or {}).get("metadata") or {}).get("name") or "") or None)


@functools.lru_cache(maxsize=1024)
def _namespace(name: str, environment: str | None) -> Mapping[str, Any]:
    return types.MappingProxyType({"name": name, "environment": environment})


def environment_variable(environments: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    return environments[0] if environments else None
