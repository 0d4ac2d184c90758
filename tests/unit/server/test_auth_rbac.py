"""What a request asks (``requests.resolve``) and what each built-in role grants (``rbac.decide``)."""

from __future__ import annotations

import hashlib

import pytest

from joch.api import errors
from joch.api.identity import AUTHENTICATED, CONTROLLER, UserInfo
from joch.server.auth import rbac, tokenfile
from joch.server.auth.middleware import is_exempt
from joch.server.auth.requests import RequestInfo, resolve

RUN = "/apis/runtime.joch.dev/v1alpha1/namespaces/ns/agentruns"


@pytest.mark.parametrize(("method", "path", "query", "expected"), [
    ("GET", f"{RUN}", "", RequestInfo("list", RUN, "agentruns", "runtime.joch.dev", namespace="ns")),
    ("GET", f"{RUN}", "watch=true", RequestInfo("watch", RUN, "agentruns", "runtime.joch.dev", namespace="ns")),
    ("GET", "/apis/joch.dev/v1alpha1/agents", "watch=1",
     RequestInfo("watch", "/apis/joch.dev/v1alpha1/agents", "agents", "joch.dev")),
    ("PATCH", f"{RUN}/r/status", "", RequestInfo("patch", f"{RUN}/r/status", "agentruns", "runtime.joch.dev",
                                                 "status", "ns", "r")),
    ("GET", f"{RUN}/r/log", "follow=true", RequestInfo("get", f"{RUN}/r/log", "agentruns", "runtime.joch.dev",
                                                       "log", "ns", "r")),
    ("DELETE", f"{RUN}/r", "", RequestInfo("delete", f"{RUN}/r", "agentruns", "runtime.joch.dev", "", "ns", "r")),
    ("DELETE", RUN, "labelSelector=a", RequestInfo("deletecollection", RUN, "agentruns", "runtime.joch.dev",
                                                   namespace="ns")),
    ("GET", "/api/v1/namespaces", "", RequestInfo("list", "/api/v1/namespaces", "namespaces")),
    ("DELETE", "/api/v1/namespaces/team-a", "",
     RequestInfo("delete", "/api/v1/namespaces/team-a", "namespaces", name="team-a")),
    ("PUT", "/api/v1/namespaces/team-a/status", "",
     RequestInfo("update", "/api/v1/namespaces/team-a/status", "namespaces", subresource="status", name="team-a")),
    ("GET", "/api/v1/namespaces/team-a/events", "",
     RequestInfo("list", "/api/v1/namespaces/team-a/events", "events", namespace="team-a")),
    ("GET", "/version", "", RequestInfo("get", "/version", anyone=True)),
    ("POST", "/v1/namespaces/ns/approvals/gate/decide", "",
     RequestInfo("update", "/v1/namespaces/ns/approvals/gate/decide", "approvals", "runtime.joch.dev", "decide",
                 "ns", "gate")),
    ("POST", "/v1/namespaces/ns/executions", "",
     RequestInfo("create", "/v1/namespaces/ns/executions", "agentruns", "runtime.joch.dev", namespace="ns")),
    ("POST", "/v1/namespaces/ns/agentruns/render", "",
     RequestInfo("create", "/v1/namespaces/ns/agentruns/render", "agentruns", "runtime.joch.dev", namespace="ns")),
    ("GET", "/v1/namespaces/ns/executions/r/log", "",
     RequestInfo("get", "/v1/namespaces/ns/executions/r/log", "agentruns", "runtime.joch.dev", "log", "ns", "r")),
    ("GET", "/v1/namespaces/ns/agents/a/manifest", "",
     RequestInfo("get", "/v1/namespaces/ns/agents/a/manifest", "agents", "joch.dev", "manifest", "ns", "a")),
    ("GET", "/v1/resources/watch", "kind=ag&namespace=ns",
     RequestInfo("watch", "/v1/resources/watch", "agents", "joch.dev", namespace="ns")),
    ("WATCH", "/v1/resources", "", RequestInfo("watch", "/v1/resources", "*")),
    # A repeated parameter is what the route reads: its last value, even blank (every kind, every namespace).
    ("GET", "/v1/resources/watch", "kind=ag&kind=&namespace=ns&namespace=",
     RequestInfo("watch", "/v1/resources/watch", "*")),
    ("GET", "/v1/audit", "namespace=ns&namespace=", RequestInfo("list", "/v1/audit", "auditevents", "ops.joch.dev")),
    ("GET", f"{RUN}", "watch=true&watch=", RequestInfo("list", RUN, "agentruns", "runtime.joch.dev", namespace="ns")),
    ("GET", "/v1/audit", "namespace=ns", RequestInfo("list", "/v1/audit", "auditevents", "ops.joch.dev",
                                                     namespace="ns")),
    ("POST", "/v1/resources/apply", "namespace=ns", RequestInfo("apply", "/v1/resources/apply", namespace="ns",
                                                                 batch=True)),
    ("POST", "/v1/resources/create", "", RequestInfo("create", "/v1/resources/create", batch=True)),
    ("GET", "/v1/cost", "", RequestInfo("list", "/v1/cost", "agentruns", "runtime.joch.dev")),
    ("GET", "/v1/namespaces/ns/cost", "", RequestInfo("list", "/v1/namespaces/ns/cost", "agentruns",
                                                     "runtime.joch.dev", namespace="ns")),
    ("POST", "/v1/namespaces/ns/triggerrules/fix/fire", "",
     RequestInfo("create", "/v1/namespaces/ns/triggerrules/fix/fire", "triggerrules", "joch.dev", "fire", "ns",
                 "fix")),
    ("GET", "/apis", "", RequestInfo("get", "/apis", anyone=True)),
    ("POST", "/mcp", "", RequestInfo("create", "/mcp", anyone=True)),  # each MCP tool call is authorized itself
    ("GET", "/apis/joch.dev/v1alpha1", "", RequestInfo("get", "/apis/joch.dev/v1alpha1", anyone=True)),
    ("POST", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", "",
     RequestInfo("create", "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", anyone=True)),
    ("GET", "/metrics", "", RequestInfo("get", "/metrics")),
    ("GET", "/apis/joch.dev/v1alpha1//namespaces/ns/agents", "",
     RequestInfo("get", "/apis/joch.dev/v1alpha1//namespaces/ns/agents")),
])
def test_requests_resolve_like_the_apiservers_request_info(
    method: str, path: str, query: str, expected: RequestInfo,
) -> None:
    assert resolve(method, path, query) == expected


def test_only_health_version_webhooks_and_the_run_callback_are_exempt() -> None:
    assert all(is_exempt("GET", p) for p in ("/healthz", "/readyz", "/version", "/v1/webhooks/github"))
    assert is_exempt("POST", "/v1/namespaces/ns/agentruns/r/callback")
    assert not is_exempt("GET", "/v1/namespaces/ns/agentruns/r/callback")
    assert not is_exempt("POST", "/v1/namespaces/ns/agentruns/r/x/callback")
    assert not is_exempt("POST", "/v1/namespaces//agentruns/r/callback")
    assert not is_exempt("GET", "/v1/webhooks")


def test_reading_the_consoles_files_is_exempt_and_nothing_else_under_it() -> None:
    assert all(is_exempt("GET", p) for p in ("/", "/console", "/console/", "/console/app.js", "/console/config.json"))
    assert is_exempt("HEAD", "/console/style.css")
    assert not is_exempt("POST", "/console/config.json")
    assert not is_exempt("POST", "/")
    assert not is_exempt("GET", "/consoles")
    assert not is_exempt("GET", "/v1/console/")


def bound(*roles: str, namespace: str = "ns") -> rbac.Index:
    return rbac.Index.of(1, [
        {"metadata": {"name": role, "namespace": namespace},
         "roleRef": {"name": role}, "subjects": [{"kind": "User", "name": "u"}]}
        for role in roles
    ])


def may(index: rbac.Index, verb: str, resource: str, subresource: str = "", namespace: str = "ns",
        user: UserInfo = UserInfo("u", (AUTHENTICATED,))) -> bool:
    return rbac.decide(index, rbac.Attributes(user=user, verb=verb, resource=resource, subresource=subresource,
                                              namespace=namespace)).allowed


@pytest.mark.parametrize(("role", "allowed", "denied"), [
    ("viewer", [("get", "agents", ""), ("list", "agentruns", ""), ("watch", "approvals", ""),
                ("get", "agentruns", "log"), ("get", "agentruns", "artifacts"), ("get", "agents", "manifest")],
     [("list", "secrets", ""), ("create", "agents", ""), ("create", "triggerrules", "fire"),
      ("list", "auditevents", ""), ("watch", "*", "")]),
    ("editor", [("create", "agents", ""), ("patch", "agentruns", ""), ("delete", "agentproviders", ""),
                ("get", "agentruns", "log"), ("create", "triggerrules", "fire"), ("list", "writeintents", ""),
                ("get", "triggerexecutions", ""), ("create", "implementationsources", ""),
                ("create", "triggerrules", "")],
     [("patch", "agentruns", "status"), ("update", "triggerrules", "fire"), ("create", "agentruns", "fire"),
      ("update", "approvals", "decide"), ("create", "secrets", ""),
      ("create", "rolebindings", ""), ("update", "budgets", ""), ("delete", "policies", ""),
      ("create", "teams", ""), ("create", "environments", ""), ("update", "leases", ""), ("get", "secrets", ""),
      ("create", "webhookdeliveries", ""), ("create", "triggerexecutions", ""), ("delete", "triggerexecutions", ""),
      ("create", "writeintents", ""), ("patch", "writeintents", "")]),
    ("approver", [("update", "approvals", "decide"), ("list", "approvals", "")],
     [("create", "agentruns", ""), ("patch", "approvals", ""), ("update", "approvals", "status")]),
    ("admin", [("get", "secrets", ""), ("create", "rolebindings", ""), ("update", "agentruns", "status"),
               ("list", "auditevents", "")], []),
])
def test_what_each_role_grants_in_its_namespace(
    role: str, allowed: list[tuple[str, str, str]], denied: list[tuple[str, str, str]],
) -> None:
    index = bound(role)
    for verb, resource, sub in allowed:
        assert may(index, verb, resource, sub), (role, verb, resource, sub)
        assert not may(index, verb, resource, sub, namespace="other"), "a binding grants only in its namespace"
    for verb, resource, sub in denied:
        assert not may(index, verb, resource, sub), (role, verb, resource, sub)


def test_joch_system_bindings_grant_everywhere_and_superusers_are_admins() -> None:
    index = bound("viewer", namespace="joch-system")
    assert may(index, "list", "agents", namespace="anywhere") and may(index, "list", "agents", namespace="")
    assert not may(bound("admin"), "list", "agents", namespace="")  # cluster scope needs joch-system
    nobody = rbac.Index.of(1, [])
    masters = UserInfo("root", ("system:masters",))
    assert may(nobody, "delete", "secrets", user=masters) and may(nobody, "patch", "agentruns", "status",
                                                                  user=CONTROLLER)
    group = rbac.Index.of(1, [{"metadata": {"name": "g", "namespace": "ns"},
                               "roleRef": {"name": "editor"}, "subjects": [{"kind": "Group", "name": "d"}]}])
    assert may(group, "create", "agents", user=UserInfo("x", ("d",)))
    assert not may(group, "create", "agents", user=UserInfo("d", ()))  # a user named like the group is not in it


def test_the_forbidden_message_names_user_verb_resource_group_and_namespace() -> None:
    attrs = rbac.Attributes(user=UserInfo("bob"), verb="create", resource="agents", api_group="joch.dev",
                            namespace="default")
    decision = rbac.decide(rbac.Index.of(1, []), attrs)
    assert decision.reason == ('agents.joch.dev is forbidden: User "bob" cannot create resource "agents" in API '
                               'group "joch.dev" in the namespace "default": that takes role editor or admin (a '
                               'RoleBinding in namespace "default" or "joch-system")')
    error = rbac.forbidden(attrs, decision)
    assert isinstance(error, errors.Forbidden)
    assert error.to_status()["details"] == {"kind": "agents", "group": "joch.dev"}
    path = rbac.decide(rbac.Index.of(1, []), rbac.Attributes(user=UserInfo("bob"), verb="get", path="/metrics"))
    assert path.reason.startswith('forbidden: User "bob" cannot get path "/metrics"')


def test_system_monitoring_may_get_metrics_and_nothing_else() -> None:
    nobody = rbac.Index.of(1, [])
    scraper = UserInfo("prometheus", ("system:monitoring",))

    def decide(user: UserInfo, verb: str, path: str) -> rbac.Decision:
        return rbac.decide(nobody, rbac.Attributes(user=user, verb=verb, path=path))

    assert decide(scraper, "get", "/metrics").allowed
    assert not decide(scraper, "create", "/metrics").allowed
    assert not decide(scraper, "get", "/metrics/extra").allowed
    assert not may(nobody, "list", "agents", user=scraper)
    assert decide(UserInfo("root", ("system:masters",)), "get", "/metrics").allowed
    refused = decide(UserInfo("bob"), "get", "/metrics")
    assert not refused.allowed and 'or group "system:monitoring" to get it' in refused.reason
    assert "system:monitoring" not in decide(UserInfo("bob"), "get", "/other").reason


def test_token_files_parse_like_kube_apiservers() -> None:
    digest = hashlib.sha256(b"t2").hexdigest()
    table = tokenfile.parse(f't1,alice,1,"a,b"\n\n# comment\nsha256:{digest.upper()},bob,2\n', "f")
    assert table[tokenfile.digest("t1")] == UserInfo("alice", ("a", "b", AUTHENTICATED), "1")
    assert table[digest] == UserInfo("bob", (AUTHENTICATED,), "2")
    with pytest.raises(errors.BadRequest, match="f line 1 has an empty user column"):
        tokenfile.parse("t1,,1\n", "f")
    with pytest.raises(errors.BadRequest, match="f line 2 repeats a token of an earlier line"):
        tokenfile.parse(f"t2,a,1\nsha256:{digest},b,2\n", "f")
    with pytest.raises(errors.BadRequest, match=r"f line 1 has 5 field\(s\)"):
        tokenfile.parse("t,a,1,g,extra\n", "f")
