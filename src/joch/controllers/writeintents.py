"""Sending write-back: one ``WriteIntent`` at a time, through its approval gate, exactly once.

The intents are decided by ``joch.controllers.writeback.WriteBackController``; this module sends them,
and holds what both sides share (the comment marker, what a send hashes, reading a run's artifacts).

``WriteIntentController`` (primary WriteIntent, secondary Approval) sends one intent::

      (new) ──► PendingApproval ──► ReadyToSend ──► Sending ──► Succeeded
        │             └──► Rejected (denied, expired)   │  ▲ └──► Retrying ──► Sending …
        └──► Rejected (a Policy denies)                 │  └── a comment whose body changed
                                                        └──► Failed (not retryable, or maxAttempts)

  A new intent asks the Policies (phase ``writeBack``: ``joch.policy.decisions.write_back``): ``deny``
  rejects it; ``requireApproval`` — or ``spec.requiresApproval`` — creates the Approval named after
  the intent (action ``write-back``, ``runRef`` the run, owned by the intent: the run controller only
  ever looks at the run's own ``<run>-dispatch`` Approval, so it never mistakes this one for a
  dispatch decision). ``joch approve``/``joch deny`` decide it like any other.

  **Nothing is written twice.** The controller records ``Sending`` (and the attempt) before it
  touches the tracker, and every send starts by looking for what an earlier, interrupted send may
  have left: a comment is looked up by its marker before one is created (or edited by its recorded
  id), a pull request by its branch before one is opened, and the branch push is a forced push of
  a commit that is the same on every retry. A server killed mid-send finds the intent ``Sending``
  and adopts what is there. A retryable failure (rate limit, 5xx, network) waits ``5 s · 2^n``
  (at most 10 minutes, with jitter, and never before the tracker's ``retry_at``) until
  ``maxAttempts``; others fail at once. Every send is audited (verb ``write``, kind WriteIntent,
  ``comment on github:acme/web#12``). Credentials are read from the Secret at the last moment
  and never reach status, audit or errors (``TrackerError`` messages name the Secret, not its value).

What bit us, and holds now:

* The caches lag the store. A send is decided from the *stored* intent (a cache still showing
  ``Sending`` after this controller wrote ``Retrying`` sent again, ahead of the backoff), and the
  ImplementationSource is read from the store when it is used (a source a moment behind in its
  cache failed a write for good).
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import logging
import random
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from joch.api import errors, kinds
from joch.api.audit import AuditEntry
from joch.api.identity import CONTROLLER
from joch.api.integrations import IMPLEMENTATION_SOURCE, WRITE_INTENT, WriteTarget
from joch.api.meta import epoch, now, set_condition
from joch.api.registry import KindInfo
from joch.controllers import approvals, events
from joch.controllers.base import Context, Controller, Key, Mapper, Result
from joch.integrations import gitpush, trackers
from joch.integrations.base import SecretLookup, Tracker, TrackerError
from joch.policy import decisions
from joch.runtime import base as rt
from joch.store.base import Obj

logger = logging.getLogger("joch.controllers.writeintents")

COMPONENT = "joch-writeback-controller"
ACTION = "write-back"
BACKOFF_BASE = 5.0
BACKOFF_CAP = 600.0
JITTER = 0.2
PATCH_LIMIT = 64 * 1024 * 1024
COMMIT_AUTHOR = ("Joch", "joch@users.noreply.joch.dev")
NORMAL: Literal["Normal", "Warning"] = "Normal"
WARNING: Literal["Normal", "Warning"] = "Warning"


def marker(run_uid: str) -> str:
    return f"<!-- joch:run:{run_uid} -->"


def content_hash(spec: Mapping[str, Any]) -> str:
    """What a send wrote, hashed: a comment whose body changed is sent again."""
    kind = spec.get("type")
    if kind == "comment":
        text = str(spec.get("body") or "")
    elif kind == "link":
        text = f'{spec.get("url")}\0{spec.get("title") or ""}'
    else:
        pr = spec.get("pullRequest") or {}
        text = "\0".join(str(pr.get(k) or "") for k in ("branch", "baseCommit", "base", "title", "body"))
    return hashlib.sha256(text.encode()).hexdigest()


def secret_lookup(store: Any, namespace: str) -> SecretLookup:
    """Secret values of ``namespace``, read (decrypted) when a client asks for them."""

    def lookup(name: str, key: str) -> str:
        try:
            secret = store.reveal(kinds.SECRET, namespace, name)
        except errors.NotFound:
            raise TrackerError("MissingSecret", f'Secret "{name}" not found in namespace "{namespace}": create it '
                                                f'with the key "{key}"') from None
        data = (secret.get("spec") or {}).get("data") or {}
        if key not in data:
            raise TrackerError("MissingSecret", f'Secret "{name}" in namespace "{namespace}" has no key "{key}": '
                                                "add it, or point the source at the right key")
        return base64.b64decode(str(data[key]).replace("\n", "")).decode("utf-8")

    return lookup


def owned(obj: Obj, owner: Obj) -> bool:
    uid = owner["metadata"].get("uid")
    return any(isinstance(r, dict) and r.get("uid") == uid and r.get("controller") is True
               for r in (obj.get("metadata") or {}).get("ownerReferences") or [])


def read_artifact(runtime: rt.Runtime, run: Obj, name: str, limit: int) -> bytes | None:
    """The run's artifact ``name`` (at most ``limit`` bytes), or None when it has none."""
    status = run.get("status") or {}
    ref = rt.own_ref(status.get("runtimeRef"), str(run["metadata"].get("uid") or ""), status.get("attempt"))
    if ref is None or ref.get("pending"):
        return None
    try:
        _, stream = runtime.open_artifact(ref, name)
    except KeyError:
        return None
    except (ValueError, OSError) as exc:
        logger.warning("run %s: cannot read artifact %s: %s", run["metadata"]["name"], name, exc)
        return None
    with stream:
        return stream.read(limit)


# --- WriteIntentController -------------------------------------------------------------------------

class WriteIntentController(Controller):
    """Sends each WriteIntent once, through its approval gate; see the module docstring."""

    name = "writeintents"
    kind = WRITE_INTENT

    def __init__(self, runtime: rt.Runtime, *, rng: random.Random | None = None, workdir: Path | None = None) -> None:
        self.runtime = runtime
        self.rng = rng or random.Random()  # noqa: S311 - jitter, not cryptography
        self.workdir = workdir
        self._ctx: Context | None = None

    @property
    def ctx(self) -> Context:
        if self._ctx is None:
            raise RuntimeError("WriteIntentController used before setup()")
        return self._ctx

    def secondary(self) -> Sequence[tuple[KindInfo, Mapper]]:
        return ((kinds.APPROVAL, _intent_of_approval),)

    def setup(self, ctx: Context) -> None:
        self._ctx = ctx
        ctx.cache(kinds.APPROVAL)

    def reconcile(self, key: Key) -> Result | None:
        intent = self.ctx.cache(WRITE_INTENT).get(key.namespace, key.name)
        if intent is None or intent["metadata"].get("deletionTimestamp"):
            return None
        status = intent.get("status") or {}
        phase = status.get("phase")
        if phase is None:
            return self._gate(intent)
        if phase == "PendingApproval":
            return self._pending(intent)
        if phase == "Retrying":
            due = epoch(status.get("nextAttemptAt"))
            left = (due or 0.0) - self.ctx.clock.time()
            if left > 0:
                return Result(requeue_after=left)
        if phase in ("ReadyToSend", "Retrying"):
            return self._begin(intent)
        if phase == "Sending":
            return self._send(intent)
        if phase == "Succeeded" and intent["spec"].get("type") == "comment" \
                and status.get("sentHash") != content_hash(intent["spec"]):
            return self._begin(intent, again=True)
        return None

    # --- the gate ----------------------------------------------------------------------------------

    def _run(self, intent: Obj) -> Obj | None:
        try:
            run = self.ctx.store.get(kinds.AGENT_RUN, intent["metadata"].get("namespace"),
                                     intent["spec"]["runRef"]["name"])
        except errors.NotFound:
            return None
        return run if run["metadata"].get("uid") == intent["spec"].get("runUid") else None

    def _gate(self, intent: Obj) -> Result | None:
        run = self._run(intent)
        if run is None:
            return None  # its run is gone: there is nothing to write for
        outcomes = decisions.write_back(decisions.StoreSource(self.ctx.store), intent, run)
        status = dict(intent.get("status") or {})
        what = describe(intent)
        denied = next((o for o in outcomes if o.action == "deny"), None)
        if denied is not None:
            status.update(phase="Rejected", lastError=denied.reason)
            status["conditions"] = set_condition(list(status.get("conditions") or []), {
                "type": "Rejected", "status": "True", "reason": "PolicyDenied", "message": denied.reason})
            with self.ctx.store.transaction() as w:
                out = w.update_status(WRITE_INTENT, {**intent, "status": status})
                events.record(w, out, reason="PolicyDenied", message=f"{what}: {denied.reason}", type="Warning",
                              component=COMPONENT)
                w.audit(self._audit(intent, "denied", f"{what}: {denied.reason}"))
            return None
        with self.ctx.store.transaction() as w:
            for warning in (o for o in outcomes if o.action == "warn"):
                events.record(w, intent, reason="PolicyWarning", message=warning.reason, type="Warning",
                              component=COMPONENT)
            asked = next((o for o in outcomes if o.action == "requireApproval"), None)
            if intent["spec"].get("requiresApproval") or asked is not None:
                name = intent["metadata"]["name"]
                status.update(phase="PendingApproval", approvalRef=name)
                status["conditions"] = set_condition(list(status.get("conditions") or []), {
                    "type": "AwaitingApproval", "status": "True", "reason": "ApprovalRequested",
                    "message": f"waiting for Approval {name}: joch approve approval {name}"})
                out = w.update_status(WRITE_INTENT, {**intent, "status": status})
                namespace = intent["metadata"].get("namespace") or ""
                existing = self.ctx.cache(kinds.APPROVAL).get(namespace, name)
                if existing is not None and not owned(existing, intent):
                    # an earlier intent's of this name (an earlier run's): its decision is not this write's
                    w.delete(kinds.APPROVAL, namespace, name, uid=existing["metadata"]["uid"])
                    existing = None
                if existing is None:
                    approval = w.create(kinds.APPROVAL, self._approval(intent, run, asked))
                    w.update_status(kinds.APPROVAL, {**approval, "status": {"phase": "Pending"}})
                events.record(w, out, reason="AwaitingApproval", message=f"{what}: approval {name} requested",
                              component=COMPONENT)
            else:
                status.update(phase="ReadyToSend")
                w.update_status(WRITE_INTENT, {**intent, "status": status})
        return None

    def _approval(self, intent: Obj, run: Obj, asked: Any) -> Obj:
        name = intent["metadata"]["name"]
        reason = (f'Policy {asked.policy.ref} rule "{asked.rule.name}" requires approval: {asked.message}'
                  if asked is not None else "the write-back settings require approval")
        agent = ((run.get("spec") or {}).get("agentRef") or {}).get("name") or ""
        body = approvals.for_run(run, name, agent, action=ACTION, reason=f"{describe(intent)}: {reason}",
                                 separation_of_duties=bool(asked is not None and asked.policy.separation_of_duties),
                                 policy_ref=({"namespace": asked.policy.namespace, "name": asked.policy.name,
                                              "rule": asked.rule.name} if asked is not None else None))
        m = intent["metadata"]
        body["metadata"]["ownerReferences"] = [{"apiVersion": WRITE_INTENT.api_version, "kind": WRITE_INTENT.kind,
                                                "name": m["name"], "uid": m["uid"], "controller": True}]
        return body

    def _pending(self, intent: Obj) -> Result | None:
        status = dict(intent.get("status") or {})
        namespace = intent["metadata"].get("namespace") or ""
        name = status.get("approvalRef") or intent["metadata"]["name"]
        approval = self.ctx.cache(kinds.APPROVAL).get(namespace, name)
        if approval is not None and not owned(approval, intent):
            # Left by an earlier intent of this name (an earlier run's): its decision is not this
            # write's. It goes, and the next look asks again.
            self.ctx.store.delete(kinds.APPROVAL, namespace, name, uid=approval["metadata"]["uid"])
            return None
        if approval is None:
            run = self._run(intent)
            if run is not None:
                # Asked again: a Policy's separation of duties (and its policyRef) must survive a
                # deleted Approval, or its requester could delete it and approve the new one.
                outcomes = decisions.write_back(decisions.StoreSource(self.ctx.store), intent, run)
                asked = next((o for o in outcomes if o.action == "requireApproval"), None)
                try:
                    self.ctx.store.create(kinds.APPROVAL, self._approval(intent, run, asked))
                except errors.AlreadyExists:
                    pass
            return None
        decision = (approval.get("status") or {}).get("phase")
        who = (approval.get("status") or {}).get("decidedBy") or "someone"
        why = (approval.get("status") or {}).get("reason")
        what = describe(intent)
        if decision == "Approved":
            status.update(phase="ReadyToSend")
            status["conditions"] = set_condition(list(status.get("conditions") or []), {
                "type": "AwaitingApproval", "status": "False", "reason": "Approved", "message": f"approved by {who}"})
            message, kind = f"{what}: approval {name} approved by {who}", NORMAL
        elif decision in ("Denied", "Expired"):
            if decision == "Denied":
                said = f"write-back Approval {name} denied by {who}" + (f": {why}" if why else "")
            else:
                said = f"write-back Approval {name} expired at {approval['spec'].get('expiresAt')} without a decision"
            status.update(phase="Rejected", lastError=said)
            status["conditions"] = set_condition(list(status.get("conditions") or []), {
                "type": "AwaitingApproval", "status": "False", "reason": decision, "message": said})
            message, kind = f"{what}: {said}", WARNING
        else:
            return None
        with self.ctx.store.transaction() as w:
            out = w.update_status(WRITE_INTENT, {**intent, "status": status})
            events.record(w, out, reason=f"Approval{decision}", message=message, type=kind, component=COMPONENT)
        return None

    # --- sending -----------------------------------------------------------------------------------

    def _begin(self, intent: Obj, *, again: bool = False) -> Result | None:
        """Records ``Sending`` (and the attempt) before anything leaves: a crash from here on is
        recovered by adopting what the tracker has."""
        status = dict(intent.get("status") or {})
        status.update(phase="Sending", attempts=(0 if again else int(status.get("attempts") or 0)) + 1)
        status.pop("nextAttemptAt", None)
        self.ctx.store.update_status(WRITE_INTENT, {**intent, "status": status})
        return None

    def _send(self, cached: Obj) -> Result | None:
        if not self.ctx.leading():
            return None
        # The cache may not have seen this controller's last write yet (a Retrying written a moment
        # ago): what is sent is decided from the stored intent, never from a stale Sending.
        try:
            intent = self.ctx.store.get(WRITE_INTENT, cached["metadata"].get("namespace"), cached["metadata"]["name"])
        except errors.NotFound:
            return None
        if (intent.get("status") or {}).get("phase") != "Sending" or intent["metadata"].get("deletionTimestamp"):
            return None
        what = describe(intent)
        spec = intent["spec"]
        try:
            source = self._source(intent)
            tracker = trackers.open_tracker(source, secret_lookup(self.ctx.store, intent["metadata"].get("namespace")
                                                                   or ""), self.ctx.clock.time)
            sent = self._deliver(tracker, intent)
        except TrackerError as exc:
            return self._failed(intent, exc)
        except Exception as exc:  # anything else must still count the attempt and back off
            # Left alone it would leave the intent Sending, sent again at once and forever with no
            # attempt counted. Only its type reaches status: its text may hold anything.
            logger.exception("%s: WriteIntent %s/%s: unexpected error while sending", what,
                             intent["metadata"].get("namespace"), intent["metadata"]["name"])
            return self._failed(intent, TrackerError(
                "Unavailable", f"unexpected {type(exc).__name__} while sending; see the Joch server's log"))
        fresh = self.ctx.store.get(WRITE_INTENT, intent["metadata"].get("namespace"), intent["metadata"]["name"])
        status = dict(fresh.get("status") or {})
        status.update(phase="Succeeded", sentAt=now(), sentHash=content_hash(spec), **sent)
        status.pop("lastError", None)
        status.pop("nextAttemptAt", None)
        status["conditions"] = set_condition(list(status.get("conditions") or []), {
            "type": "Sent", "status": "True", "reason": "Sent", "message": f"{what}: {status.get('url') or 'sent'}"})
        with self.ctx.store.transaction() as w:
            out = w.update_status(WRITE_INTENT, {**fresh, "status": status})
            events.record(w, out, reason="Sent", message=f"{what}: {status.get('url') or 'sent'}", component=COMPONENT)
            w.audit(self._audit(intent, "allowed", what))
        return None

    def _source(self, intent: Obj) -> Obj:
        namespace = intent["metadata"].get("namespace") or ""
        name = intent["spec"]["target"]["sourceRef"]["name"]
        # From the store: a source applied a moment ago may not be in the cache yet.
        source = read_obj(self.ctx.store, IMPLEMENTATION_SOURCE, namespace, name)
        if source is None:
            raise TrackerError("NotFound", f'ImplementationSource "{name}" not found in namespace "{namespace}": '
                                           f'WriteIntent {intent["metadata"]["name"]} writes with its credentials')
        return source

    def _deliver(self, tracker: Tracker, intent: Obj) -> dict[str, Any]:
        """Sends the intent, adopting what an interrupted send left; the status fields to record."""
        spec = intent["spec"]
        status = intent.get("status") or {}
        target = _target(spec["target"])
        kind = spec["type"]
        if kind == "comment":
            body = str(spec.get("body") or "")
            existing_id = status.get("externalId")
            if existing_id:
                comment = tracker.update_comment(target, str(existing_id), body)
            else:
                found = tracker.find_comment(target, marker(spec["runUid"]))
                if found is None:
                    comment = tracker.create_comment(target, body)
                elif found.body != body:
                    comment = tracker.update_comment(target, found.id, body)
                else:
                    comment = found
            return {"externalId": comment.id, "url": comment.url}
        if kind == "link":
            attach = getattr(tracker, "attach_link", None)
            if attach is None:
                raise TrackerError("Invalid", f"{tracker.provider} issues take no links; the WriteIntent "
                                              f'{intent["metadata"]["name"]} cannot be sent')
            external = attach(target, str(spec.get("url")), str(spec.get("title") or spec.get("url")))
            return {"externalId": str(external), "url": spec.get("url")}
        return self._pull_request(tracker, intent)

    def _pull_request(self, tracker: Any, intent: Obj) -> dict[str, Any]:
        spec = intent["spec"]
        pr = spec.get("pullRequest") or {}
        name = intent["metadata"]["name"]
        if not pr:
            raise TrackerError("Invalid", f"WriteIntent {name}: spec.pullRequest is not set")
        git_url = str(pr["gitUrl"])
        repository = tracker.repository()
        if git_url.startswith("https://") and _repo_key(git_url) != _repo_key(repository.clone_url):
            # The token goes with an https push: only ever to the source's own repository, never to
            # whatever host a run's (user-written) execution coordinates name.
            raise TrackerError("Invalid", f"WriteIntent {name}: the run's repository {_safe_url(git_url)} is not "
                                          f"{repository.owner}/{repository.name}, the repository of "
                                          f'ImplementationSource "{spec["target"]["sourceRef"]["name"]}" that gets '
                                          "the pull request; run the agent on that repository, or set "
                                          "writeBack.pullRequest.sourceRef to the source of the run's repository")
        # This run's pull request carries its marker: one left on the branch by an earlier run of the
        # same name (closed, merged) is not adopted as this run's.
        mark = marker(spec["runUid"])
        body = f'{str(pr["body"]).replace("joch:run:", "joch:run&#58;").rstrip()}\n\n{mark}'
        found = tracker.find_pull_request(pr["branch"], marker=mark)
        commit = (intent.get("status") or {}).get("commit")
        if found is None:
            run = self._run(intent)
            patch = read_artifact(self.runtime, run, "changes.patch", PATCH_LIMIT) if run is not None else None
            if not patch:
                raise TrackerError("NotFound", f'WriteIntent {name}: the changes.patch of run '
                                               f'"{spec["runRef"]["name"]}" is gone (its files were removed?); '
                                               "nothing to push")
            base = pr.get("base") or repository.default_branch
            token = tracker.token() if git_url.startswith("https://") else None
            with tempfile.TemporaryDirectory(prefix="joch-push-", dir=self.workdir) as tmp:
                commit = gitpush.push_patch(
                    git_url=git_url, base_commit=pr["baseCommit"], fetch_ref=base, patch=patch, branch=pr["branch"],
                    message=f'{pr["title"]}\n\nJoch run {spec["runRef"]["name"]}', author_name=COMMIT_AUTHOR[0],
                    author_email=COMMIT_AUTHOR[1], date=pr["authorDate"], token=token, workdir=Path(tmp))
            # Found again: a PR opened for the branch between the first look and the push is adopted.
            found = tracker.find_pull_request(pr["branch"], marker=mark) or tracker.create_pull_request(
                head=pr["branch"], base=base, title=pr["title"], body=body, draft=bool(pr.get("draft")))
        out: dict[str, Any] = {"externalId": str(found.number), "url": found.url}
        if commit:
            out["commit"] = commit
        return out

    def _failed(self, intent: Obj, exc: TrackerError) -> Result | None:
        fresh = self.ctx.store.get(WRITE_INTENT, intent["metadata"].get("namespace"), intent["metadata"]["name"])
        status = dict(fresh.get("status") or {})
        attempts = int(status.get("attempts") or 1)
        limit = int(intent["spec"].get("maxAttempts") or 8)
        what = describe(intent)
        message = f"{exc.reason}: {exc.message}"
        status["lastError"] = message
        requeue: float | None = None
        if exc.retryable and attempts < limit:
            clock = self.ctx.clock.time()
            delay = min(BACKOFF_CAP, BACKOFF_BASE * 2 ** (attempts - 1))
            delay = min(BACKOFF_CAP, delay * self.rng.uniform(1 - JITTER, 1 + JITTER))
            if exc.retry_at is not None:
                delay = max(delay, exc.retry_at - clock)
            status.update(phase="Retrying", nextAttemptAt=_rfc3339(clock + delay))
            reason, said, requeue = "Retrying", f"{what}: attempt {attempts} of {limit} failed ({message}); " \
                                                f"retrying at {status['nextAttemptAt']}", delay
        else:
            status.update(phase="Failed")
            status.pop("nextAttemptAt", None)
            why = f"after {attempts} attempts" if exc.retryable else "not retryable"
            reason, said = "Failed", f"{what}: failed {why}: {message}"
        status["conditions"] = set_condition(list(status.get("conditions") or []), {
            "type": "Sent", "status": "False", "reason": exc.reason, "message": message})
        with self.ctx.store.transaction() as w:
            out = w.update_status(WRITE_INTENT, {**fresh, "status": status})
            events.record(w, out, reason=reason, message=said, type="Warning", component=COMPONENT)
            w.audit(self._audit(intent, "allowed", f"{what} failed: {message}"))
        return Result(requeue_after=requeue) if requeue is not None else None

    def _audit(self, intent: Obj, decision: Any, reason: str) -> AuditEntry:
        m = intent["metadata"]
        return AuditEntry(verb="write", kind=WRITE_INTENT.kind, namespace=m.get("namespace"), name=m["name"],
                          decision=decision, reason=reason, actor=CONTROLLER.name, groups=CONTROLLER.groups)


def describe(intent: Obj) -> str:
    """``comment on github:acme/web#12``, ``pull request on github:acme/web``, ``link on linear:ENG-12``."""
    spec = intent.get("spec") or {}
    t = spec.get("target") or {}
    if t.get("provider") == "github":
        where = f'github:{t.get("owner")}/{t.get("repo")}' + (f'#{t["number"]}' if t.get("number") else "")
        if spec.get("type") == "pullRequest":
            where = f'github:{t.get("owner")}/{t.get("repo")}'
    else:
        where = f'linear:{t.get("identifier") or t.get("issueId")}'
    what = {"comment": "comment", "pullRequest": "pull request", "link": "link"}.get(str(spec.get("type")), "write")
    return f"{what} on {where}"


def _repo_key(url: str) -> tuple[str, str, str]:
    """An https git URL compared as (scheme, host, path without ``.git``), case-insensitively."""
    parts = urlsplit(url.strip())
    path = parts.path.rstrip("/").lower().removesuffix(".git")
    return parts.scheme.lower(), (parts.hostname or "").lower(), path


def _safe_url(url: str) -> str:
    """``url`` without any user or password in it (it goes into status)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return parts._replace(netloc=netloc).geturl()


def _target(raw: Mapping[str, Any]) -> WriteTarget:
    return WriteTarget.model_validate(raw)


def _intent_of_approval(approval: Obj) -> Iterable[Key]:
    for ref in (approval.get("metadata") or {}).get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("kind") == WRITE_INTENT.kind and ref.get("controller") is True \
                and ref.get("name"):
            yield Key(approval["metadata"].get("namespace") or "", str(ref["name"]))


def read_obj(store: Any, kind: KindInfo, namespace: str, name: str) -> Obj | None:
    try:
        found: Obj = store.get(kind, namespace, name)
    except errors.NotFound:
        return None
    return found


def _rfc3339(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
