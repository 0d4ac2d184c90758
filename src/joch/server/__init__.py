"""The HTTP server: Kubernetes-compatible REST and watch for every registered kind, the Joch
``/v1`` routes (apply, executions, approvals, Server-Sent Events), discovery, health and OpenAPI.

Public surface: ``create_app`` builds the FastAPI app over an open store; ``serve`` opens a store
from its URL and runs uvicorn; ``ServerOptions`` configures both. Modules, one per concern:
``app`` (assembly), ``guard`` (Host, Origin and Content-Type checks in front of every route),
``discovery``, ``resources`` (per-kind routes), ``watch`` (NDJSON watch streams), ``sse`` and ``v1``
(seed routes), ``errors`` (the one Status mapping), ``wire`` (bodies and responses), ``params``
(query parameters), ``schemas`` (OpenAPI models), ``health``, ``serving``, ``testing`` (a real
server in a thread).
"""

from joch.server.app import create_app as create_app
from joch.server.options import ServerOptions as ServerOptions
from joch.server.options import VersionInfo as VersionInfo
from joch.server.serving import serve as serve

__all__ = ["ServerOptions", "VersionInfo", "create_app", "serve"]
