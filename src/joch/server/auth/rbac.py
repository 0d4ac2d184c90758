"""Who may do what: Joch's four built-in roles, bound to users and groups by RoleBindings.

Roles (per namespace; what a RoleBinding's ``roleRef.name`` names):

=========  ==============================================================================================
viewer     get, list, watch every resource except Secrets and the audit log; run logs and artifacts,
           agent manifests (``get`` on ``agentruns/log``, ``agentruns/artifacts``, ``agents/manifest``)
editor     viewer, and create, update, patch, delete every kind except the admin-only ones below (so:
           create and cancel runs); never a subresource (no status writes, no approval decisions) but
           ``create`` on ``triggerrules/fire`` (``joch trigger fire``: it starts a run, as creating one does)
approver   viewer, and deciding approvals: ``update`` on ``approvals/decide``
           (``POST /v1/namespaces/NS/approvals/NAME/decide``)
admin      everything in the namespace: Secrets, RoleBindings, Budgets, Models, Events, Policies, Teams,
           Environments, Leases, WebhookDeliveries, TriggerExecutions, WriteIntents (editors read them),
           status subresources, the namespace's audit log
=========  ==============================================================================================

A RoleBinding has Kubernetes' shape: ``roleRef`` and ``subjects`` are top-level keys (no ``spec``).
A subject is a ``User``, a ``Group`` or a ``Team`` (ops.joch.dev, cluster-scoped): a Team subject
binds the Team's ``members`` (users) and ``groups`` as they are now, so changing a Team changes
what its bindings grant without touching them; a Team that does not exist binds nobody.
It grants its role in its own namespace; one in ``joch-system`` grants it in every
namespace and at the cluster scope (lists across all namespaces, a watch of every kind, the audit
log of every namespace, non-resource URLs). Members of ``system:masters`` and of
``system:joch:controllers`` (``joch.api.identity.CONTROLLER``) are admins everywhere, which is how
the first admin is bootstrapped: a token-file user in group ``system:masters`` applies the first
RoleBindings. Members of ``system:monitoring`` may ``get`` the non-resource URL ``/metrics`` (as on
kube-apiserver: a Prometheus scraper's token), and nothing more. Status subresources of every kind
are written only by admins and the controllers, so nobody else can forge a run's phase or an
approval's decision.

Bindings are read from the store and kept for ``binding_cache_seconds``: a request that the kept
bindings allow costs no query. A request they deny is decided again on freshly read bindings when
the store changed since they were read (one cheap ``current_revision`` query), so a binding just
created works at once; a deleted one stops granting within ``binding_cache_seconds``. Denials are
rare and cost one query; the common case costs a few dict lookups.

``authorize_documents`` is the check of the batch routes (``/v1/resources/apply`` and ``create``),
whose documents span kinds and namespaces: every document is authorized before anything is
written, and one forbidden document forbids the request.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from joch.admission import documents
from joch.admission.validation import resolve_kind
from joch.api import REGISTRY, errors, kinds
from joch.api.audit import AuditEntry
from joch.api.identity import CONTROLLERS_GROUP, UserInfo
from joch.api.meta import DEFAULT_NAMESPACE
from joch.api.registry import KindInfo
from joch.server.auth.requests import ALL, RequestInfo
from joch.store.base import Store

MASTERS = "system:masters"
MONITORING = "system:monitoring"  # kube-apiserver's group for scrapers: may get /metrics, nothing else
MONITORING_PATHS = frozenset({"/metrics"})
SUPERUSER_GROUPS = (MASTERS, CONTROLLERS_GROUP)
CLUSTER_NAMESPACE = kinds.CLUSTER_NAMESPACE
ROLES = kinds.BUILTIN_ROLES
READ_VERBS = frozenset({"get", "list", "watch"})
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
HIDDEN = frozenset({"secrets", "auditevents", ALL})  # not even viewers read these
# Models too: their prices are what Budgets are enforced in, so writing one is setting the spend.
# Events are what Joch's controllers and admission say happened (as in Kubernetes' edit role,
# editors read them): an editor must not forge "approved by" one or delete a policy warning.
FIRE = ("create", "triggerrules", "fire")  # the one subresource editors write: firing a rule starts a run
# WebhookDeliveries, TriggerExecutions and WriteIntents are Joch's own records of what came in and
# what goes out, as Events are: a forged delivery would be processed as verified, a forged execution
# would block an event's dedupe key (and is what write-back trusts for a triggered run's issue), and a
# forged WriteIntent would be sent with a source's token to any issue or repository.
ADMIN_ONLY = frozenset({"secrets", "rolebindings", "budgets", "models", "events", "policies", "teams",
                        "environments", "leases", "auditevents", "webhookdeliveries", "triggerexecutions",
                        "writeintents", ALL})


@dataclass(frozen=True)
class Attributes:
    """One authorization question: may ``user`` do ``verb`` on this resource (or path)?"""

    user: UserInfo
    verb: str
    resource: str = ""
    api_group: str = ""
    subresource: str = ""
    namespace: str = ""
    name: str = ""
    path: str = ""
    anyone: bool = False

    @classmethod
    def of(cls, user: UserInfo, info: RequestInfo) -> Attributes:
        return cls(user=user, verb=info.verb, resource=info.resource, api_group=info.api_group,
                   subresource=info.subresource, namespace=info.namespace, name=info.name, path=info.path,
                   anyone=info.anyone)


@dataclass(frozen=True)
class Decision:
    allowed: bool
    reason: str


class Authorizer(Protocol):
    def authorize(self, attrs: Attributes, *, fresh: bool = False) -> Decision: ...

    def needs_reload(self) -> bool: ...

    def reload(self, *, force: bool = False) -> None: ...


class AlwaysAllow:
    """Auth none: every caller may do everything (kube-apiserver's ``AlwaysAllow``)."""

    def authorize(self, attrs: Attributes, *, fresh: bool = False) -> Decision:
        return Decision(True, "the server runs without authentication: every request is allowed")

    def needs_reload(self) -> bool:
        return False

    def reload(self, *, force: bool = False) -> None:
        return None


def role_allows(role: str, attrs: Attributes) -> bool:
    if role == "admin":
        return True
    if not attrs.resource:
        return False  # non-resource URLs: cluster admins only
    reads = attrs.verb in READ_VERBS and attrs.resource not in HIDDEN
    if role == "viewer":
        return reads
    if role == "editor":
        return reads or (attrs.verb in WRITE_VERBS and not attrs.subresource and attrs.resource not in ADMIN_ONLY) \
            or (attrs.verb, attrs.resource, attrs.subresource) == FIRE
    if role == "approver":
        return reads or (attrs.verb == "update" and attrs.resource == "approvals" and attrs.subresource == "decide")
    return False


@dataclass(frozen=True)
class Grant:
    role: str
    binding: str  # namespace/name


@dataclass
class Index:
    revision: int
    by_namespace: dict[str, dict[tuple[str, str], list[Grant]]] = field(default_factory=dict)

    @classmethod
    def of(cls, revision: int, bindings: Iterable[dict[str, Any]], teams: Iterable[dict[str, Any]] = ()) -> Index:
        index = cls(revision)
        members: dict[str, list[tuple[str, str]]] = {}
        for team in teams:
            spec = _mapping(team.get("spec"))
            members[str(_mapping(team.get("metadata")).get("name"))] = [
                *(("User", str(m)) for m in spec.get("members") or []),
                *(("Group", str(g)) for g in spec.get("groups") or [])]
        for obj in bindings:
            # roleRef and subjects are top-level keys, as in rbac.authorization.k8s.io/v1
            metadata, spec = _mapping(obj.get("metadata")), kinds.ROLE_BINDING.body_of(obj)
            role_ref = spec.get("roleRef") or {}
            role = role_ref.get("name") if isinstance(role_ref, dict) else None
            if role not in ROLES:
                continue
            namespace = str(metadata.get("namespace") or "")
            grant = Grant(str(role), f"{namespace}/{metadata.get('name')}")
            subjects = index.by_namespace.setdefault(namespace, {})
            for subject in spec.get("subjects") or []:
                if not isinstance(subject, dict):
                    continue
                if subject.get("kind") in ("User", "Group"):
                    subjects.setdefault((str(subject["kind"]), str(subject.get("name"))), []).append(grant)
                elif subject.get("kind") == "Team":
                    for key in members.get(str(subject.get("name")), ()):
                        subjects.setdefault(key, []).append(grant)
        return index

    def grants(self, user: UserInfo, namespace: str) -> Iterable[Grant]:
        keys = [("User", user.name), *(("Group", group) for group in user.groups)]
        spaces = [CLUSTER_NAMESPACE] if not namespace or namespace == CLUSTER_NAMESPACE else [namespace,
                                                                                              CLUSTER_NAMESPACE]
        for space in spaces:
            subjects = self.by_namespace.get(space)
            if subjects:
                for key in keys:
                    yield from subjects.get(key, ())


class RBAC:
    """RoleBinding-based authorization over a store (see the module docstring)."""

    def __init__(self, store: Store, *, cache_seconds: float = 1.0) -> None:
        self.store = store
        self.cache_seconds = cache_seconds
        self._index: Index | None = None
        self._read_at = 0.0
        self._lock = threading.Lock()

    def needs_reload(self) -> bool:
        return self._index is None or time.monotonic() - self._read_at >= self.cache_seconds

    def reload(self, *, force: bool = False) -> None:
        with self._lock:
            if not force and not self.needs_reload():
                return  # another request's thread just did
            revision = self.store.current_revision()
            if self._index is None or self._index.revision != revision:
                result = self.store.list(kinds.ROLE_BINDING)
                teams = self.store.list(kinds.TEAM).items
                self._index = Index.of(int(result.resource_version or revision), result.items, teams)
            self._read_at = time.monotonic()

    def authorize(self, attrs: Attributes, *, fresh: bool = False) -> Decision:
        if fresh or self._index is None:
            self.reload(force=fresh)
        index = self._index
        if index is None:  # pragma: no cover - reload() sets it
            raise errors.Internal("the RoleBindings could not be read")
        return decide(index, attrs)


def decide(index: Index, attrs: Attributes) -> Decision:
    user = attrs.user
    for group in SUPERUSER_GROUPS:
        if group in user.groups:
            return Decision(True, f'group "{group}" is admin everywhere')
    if attrs.anyone:
        return Decision(True, "every authenticated user may")
    if MONITORING in user.groups and _monitoring(attrs):
        return Decision(True, f'group "{MONITORING}" may get {attrs.path}')
    for grant in index.grants(user, attrs.namespace):
        if role_allows(grant.role, attrs):
            return Decision(True, f'RoleBinding "{grant.binding}" grants role {grant.role}')
    return Decision(False, forbidden_message(attrs))


def _monitoring(attrs: Attributes) -> bool:
    return not attrs.resource and attrs.verb == "get" and attrs.path in MONITORING_PATHS


def forbidden_message(attrs: Attributes) -> str:
    user = attrs.user.name
    if not attrs.resource:
        monitoring = f', or group "{MONITORING}" to get it' if attrs.path in MONITORING_PATHS else ""
        return (f'forbidden: User "{user}" cannot {attrs.verb} path "{attrs.path}": only admins of every '
                f'namespace may (role admin bound in namespace "{CLUSTER_NAMESPACE}", or group "{MASTERS}"'
                f'{monitoring})')
    qualified = f"{attrs.resource}.{attrs.api_group}" if attrs.api_group else attrs.resource
    named = f' "{attrs.name}"' if attrs.name else ""
    what = f"{attrs.resource}/{attrs.subresource}" if attrs.subresource else attrs.resource
    scope = f'in the namespace "{attrs.namespace}"' if attrs.namespace else "at the cluster scope"
    roles = [role for role in ROLES if role_allows(role, attrs)]
    where = (f'a RoleBinding in namespace "{attrs.namespace}" or "{CLUSTER_NAMESPACE}"' if attrs.namespace
             else f'a RoleBinding in namespace "{CLUSTER_NAMESPACE}"')
    return (f'{qualified}{named} is forbidden: User "{user}" cannot {attrs.verb} resource "{what}" in API group '
            f'"{attrs.api_group}" {scope}: that takes role {" or ".join(roles)} ({where})')


def forbidden(attrs: Attributes, decision: Decision) -> errors.Forbidden:
    extra = {"group": attrs.api_group} if attrs.resource else {}
    return errors.Forbidden(decision.reason, kind=attrs.resource or None, name=attrs.name or None, extra=extra)


def denial_entry(attrs: Attributes, reason: str, *, request_id: str = "", source_ip: str = "") -> AuditEntry:
    return AuditEntry(verb=attrs.verb, kind=kind_of(attrs.resource), namespace=attrs.namespace or None,
                      name=attrs.name or None, decision="denied", reason=reason, actor=attrs.user.name,
                      groups=attrs.user.groups, request_id=request_id, source_ip=source_ip)


def kind_of(resource: str) -> str:
    """``Agent`` for ``agents``; a resource Joch has no kind for (``auditevents``) as it is."""
    for info in REGISTRY:
        if info.plural == resource:
            return info.kind
    return resource


def authorize_documents(
    authorizer: Authorizer, store: Store, user: UserInfo, docs: Sequence[documents.Document], *,
    namespace: str | None, create_only: bool,
) -> None:
    """Authorize every document of a batch apply (``create_only``: a batch create) before anything
    is written; the first forbidden one raises ``Forbidden`` (audited) naming it. A document whose
    kind does not resolve is left to admission, which rejects it."""
    for doc in docs:
        try:
            kind = resolve_kind(doc.obj)
        except errors.JochError:
            continue
        metadata = _mapping(doc.obj.get("metadata"))
        ns = str(metadata.get("namespace") or namespace or DEFAULT_NAMESPACE) if kind.namespaced else ""
        name = str(metadata.get("name") or "")

        def attrs(verb: str) -> Attributes:
            return Attributes(user=user, verb=verb, resource=kind.plural, api_group=kind.group,  # noqa: B023
                              namespace=ns, name=name)  # noqa: B023

        create = _decide(authorizer, attrs("create"))
        if create_only:
            verdict, asked = create, attrs("create")
        else:
            update = _decide(authorizer, attrs("update"))
            if create.allowed and update.allowed:
                continue
            exists = bool(name) and _exists(store, kind, ns, name)
            verdict, asked = (update, attrs("update")) if exists else (create, attrs("create"))
        if verdict.allowed:
            continue
        message = f"{doc.label()}: {verdict.reason}"
        store.audit(denial_entry(asked, verdict.reason))
        raise forbidden(asked, Decision(False, message))


def _mapping(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _decide(authorizer: Authorizer, attrs: Attributes) -> Decision:
    decision = authorizer.authorize(attrs)
    return decision if decision.allowed else authorizer.authorize(attrs, fresh=True)


def _exists(store: Store, kind: KindInfo, namespace: str, name: str) -> bool:
    try:
        store.get(kind, namespace or None, name)
    except errors.NotFound:
        return False
    return True
