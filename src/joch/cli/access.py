"""``joch auth whoami`` and ``joch auth can-i``: the server's answers about the caller.

``whoami`` reads ``GET /v1/whoami``. ``can-i`` resolves the resource as every command does
(discovery: a kind, plural or short name, ``RESOURCE/SUBRESOURCE`` for ``approvals/decide``) and
posts a ``SelfSubjectAccessReview``, as ``kubectl auth can-i`` does; it prints ``yes`` or ``no``
(with the server's reason when it says no) and the command exits 0 or 1.
"""

from __future__ import annotations

from typing import Any

import typer

from joch.cli.client import Client

REVIEWS = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"


def whoami(client: Client) -> None:
    user = client.get_object("/v1/whoami")
    typer.echo(f"Username: {user.get('username', '')}")
    groups = user.get("groups") or []
    typer.echo(f"Groups:   {', '.join(str(g) for g in groups) if groups else '(none)'}")


def can_i(client: Client, verb: str, resource: str, name: str | None, namespace: str) -> bool:
    plural, _, subresource = resource.partition("/")
    attributes: dict[str, Any] = {"verb": verb, "namespace": namespace}
    if plural == "*":
        attributes["resource"] = "*"
    else:
        kind = client.discovery.resolve(plural)
        attributes |= {"group": kind.group, "resource": kind.plural}
    if subresource:
        attributes["subresource"] = subresource
    if name:
        attributes["name"] = name
    review = {"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectAccessReview",
              "spec": {"resourceAttributes": attributes}}
    answer = client.request("POST", REVIEWS, json_body=review)
    status = answer.get("status") if isinstance(answer, dict) else None
    if not isinstance(status, dict):
        raise client.not_joch(f"POST {REVIEWS} answered no status")
    allowed = status.get("allowed") is True
    reason = status.get("reason")
    typer.echo("yes" if allowed else f"no - {reason}" if reason else "no")
    return allowed
