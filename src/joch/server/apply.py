"""Server-side apply on the wire: ``PATCH`` with ``Content-Type: application/apply-patch+yaml``,
and the ``Update`` entries every other write records in ``metadata.managedFields``.

What ``kubectl apply --server-side``, ``kubectl diff --server-side``, the ``kubernetes`` client's
``server_side_apply`` and lightkube's ``Client.apply`` send: the applier's whole intent as one YAML
(or JSON) object, ``?fieldManager=NAME`` (required: a 400 without it, as the apiserver answers),
``?force=true`` to take fields from other managers, and ``?dryRun=All`` for a diff. The object is
created when it does not exist (201), otherwise merged with what is stored (200); both go through
admission like any write, so an apply is validated, defaulted and policy-checked the same way.
Field ownership is computed by ``joch.admission.ssa``; a field another manager owns with another
value is a 409 ``Conflict`` whose ``details.causes`` name each field (``reason:
FieldManagerConflict``) and whose message is the apiserver's (``Apply failed with 1 conflict:
conflict with "m" using joch.dev/v1alpha1: .spec.x``), which kubectl prints with its advice.

The apply reads the stored object outside the write's transaction and writes with its
``resourceVersion`` as precondition, retrying on a concurrent write, so ownership is always
computed against the object it replaces.

POST, PUT and non-apply PATCH record an ``Update`` entry for ``?fieldManager=``, or for the
User-Agent's product (``kubectl``) when none is given, as the apiserver does (``tracker``).
``force`` is only for apply: with another patch type it is a 400 (POST and PUT ignore it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Header, Query
from starlette.responses import Response

from joch.admission import apply as admission
from joch.admission import ssa
from joch.api import errors
from joch.api.errors import Cause
from joch.api.meta import now
from joch.api.registry import KindInfo
from joch.server import wire
from joch.server.options import ServerOptions
from joch.store.base import Obj, Store

APPLY_PATCH = "application/apply-patch+yaml"
APPLY_ATTEMPTS = 5


@dataclass(frozen=True)
class FieldManagement:
    """``?fieldManager=``, ``?force=`` and the User-Agent of a write."""

    manager: str | None = None
    force: bool | None = None
    user_agent: str | None = None


UNNAMED = FieldManagement()


async def field_management(
    manager: Annotated[str | None, Query(alias="fieldManager", description=(
        "who makes this change, recorded in metadata.managedFields; required for apply"))] = None,
    force: Annotated[bool | None, Query(alias="force", description=(
        "apply only: take the fields other managers own instead of failing with a conflict"))] = None,
    user_agent: Annotated[str | None, Header(alias="user-agent", include_in_schema=False)] = None,
) -> FieldManagement:
    return FieldManagement(manager, force, user_agent)


def is_apply(content_type: str | None) -> bool:
    return wire.media_type(content_type) == APPLY_PATCH


def _ignored(kind: KindInfo) -> tuple[str, ...]:
    return ("status",) if kind.status_model is not None else ()


def _with_managed(obj: Obj, managed: list[dict[str, Any]]) -> Obj:
    return {**obj, "metadata": {**obj["metadata"], "managedFields": managed}}


def _entries(obj: Obj | None, where: str) -> list[ssa.Entry]:
    try:
        return ssa.decode_managed(((obj or {}).get("metadata") or {}).get("managedFields"))
    except ssa.ManagedFieldsError as exc:
        raise errors.BadRequest(f"{where} {exc}", causes=[Cause(exc.field, str(exc))]) from None


def _manager(fields: FieldManagement, *, default: str | None) -> str:
    manager = fields.manager if fields.manager is not None else default
    if not manager:
        message = "fieldManager: Required value: is required for apply patch"
        raise errors.BadRequest(f'PatchOptions.meta.k8s.io "" is invalid: {message}; name the applier '
                                "with ?fieldManager=NAME (kubectl: --field-manager)",
                                causes=[Cause("fieldManager", "Required value: is required for apply patch",
                                              "FieldValueRequired")])
    problem = ssa.manager_problem(manager)
    if problem:
        raise errors.BadRequest(f"fieldManager: Invalid value: {problem}",
                                causes=[Cause("fieldManager", problem)])
    return manager


def tracker(kind: KindInfo, fields: FieldManagement, *, patch: bool = False, status: bool = False,
            ) -> admission.Tracker:
    """Records an ``Update`` entry for a create, replace or non-apply patch (``force`` is an
    apply option: a 400 on another patch, ignored elsewhere, as the apiserver has it); with
    ``status``, of the status subresource (only ``status`` counts; the request's managedFields do
    not)."""
    if patch and fields.force is not None:
        message = "force: Forbidden: may not be specified for non-apply patch"
        raise errors.BadRequest(message, causes=[Cause("force", message, "FieldValueForbidden")])
    manager = _manager(fields, default=ssa.manager_from_user_agent(fields.user_agent))

    def track_status(old: Obj | None, given: Obj, target: Obj) -> Obj:
        entries = ssa.update(_status_of(old or {}), _status_of(target), _entries(old, "the stored"),
                             manager=manager, api_version=kind.api_version, now=now(), subresource="status")
        return _with_managed(target, ssa.encode_managed(entries))

    def track(old: Obj | None, given: Obj, admitted: Obj) -> Obj:
        given_managed = (given.get("metadata") or {}).get("managedFields")
        if old is None and given_managed is None:  # a create that brings no managedFields
            return _with_managed(admitted, ssa.created(admitted, manager=manager, api_version=kind.api_version,
                                                       now=now(), ignore=_ignored(kind), lists=ssa.kind_lists(kind)))
        source = given if given_managed is not None else old
        entries = ssa.update(old, admitted, _entries(source, "the object's"), manager=manager,
                             api_version=kind.api_version, now=now(), ignore=_ignored(kind),
                             lists=ssa.kind_lists(kind))
        return _with_managed(admitted, ssa.encode_managed(entries))

    return track_status if status else track


def apply_patch(
    store: Store, kind: KindInfo, options: ServerOptions, namespace: str | None, name: str, body: bytes,
    dry_run: bool, fields: FieldManagement,
) -> Response:
    manager = _manager(fields, default=None)
    config = _configuration(kind, body, namespace, name)
    ignore = _ignored(kind)
    attempt = 0
    while True:
        attempt += 1
        try:
            live: Obj | None = store.get(kind, namespace, name)
        except errors.NotFound:
            live = None
        _check_preconditions(kind, config, live)
        try:
            applied = ssa.apply(live, config, _entries(live, "the stored"), manager=manager,
                                api_version=kind.api_version, force=bool(fields.force), now=now(), ignore=ignore,
                                lists=ssa.kind_lists(kind))
        except ssa.ApplyConflict as exc:
            raise _conflict(exc) from None
        managed = ssa.encode_managed(applied.entries)

        def track(old: Obj | None, given: Obj, admitted: Obj, managed: list[dict[str, Any]] = managed) -> Obj:
            return _with_managed(admitted, managed)

        # Written, created or deleted since it was read: compute ownership again. (A NotFound on a
        # create is something else, such as a namespace that does not exist: not retried.)
        retried = (errors.AlreadyExists,) if live is None else (errors.Conflict, errors.NotFound)
        try:
            if live is None:
                obj = ssa.rebuild(config, applied.tracked, ignore=ignore)
                created, warnings = admission.create_object(
                    store, kind, obj, namespace=namespace, dry_run=dry_run, options=options.admission,
                    track=track)
                return wire.json_response(_as_dry_run(created, None) if dry_run else created,
                                          status_code=201, warnings=warnings)
            obj = ssa.rebuild(live, applied.tracked, ignore=ignore)
            updated, warnings = admission.update_object(
                store, kind, obj, namespace=namespace, name=name, dry_run=dry_run, options=options.admission,
                track=track)
            return wire.json_response(_as_dry_run(updated, live) if dry_run else updated, warnings=warnings)
        except retried:
            if attempt >= APPLY_ATTEMPTS:
                raise


def apply_status_patch(
    store: Store, kind: KindInfo, namespace: str | None, name: str, body: bytes, dry_run: bool,
    fields: FieldManagement,
) -> Response:
    """Server-side apply of the status subresource (``kubectl apply --server-side
    --subresource=status``, lightkube's ``apply(..., subresource="status")``): only ``status`` of
    the configuration counts, ownership is recorded with ``subresource: status``, and the object
    must exist (404 otherwise)."""
    manager = _manager(fields, default=None)
    config = _configuration(kind, body, namespace, name)
    attempt = 0
    while True:
        attempt += 1
        live = store.get(kind, namespace, name)
        _check_preconditions(kind, config, live)
        try:
            applied = ssa.apply(_status_of(live), _status_of(config), _entries(live, "the stored"),
                                manager=manager, api_version=kind.api_version, force=bool(fields.force),
                                now=now(), subresource="status")
        except ssa.ApplyConflict as exc:
            raise _conflict(exc) from None
        managed = ssa.encode_managed(applied.entries)

        def track(old: Obj | None, given: Obj, target: Obj, managed: list[dict[str, Any]] = managed) -> Obj:
            return _with_managed(target, managed)

        obj = {**live, "status": applied.tracked.get("status") or {}}
        try:
            updated = admission.update_status(store, kind, obj, namespace=namespace, name=name, dry_run=dry_run,
                                              track=track)
        except errors.Conflict:
            if attempt >= APPLY_ATTEMPTS:
                raise
            continue
        return wire.json_response(_as_dry_run(updated, live) if dry_run else updated)


def _status_of(obj: Obj) -> Obj:
    return {"status": obj["status"]} if isinstance(obj.get("status"), dict) else {}


def _check_preconditions(kind: KindInfo, config: Obj, live: Obj | None) -> None:
    """A ``resourceVersion`` or ``uid`` in the configuration must be the stored object's, as for
    any write (on a create, admission refuses a ``resourceVersion``)."""
    if live is None:
        return
    for key in ("uid", "resourceVersion"):
        wanted, stored = config["metadata"].get(key), live["metadata"].get(key)
        if wanted and wanted != stored:
            name = live["metadata"]["name"]
            raise errors.Conflict(
                f"Operation cannot be fulfilled on {kind.resource} {name!r}: the configuration's "
                f"metadata.{key} is {wanted!r}, the stored object's is {stored!r}: the object has been "
                "modified; leave the field out, or apply your changes to the latest version",
                kind=kind.plural, name=name)


def _as_dry_run(obj: Obj, live: Obj | None) -> Obj:
    """A dry run's answer as the apiserver gives it: the resourceVersion of the object it read
    (none for a create), since nothing was stored; ``kubectl diff`` then shows only real changes."""
    metadata = {k: v for k, v in obj["metadata"].items() if k != "resourceVersion"}
    if live is not None:
        metadata["resourceVersion"] = live["metadata"]["resourceVersion"]
    return {**obj, "metadata": metadata}


def _conflict(exc: ssa.ApplyConflict) -> errors.Conflict:
    causes = [Cause(ssa.path_string(c.path), f"conflict with {c.owner}", "FieldManagerConflict")
              for c in exc.conflicts]
    return errors.Conflict(exc.message, causes=causes)


def _configuration(kind: KindInfo, body: bytes, namespace: str | None, name: str) -> Obj:
    """The apply configuration in the body: one object of the URL's kind, naming it or not."""
    config = wire.decode_object(body, "application/yaml")
    for key, expected in (("apiVersion", kind.api_version), ("kind", kind.kind)):
        value = config.get(key)
        if not value:
            message = f"{key}: Required value: an apply configuration must say {key}: {expected}"
            raise errors.BadRequest(message, causes=[Cause(key, message, "FieldValueRequired")])
        if value != expected:
            raise errors.BadRequest(f"the body's {key} {value!r} does not match the URL, which serves {expected!r}",
                                    causes=[Cause(key, f"must be {expected!r}")])
    metadata = config.get("metadata")
    if not isinstance(metadata, dict):
        metadata = {}
    if metadata.get("managedFields") is not None:
        message = "metadata.managedFields must be nil in an apply configuration: the server records them"
        raise errors.BadRequest(message, causes=[Cause("metadata.managedFields", message, "FieldValueForbidden")])
    for key, wanted in (("name", name), ("namespace", namespace if kind.namespaced else None)):
        given = metadata.get(key)
        if wanted is not None and given not in (None, "") and given != wanted:
            raise errors.BadRequest(f"the {key} of the provided object ({given!r}) does not match the {key} "
                                    f"in the URL ({wanted!r})", kind=kind.plural, name=name)
    metadata = {**metadata, "name": name}
    if kind.namespaced and namespace:
        metadata["namespace"] = namespace
    return {**config, "metadata": metadata}
