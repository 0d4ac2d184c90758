"""``joch edit``, ``joch patch`` and ``joch label``: changing one object in place, as kubectl does.

``edit`` writes the object as YAML (or JSON) to a temporary file, opens ``$JOCH_EDITOR``,
``$KUBE_EDITOR`` or ``$EDITOR`` (default ``vi``; split like a shell would, never run through one)
and replaces the object with what was saved (``PUT`` with the ``resourceVersion`` read, so a change
made meanwhile is a conflict, not lost). A file saved unchanged is "Edit cancelled". When the saved
text does not parse, or the server rejects it, the editor opens again on the text saved, the error
written as comments at the top — kubectl's loop; saving that again without a change ends it with the
error, exit code of the error, and the path of a copy of the edits.

``patch`` sends ``-p`` (JSON, or YAML, as kubectl accepts) as a merge patch (RFC 7386, the default:
Joch's kinds are custom resources, which have no strategic merge) or, with ``--type json``, a JSON
patch (RFC 6902). It prints ``patched``, or ``patched (no change)`` when the object's
``resourceVersion`` did not move.

``label`` adds (``k=v``), changes (``k=v --overwrite``) and removes (``k-``) labels with a merge
patch that carries the ``resourceVersion`` read, so it never overwrites a concurrent change. A key
that has another value already is refused without ``--overwrite``, naming the value, as kubectl does.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import typer

from joch.api import errors
from joch.cli import printers
from joch.cli.client import Client
from joch.cli.resolve import ResourceType

Obj = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
PATCH_TYPES = {"merge": MERGE_PATCH, "json": JSON_PATCH}
EDITOR_VARIABLES = ("JOCH_EDITOR", "KUBE_EDITOR", "EDITOR")
Reporter = Callable[[errors.JochError], None]


# --- patch --------------------------------------------------------------------------------------

def patch_body(patch: str | None, patch_file: str | None, patch_type: str) -> str:
    """The patch as JSON text, from ``-p`` or ``--patch-file``; YAML is accepted and converted."""
    if (patch is None) == (patch_file is None):
        raise errors.BadRequest("give the patch with -p/--patch, or --patch-file, one of them")
    source = "-p"
    text = patch
    if patch_file is not None:
        source = f"--patch-file {patch_file}"
        try:
            text = Path(patch_file).read_text()
        except OSError as exc:
            raise errors.BadRequest(f"cannot read {source}: {exc.strerror or exc}") from None
    value = _parse(text or "", source)
    want = list if patch_type == "json" else dict
    if not isinstance(value, want):
        shape = "a list of operations, e.g. '[{\"op\":\"replace\",\"path\":\"/spec/x\",\"value\":1}]'" \
            if patch_type == "json" else "an object, e.g. '{\"spec\":{\"x\":1}}'"
        raise errors.BadRequest(f"the {patch_type} patch given with {source} must be {shape}")
    return json.dumps(value)


def _parse(text: str, source: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        pass
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise errors.BadRequest(f"the patch given with {source} is neither JSON nor YAML: {exc}") from None


def patch(client: Client, rt: ResourceType, namespace: str | None, name: str, *, body: str, patch_type: str,
          output: str | None, subresource: str | None = None) -> None:
    path = rt.path(namespace=namespace, name=name)
    before = client.get_object(path)
    target = f"{path}/{subresource}" if subresource else path
    after = client.request("PATCH", target, content=body, content_type=PATCH_TYPES[patch_type])
    if not isinstance(after, dict):
        raise client.not_joch(f"PATCH {path} answered JSON that is not an object")
    if output:
        typer.echo(printers.object_name(rt, after) if output == "name" else printers.dump(after, output), nl=False)
        if output == "name":
            typer.echo("")
        return
    same = _version(before) == _version(after)
    typer.echo(f"{printers.object_name(rt, after)} patched{' (no change)' if same else ''}")


def _version(obj: Obj) -> Any:
    return (obj.get("metadata") or {}).get("resourceVersion")


# --- label --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LabelChanges:
    set: dict[str, str]
    remove: tuple[str, ...]


def split_label_args(args: list[str]) -> tuple[list[str], LabelChanges]:
    """kubectl's ``TYPE NAME... k=v k2-``: the arguments naming objects, and the label changes."""
    targets: list[str] = []
    sets: dict[str, str] = {}
    removes: list[str] = []
    for arg in args:
        if "=" in arg:
            key, _, value = arg.partition("=")
            if not key:
                raise errors.BadRequest(f'invalid label "{arg}": give KEY=VALUE')
            if key in sets and sets[key] != value:
                raise errors.BadRequest(f'label "{key}" is given twice, with different values')
            sets[key] = value
        elif arg.endswith("-") and len(arg) > 1 and targets:
            removes.append(arg[:-1])
        else:
            targets.append(arg)
    both = set(sets) & set(removes)
    if both:
        raise errors.BadRequest(f'label "{sorted(both)[0]}" is both set and removed: give one of KEY=VALUE and KEY-')
    return targets, LabelChanges(sets, tuple(removes))


def label(client: Client, rt: ResourceType, namespace: str | None, name: str, changes: LabelChanges, *,
          overwrite: bool, warn: Callable[[str], None]) -> None:
    path = rt.path(namespace=namespace, name=name)
    current = client.get_object(path)
    metadata = current.get("metadata") or {}
    labels: dict[str, str] = dict(metadata.get("labels") or {})
    update: dict[str, str | None] = {}
    for key, value in changes.set.items():
        if key in labels and labels[key] != value and not overwrite:
            raise errors.BadRequest(f"'{key}' already has a value ({labels[key]}), and --overwrite is false",
                                    kind=rt.plural, name=name)
        if labels.get(key) != value:
            update[key] = value
    for key in changes.remove:
        if key in labels:
            update[key] = None
        else:
            warn(f'label "{key}" not found on {printers.object_name(rt, current)}')
    shown = printers.object_name(rt, current)
    if not update:
        typer.echo(f"{shown} not labeled")
        return
    body = {"metadata": {"labels": update, "resourceVersion": metadata.get("resourceVersion")}}
    client.request("PATCH", path, content=json.dumps(body), content_type=MERGE_PATCH)
    added = any(v is not None for v in update.values())
    typer.echo(f"{shown} {'labeled' if added else 'unlabeled'}")


# --- edit ---------------------------------------------------------------------------------------

HEADER = """\
# Please edit the object below. Lines beginning with a '#' will be ignored,
# and an empty file will abort the edit. If an error occurs while saving this file will be
# reopened with the relevant failures.
#
"""


def editor_command() -> list[str]:
    for variable in EDITOR_VARIABLES:
        value = os.environ.get(variable, "").strip()
        if value:
            try:
                argv = shlex.split(value)
            except ValueError as exc:
                raise errors.BadRequest(f"cannot split ${variable} ({value!r}) into a command: {exc}") from None
            if argv:
                return argv
    return ["vi"]


def edit(client: Client, rt: ResourceType, namespace: str | None, name: str, *, output: str,
         report: Reporter) -> errors.JochError | None:
    """Edit until the server accepts the object, the user saves no change, or an error is saved twice."""
    path = rt.path(namespace=namespace, name=name)
    original = _without_managed_fields(client.get_object(path))
    text = _write(original, output)
    suffix = ".json" if output == "json" else ".yaml"
    handle, file_name = tempfile.mkstemp(prefix=f"joch-edit-{rt.plural}-", suffix=suffix)
    os.close(handle)
    file = Path(file_name)
    failure: errors.JochError | None = None
    previous: str | None = None
    keep = False
    try:
        header = HEADER
        while True:
            file.write_text(header + text)
            _run_editor(file)
            saved = file.read_text()
            body = _uncommented(saved)
            if not body.strip():
                typer.echo("Edit cancelled, no changes made.")
                return None
            if previous is not None and body == previous and failure is not None:
                file.write_text(saved)
                typer.echo(f'A copy of your changes has been stored to "{file}"', err=True)
                keep = True
                report(failure)
                return failure
            previous = body
            try:
                edited = _read(body, output)
                if edited == original:
                    typer.echo("Edit cancelled, no changes made.")
                    return None
                _same_object(original, edited)
                written = client.request("PUT", path, json_body=edited)
            except errors.ServiceUnavailable:
                raise
            except errors.JochError as exc:
                failure = exc
                header = HEADER + _error_comment(exc)
                text = body
                continue
            name_shown = printers.object_name(rt, written if isinstance(written, dict) else edited)
            typer.echo(f"{name_shown} edited")
            return None
    finally:
        if not keep:
            file.unlink(missing_ok=True)


def _without_managed_fields(obj: Obj) -> Obj:
    """As kubectl edit shows an object: without ``metadata.managedFields`` (server-side apply's
    bookkeeping), which an update that leaves them out keeps as they are."""
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict) or "managedFields" not in metadata:
        return obj
    return {**obj, "metadata": {k: v for k, v in metadata.items() if k != "managedFields"}}


def _write(obj: Obj, output: str) -> str:
    return printers.to_json(obj) if output == "json" else printers.to_yaml(obj)


def _read(text: str, output: str) -> Obj:
    try:
        value = json.loads(text) if output == "json" else _yaml_load(text)
    except ValueError as exc:
        raise errors.BadRequest(f"the edited file is not valid {output.upper()}: {exc}") from None
    if not isinstance(value, dict):
        raise errors.BadRequest("the edited file must hold one object (a mapping with apiVersion, kind, metadata)")
    return value


def _yaml_load(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ValueError(str(exc)) from None


def _same_object(original: Obj, edited: Obj) -> None:
    for field in ("apiVersion", "kind"):
        if edited.get(field) != original.get(field):
            raise errors.BadRequest(f"{field} cannot be changed by edit (was {original.get(field)!r})")
    before, after = original.get("metadata") or {}, edited.get("metadata") or {}
    for field in ("name", "namespace"):
        if after.get(field) != before.get(field):
            raise errors.BadRequest(f"metadata.{field} cannot be changed by edit (was {before.get(field)!r}); "
                                    "create a new object instead")


def _uncommented(text: str) -> str:
    return "".join(line for line in text.splitlines(keepends=True) if not line.lstrip().startswith("#"))


def _error_comment(exc: errors.JochError) -> str:
    lines = [f"# {line}" for line in exc.message.splitlines() or [exc.reason]]
    lines += [f"# * {c.field + ': ' if c.field else ''}{c.message}" for c in exc.causes]
    return "\n".join(lines) + "\n#\n"


def _run_editor(file: Path) -> None:
    argv = [*editor_command(), str(file)]
    try:
        done = subprocess.run(argv, check=False)
    except OSError as exc:
        raise errors.BadRequest(f"cannot start the editor {argv[0]!r}: {exc.strerror or exc}; set JOCH_EDITOR "
                                "or EDITOR to an editor command") from None
    if done.returncode != 0:
        raise errors.BadRequest(f"the editor {argv[0]!r} exited with code {done.returncode}; nothing was changed")
