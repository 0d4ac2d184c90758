"""Talking to a Kubernetes API server: requests built by lightkube, answers kept as plain dicts.

lightkube builds each request (the URL of a generic resource, its parameters, the credentials and
TLS of the kubeconfig or the in-cluster service account) and sends it with its HTTP client; the
store reads the JSON itself, because store objects are plain dicts and a Kubernetes ``Status`` must
become the same ``joch.api.errors`` error a SQL store raises (409 ``AlreadyExists``/``Conflict``,
404, 410 ``Gone``, 422 ``Invalid``). A connection that fails is ``ServiceUnavailable`` naming the
server, never a driver traceback.
"""

from __future__ import annotations

import json
import logging
from typing import Any
from urllib.parse import parse_qs, urlsplit

import httpx2 as httpx
from lightkube import Client, KubeConfig
from lightkube.config.kubeconfig import SingleConfig
from lightkube.core import resource as lkr
from lightkube.core.exceptions import ConfigError
from lightkube.generic_resource import Generic

from joch.api import errors

Obj = dict[str, Any]
TIMEOUT = 10.0

# Every request is logged at INFO by lightkube's HTTP client: a store makes many (each renewal of the
# leader lease, each write), so only its warnings reach Joch's log.
logging.getLogger("httpx2").setLevel(logging.WARNING)


def config_from_url(url: str) -> tuple[SingleConfig, str]:
    """``kubernetes://[?kubeconfig=PATH&context=NAME&namespace=NS]``: that kubeconfig (and context),
    or without one the in-cluster service account, then ``$KUBECONFIG``, then ``~/.kube/config``;
    and the namespace of the store's own objects (``joch-system`` by default)."""
    parts = urlsplit(url)
    options = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    unknown = sorted(set(options) - {"kubeconfig", "context", "namespace"})
    if parts.netloc or parts.path.strip("/") or unknown:
        raise errors.BadRequest(
            f"unsupported Kubernetes store URL {url!r}: use kubernetes:// (in-cluster or $KUBECONFIG) or "
            "kubernetes://?kubeconfig=PATH&context=NAME&namespace=NS")
    try:
        if "kubeconfig" in options:
            config = KubeConfig.from_file(options["kubeconfig"])
        else:
            config = KubeConfig.from_env()
        single = config.get(context_name=options.get("context"))
    except (ConfigError, OSError) as exc:
        raise errors.ServiceUnavailable(f"cannot load the Kubernetes configuration for {url!r}: {exc}") from exc
    if single is None:
        raise errors.ServiceUnavailable(f"the Kubernetes configuration for {url!r} names no context to use")
    return single, options.get("namespace") or "joch-system"


class Api:
    """One lightkube client shared by every thread (its connection pool is thread-safe)."""

    def __init__(self, config: SingleConfig, *, timeout: float = TIMEOUT) -> None:
        self.server = config.cluster.server
        self.client = Client(config=config, timeout=httpx.Timeout(timeout), field_manager="joch")
        self.generic = self.client._client  # lightkube's request builder and sender

    def request(
        self, method: str, res: type[lkr.Resource], *, namespace: str | None = None, name: str | None = None,
        body: Obj | None = None, params: dict[str, Any] | None = None, what: str = "",
    ) -> Obj:
        br = self.generic.prepare_request(
            method, res, obj=Generic(**body) if body is not None and method in ("post", "put") else body,
            name=name, namespace=namespace, params=params)
        if body is not None:
            br.data = body
        req = self.generic.build_adapter_request(br)
        try:
            resp = self.generic.send(req)
        except httpx.HTTPError as exc:
            raise self.unreachable(exc) from exc
        return self.decode(resp, what)

    def open_watch(self, res: type[lkr.Resource], *, namespace: str | None, params: dict[str, Any]) -> Any:
        """The streaming response of a watch (the caller closes it); a refusal raises its error."""
        br = self.generic.prepare_request("list", res, namespace=namespace, watch=True, params=params)
        req = self.generic._client.build_request(br.method, br.url, params=br.params,
                                                 timeout=self.generic._watch_timeout)
        try:
            resp = self.generic.send(req, stream=True)
        except httpx.HTTPError as exc:
            raise self.unreachable(exc) from exc
        if resp.status_code >= 400:
            try:
                resp.read()
                self.decode(resp, "")
            finally:
                resp.close()
        return resp

    def unreachable(self, exc: Exception) -> errors.JochError:
        return errors.ServiceUnavailable(f"cannot reach the Kubernetes API server at {self.server}: {exc}")

    def decode(self, resp: Any, what: str) -> Obj:
        try:
            data = json.loads(resp.content) if resp.content else {}
        except ValueError:
            data = {}
        if resp.status_code < 400:
            if not isinstance(data, dict):
                raise errors.Internal(f"the Kubernetes API server at {self.server} answered with a non-object")
            return data
        raise status_error(data if isinstance(data, dict) else {}, resp.status_code, what)

    def close(self) -> None:
        self.client.close()


def status_error(status: Obj, code: int, what: str = "") -> errors.JochError:
    """The Joch error for a Kubernetes ``Status`` (``what``: the resource, for a missing CRD)."""
    status = {**status, "code": status.get("code") or code}
    if status["code"] == 410:
        return errors.Gone(str(status.get("message") or "too old resource version"))
    details = status.get("details") or {}
    message = str(status.get("message") or "")
    if "too large resource version" in message.lower():
        # kube-apiserver waits for a future resourceVersion, then answers 504: the caller asked too far ahead.
        return errors.BadRequest(message)
    if status["code"] == 404 and what and not details.get("name"):
        # A 404 that names no object: the resource itself is not served (its CRD is not installed).
        return errors.NotFound(f"the Kubernetes API server does not serve {what}: install the CRDs "
                               "(kubectl apply -f charts/agents/crds/) and try again")
    if not status.get("reason"):
        status["reason"] = {404: "NotFound", 409: "Conflict", 422: "Invalid", 400: "BadRequest",
                            403: "Forbidden", 401: "Unauthorized", 503: "ServiceUnavailable"}.get(
                                int(status["code"]), "InternalError")
    return errors.from_status(status)
