"""Schemathesis against ``/openapi.json`` of a real server, on SQLite and on Postgres: no request it
generates from the document (valid or not) may get a 5xx, or an answer the document contradicts
(status code, content type, body schema).

Bounded so ``make test`` stays fast on a loaded 2-core machine: a few valid and a few invalid
examples per operation, no shrinking, derandomized (the same cases every run: a failure is
reproducible, never flaky), no coverage or stateful phase. Every kind's REST routes are generated
by one function (``resources.install``), so they are exercised for the two kinds with the largest
schemas; the same malformed body on every kind is ``test_server_bad_bodies``.
``JOCH_SCHEMATHESIS_FULL=1`` runs every operation with the coverage phase too (the boundary values
of every parameter and field, ``{"metadata": [null]}`` and the like): minutes, not seconds, so not
by default. Long-lived streams are kept short: list routes are
asked with ``watch=false`` (a watch stream is several JSON documents, which the conformance check
cannot parse; ``test_server_lists_and_watches`` covers them), the Server-Sent Events route with
``timeoutSeconds=1``. Requests go to 127.0.0.1, the only Host a local server should answer.
"""

from __future__ import annotations

import os
import time
from typing import Any

import pytest
import schemathesis
from schemathesis import Case, GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.pytest.lazy import get_all_tests
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from joch.api import REGISTRY
from joch.server.testing import LiveServer

SAMPLED_KINDS = frozenset({"agentruns", "approvals"})
SKIPPED_PLURALS = frozenset(info.plural for info in REGISTRY) - SAMPLED_KINDS
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
FULL = os.environ.get("JOCH_SCHEMATHESIS_FULL") == "1"
MAX_EXAMPLES = 5
SSE = "/v1/resources/watch"


def call_and_validate(case: Case) -> None:
    query: dict[str, Any] = dict(case.query or {})
    if any(p.name == "watch" for p in case.operation.query):
        query["watch"] = "false"
    if case.path == SSE:
        query["timeoutSeconds"] = "1"
    case.query = query
    case.call_and_validate(checks=CHECKS, timeout=30)


@pytest.mark.timeout(3600 if FULL else 240)
def test_the_server_answers_as_its_openapi_document_says(server: LiveServer) -> None:
    # The operations are run one by one here rather than by ``schema.parametrize()``, whose lazy
    # loader does not run under pytest 9 (it rewrites ``request.node._nodeid``).
    schema = schemathesis.openapi.from_url(f"{server.url}/openapi.json", timeout=10)
    schema.config.generation.update(modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE],
                                    max_examples=MAX_EXAMPLES, no_shrink=True, deterministic=True)
    schema.config.phases.update(phases=["examples", "coverage", "fuzzing"] if FULL else ["examples", "fuzzing"])
    failures: list[str] = []
    operations = 0
    started = time.monotonic()
    for result in get_all_tests(schema=schema, test_func=call_and_validate, settings=None, given_kwargs=None):
        operation, run = result.ok()
        if not FULL and operation.path.startswith("/apis/") and SKIPPED_PLURALS & set(operation.path.split("/")):
            continue
        operations += 1
        try:
            run()
        except (Exception, FailureGroup) as exc:  # noqa: BLE001 - report every failing operation, not the first
            failures.append(f"{operation.label}: {exc}"[:3000])
    assert operations > 30
    assert not failures, f"{len(failures)} of {operations} operations failed:\n\n" + "\n\n".join(failures)
    print(f"{operations} operations in {time.monotonic() - started:.0f}s")
