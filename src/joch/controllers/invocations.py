"""What the run controller hands the runner besides the rendered command, and what it takes back.

* ``git_source``: the run's repository coordinates as the runtime takes them (a relative path is the
  controller's working directory's, as the quickstart's ``url: .``).
* ``runner_fields``: the ``RunnerSpec`` fields that come from the provider's policies (config files,
  output format, success and patch policies, version arguments) and the Agent's network.
* ``resume_of``: the ``Resume`` an attempt about to start continues, as decided when the previous
  attempt ended (``status.session``).
* ``note_runtime_facts``: what the runner recorded of an attempt (``RunState``: invocation, base
  commit, sandbox, session, omitted files) into the run's status.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from joch.compiler import manifest as compiler
from joch.compiler import render
from joch.runtime import base as rt
from joch.runtime.workspace import scp_like
from joch.store.base import Obj


def git_source(run: Obj) -> rt.GitSource | None:
    git = (((run["spec"].get("execution") or {}).get("coordinates") or {}).get("git"))
    if not git:
        return None
    return rt.GitSource(url=local_url(git["url"]), ref=git.get("ref") or "HEAD", path=git.get("path") or ".")

def local_url(url: str) -> str:
    """A relative repository path names a directory relative to the controller's working directory
    (the quickstart's ``url: .``); URLs, scp-style ``[user@]host:path`` (git's rule, user or not) and
    ``transport::address`` are left alone, for the runner to use or refuse."""
    if "://" in url or os.path.isabs(url) or scp_like(url) or "::" in url:
        return url
    return os.path.abspath(url)

def runner_fields(invocation: render.Invocation, compiled: compiler.Compiled) -> dict[str, Any]:
    """The ``RunnerSpec`` fields that come from the provider's policies and the Agent's network."""
    success, patch = invocation.success, invocation.patch
    network = (((compiled.manifest or {}).get("spec") or {}).get("security") or {}).get("network") or {}
    max_file = patch.get("maxFileBytes")
    return {
        "config_files": tuple(rt.ConfigFile(path, content, mode) for path, content, mode in invocation.config_files),
        "output_format": invocation.output_format,
        "success": rt.SuccessPolicy(require_changes=bool(success.get("requireChanges", False)),
                                    failure_patterns=tuple(success.get("failurePatterns") or ()),
                                    required_artifacts=tuple(success.get("requiredArtifacts") or ()),
                                    agent_result=bool(success.get("agentResult", True))),
        "patch": rt.PatchPolicy(exclude=tuple(patch.get("exclude") or ()),
                                max_file_bytes=int(max_file) if isinstance(max_file, int) else None),
        "version_args": tuple(invocation.version_args),
        "network": rt.Network(mode=network.get("mode") or "on", allow=tuple(network.get("allow") or ())),
        "manifest_hash": compiled.hash,
    }

def resume_of(run: Obj, attempt: int, manifest: Mapping[str, Any]) -> rt.Resume | None:
    """The ``Resume`` of the attempt about to start, as decided when the previous one ended
    (``status.session`` names this attempt and the one it resumes), while the provider is resumable."""
    session = (run.get("status") or {}).get("session") or {}
    provider = (manifest.get("spec") or {}).get("provider") or {}
    earlier = session.get("resumedFromAttempt")
    if (attempt > 1 and provider.get("resumable") and session.get("attempt") == attempt and session.get("id")
            and isinstance(earlier, int) and 1 <= earlier < attempt):
        return rt.Resume(attempt=earlier, session_id=str(session["id"]))
    return None

def note_runtime_facts(status: dict[str, Any], state: rt.RunState) -> None:
    """What the runner recorded of the attempt — ``invocation``, ``baseCommit``, ``sandbox``,
    ``session``, ``omitted`` — into ``status`` (those it has not recorded yet are left as they are).
    None of it holds a secret value: the runner redacts argv and records only env names."""
    attempt = status.get("attempt")
    if state.invocation is not None:
        inv = state.invocation
        status["invocation"] = _present({"argv": list(inv.argv), "env": list(inv.env), "executable": inv.executable,
                                         "version": inv.version, "sha256": inv.sha256})
    if state.base_commit:
        status["baseCommit"] = state.base_commit
    if state.sandbox is not None:
        box = state.sandbox
        status["sandbox"] = _present({"mode": box.mode, "user": box.user, "network": box.network,
                                      "reason": box.reason})
    if state.session is not None and (state.session.id or state.session.resumed_from):
        before = status.get("session") or {}
        resumed = state.session.resumed_from
        if resumed is None and before.get("attempt") == attempt:
            resumed = before.get("resumedFromAttempt")  # decided here when the attempt was queued
        status["session"] = _present({"id": state.session.id, "attempt": attempt, "resumedFromAttempt": resumed})
    if state.omitted:
        status["omitted"] = [{"path": o.path, "size": o.size, "message": o.message} for o in state.omitted]

def _present(values: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}
