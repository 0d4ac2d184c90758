"""The one registry of kinds.

A kind is declared once, as a ``KindInfo``: its group/version/kind, plural and short names, scope,
the pydantic models of its spec and status, the references admission checks and the columns the
CLI prints. The HTTP routes, discovery, OpenAPI, admission and the CLI all read this registry, so
adding a kind is one ``register()`` call and no edit anywhere else.

A kind also declares how the store's change log keeps its history (``KindInfo.history``), because
that is a property of the kind, not of the store: ``full`` keeps every change until compaction, so a
watch from an old revision sees each one; ``latest`` keeps only the newest change of each object —
for kinds written over and over by controllers (a Lease renewed every few seconds) whose past states
nobody replays, and for kinds whose past values must not be replayable at all. ``sensitive`` names
the fields that hold such values (a Secret's ``spec.data``): they require ``latest`` history, and
the DELETED change of such an object leaves them out, so once a value is changed or deleted no
watch can replay it. Beyond that the store encrypts them at rest and no read returns them
(``joch.api.secrets``: reads show ``status.keys``; ``Store.reveal`` is for Joch's own code). See
``joch.store.sql`` for how the store applies all of it.

Where a kind's fields live (``KindInfo.body``): most kinds keep them under ``spec`` and their
observed state under ``status``. ``body="top"`` declares a kind whose spec model's fields are
top-level keys of the object, as Kubernetes' RoleBinding (``roleRef``, ``subjects``), ConfigMap
(``data``) and Event are shaped: such an object has no ``spec`` key, and no ``status`` (nor
``/status`` subresource) unless it declares a ``status_model``. Paths in ``references``,
``columns`` and ``sensitive`` are dotted from the object root either way (``roleRef.name``).
Code that reads the user-written part of any object generically uses ``KindInfo.body_of(obj)``
(the ``spec`` value, or the mapping of the top-level body fields) and ``KindInfo.body_path``
(field paths in messages); both are one comparison away from the plain ``obj.get("spec")`` for
ordinary kinds, which is every write's hot path.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Literal

from pydantic import BaseModel

from joch.api import errors


@dataclass(frozen=True)
class Reference:
    """A field of a kind's spec naming another object in the same namespace.

    ``path`` is dotted from the object root, e.g. ``spec.agentRef.name``. ``missing`` says what
    admission does when the target does not exist: ``reject`` the write, or ``warn`` and accept;
    ``until`` is what such a warning says the object lacks until the target exists (by default, it
    cannot be used).
    """

    path: str
    kind: str
    missing: Literal["reject", "warn"] = "reject"
    until: str | None = None


History = Literal["full", "latest"]
Body = Literal["spec", "top"]
ENVELOPE = ("apiVersion", "kind", "metadata")
"""The top-level keys every object has, whatever its ``body``."""
ColumnType = Literal["string", "integer", "number", "boolean", "date"]


@dataclass(frozen=True)
class Column:
    """A column of the kind's table (``kubectl get``, ``joch get``): a header and a path into the object.

    The path syntax and how values become cells are in ``joch.api.columns``. ``wide`` columns are
    shown only with ``-o wide`` (Table priority 1). ``type`` is the Table column type; left out, a
    column headed AGE is a ``date`` (shown as an age) and any other a ``string``.
    """

    name: str
    path: str
    wide: bool = False
    type: ColumnType | None = None
    description: str = ""


@dataclass(frozen=True)
class KindInfo:
    group: str
    version: str
    kind: str
    plural: str
    spec_model: type[BaseModel]
    status_model: type[BaseModel] | None
    """``None`` only for a ``body="top"`` kind without a status (a RoleBinding): no ``status`` key,
    no ``/status`` subresource."""
    namespaced: bool = True
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ("all",)
    references: tuple[Reference, ...] = ()
    columns: tuple[Column, ...] = ()
    spec_required: bool = True
    """Whether an object must have a ``spec`` (``body="spec"`` only; a ``top`` kind's required
    fields are its spec model's)."""
    history: History = "full"
    sensitive: tuple[str, ...] = ()  # dotted paths, e.g. "spec.data"
    initial_phase: str | None = None
    """``status.phase`` admission gives a new object, as the apiserver gives a new Pod ``Pending``:
    every reader (tables, API clients, watches) sees a phase from the first write on."""
    body: Body = "spec"
    """Where the fields of ``spec_model`` live: ``spec`` (under the ``spec`` key) or ``top`` (as
    top-level keys of the object, like Kubernetes' RoleBinding; see the module docstring)."""

    def __post_init__(self) -> None:
        if self.sensitive and self.history != "latest":
            # With full history every superseded value would stay replayable until compaction.
            raise ValueError(f"kind {self.kind} has sensitive fields, so its history must be 'latest'")
        if self.status_model is None and self.body == "spec":
            raise ValueError(f"kind {self.kind} keeps its fields under spec, so it needs a status_model")
        if self.body == "top":
            clash = set(self.body_fields) & {*ENVELOPE, "spec", "status"}
            if clash:
                raise ValueError(f"kind {self.kind} has body 'top', so its spec model cannot have the "
                                 f"top-level field(s) {', '.join(sorted(clash))}")

    @cached_property
    def body_fields(self) -> tuple[str, ...]:
        """The spec model's field names as written in objects (aliases where declared)."""
        return tuple(f.alias or name for name, f in self.spec_model.model_fields.items())

    @cached_property
    def top_level(self) -> tuple[str, ...]:
        """Every top-level key an object of this kind may have."""
        status = ("status",) if self.status_model is not None else ()
        if self.body == "spec":
            return (*ENVELOPE, "spec", *status)
        return (*ENVELOPE, *self.body_fields, *status)

    @property
    def body_prefix(self) -> tuple[str, ...]:
        """The path of the spec model's fields in the object: ``("spec",)`` or ``()``."""
        return ("spec",) if self.body == "spec" else ()

    def body_of(self, obj: dict[str, Any]) -> Any:
        """The user-written fields of ``obj``: its ``spec`` value (None when absent), or for a
        ``body="top"`` kind the mapping of its top-level keys other than the envelope and status."""
        if self.body == "spec":
            return obj.get("spec")
        return {k: v for k, v in obj.items() if k not in ENVELOPE and k != "status"}

    def with_body(self, envelope: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
        """``envelope`` (apiVersion, kind, metadata) with the admitted ``body`` in its place."""
        if self.body == "spec":
            return {**envelope, "spec": body}
        return {**envelope, **body}

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def key(self) -> str:
        """The store key of the kind: stable across versions of the same group and kind."""
        return f"{self.group}/{self.kind}"

    @property
    def resource(self) -> str:
        """``plural.group``, the fully qualified resource name kubectl accepts."""
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def names(self) -> Iterator[str]:
        yield self.kind.lower()
        yield self.plural
        yield self.resource
        yield f"{self.kind.lower()}.{self.group}"
        yield from self.short_names


class Registry:
    def __init__(self) -> None:
        self._kinds: list[KindInfo] = []
        self._by_name: dict[str, KindInfo] = {}
        self._by_gvk: dict[tuple[str, str], KindInfo] = {}

    def register(self, info: KindInfo) -> KindInfo:
        if (info.api_version, info.kind) in self._by_gvk:
            raise ValueError(f"kind {info.api_version}/{info.kind} registered twice")
        self._kinds.append(info)
        self._by_gvk[(info.api_version, info.kind)] = info
        for name in info.names():
            self._by_name.setdefault(name, info)
        return info

    def __iter__(self) -> Iterator[KindInfo]:
        return iter(self._kinds)

    def groups(self) -> dict[str, list[KindInfo]]:
        out: dict[str, list[KindInfo]] = {}
        for info in self._kinds:
            out.setdefault(info.group, []).append(info)
        return out

    def resolve(self, name: str) -> KindInfo:
        """A kind from anything kubectl accepts: Kind, kind, plural, short name, plural.group."""
        info = self._by_name.get(name) or self._by_name.get(name.lower())
        if info is None:
            known = ", ".join(sorted(i.plural for i in self._kinds))
            raise errors.NotFound(
                f'the server doesn\'t have a resource type "{name}" (known: {known})', kind=name
            )
        return info

    def for_object(self, api_version: str, kind: str) -> KindInfo:
        info = self._by_gvk.get((api_version, kind))
        if info is None:
            same_kind = [i for i in self._kinds if i.kind == kind]
            hint = f"; did you mean apiVersion: {same_kind[0].api_version}?" if same_kind else ""
            raise errors.NotFound(f"no kind {kind!r} is registered in {api_version!r}{hint}", kind=kind)
        return info

    def by_key(self, key: str) -> KindInfo:
        for info in self._kinds:
            if info.key == key:
                return info
        raise errors.NotFound(f"no kind is registered under {key!r}")

    def for_route(self, group: str, version: str, plural: str) -> KindInfo:
        for info in self._kinds:
            if info.group == group and info.version == version and info.plural == plural:
                return info
        raise errors.NotFound(f"the server could not find the requested resource {plural}.{group}/{version}")


REGISTRY = Registry()


def register(info: KindInfo) -> KindInfo:
    return REGISTRY.register(info)
