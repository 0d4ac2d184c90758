"""Resolving what a user types (``agents``, ``ag``, ``Agent``, ``agents.joch.dev``) to a resource.

Resolution goes through the *server's* discovery documents (``/apis`` and ``/apis/{group}/{version}``),
not through the local kind registry: the server is the authority on what it serves, so a CLI older
or newer than the server still addresses exactly the resources that exist. Discovery is fetched
once per invocation and kept on the ``Discovery`` object; parsing it is a pure function
(``Discovery.from_documents``) so resolution is unit-tested without a server.

Matching follows kubectl: the plural, the singular, a short name or the kind (any case), each
optionally qualified by the group (``agents.joch.dev``) or by version and group
(``agents.v1alpha1.joch.dev``). When several groups serve the same name, the first group in
discovery order wins, as kubectl prefers its priority order.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NotRequired, Protocol, TypedDict

from joch.api import errors


class APIResource(TypedDict):
    """One entry of an ``APIResourceList`` as the server sends it."""

    name: str
    kind: str
    namespaced: bool
    singularName: NotRequired[str]
    shortNames: NotRequired[list[str]]
    verbs: NotRequired[list[str]]
    categories: NotRequired[list[str]]


@dataclass(frozen=True)
class ResourceType:
    group: str
    version: str
    kind: str
    plural: str
    singular: str
    namespaced: bool
    short_names: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def qualified_kind(self) -> str:
        """``agent.joch.dev``: how kubectl names a kind in ``created``/``deleted`` lines."""
        lower = self.kind.lower()
        return f"{lower}.{self.group}" if self.group else lower

    @property
    def qualified_plural(self) -> str:
        return f"{self.plural}.{self.group}" if self.group else self.plural

    def path(self, *, namespace: str | None, name: str | None = None) -> str:
        """The REST path of the collection (``name`` None) or of one object."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{_segment(namespace, 'namespace')}"
        base += f"/{self.plural}"
        return f"{base}/{_segment(name, 'name')}" if name else base

    def aliases(self) -> Iterator[str]:
        """Every lower-case spelling that names this resource."""
        bare = (self.plural, self.singular, self.kind.lower(), *self.short_names)
        yield from bare
        if self.group:
            for word in bare:
                yield f"{word}.{self.group}"
                yield f"{word}.{self.version}.{self.group}"


def _segment(value: str, what: str) -> str:
    """One path segment, escaped; ``.``, ``..`` and ``/`` would address another URL, as kubectl knows."""
    if value in (".", "..") or "/" in value:
        raise errors.BadRequest(f'invalid {what} "{value}": a {what} may not be "." or ".." or contain "/"')
    return urllib.parse.quote(value, safe="")


class Getter(Protocol):
    def get_object(self, path: str, params: Mapping[str, str] | None = None) -> dict[str, Any]: ...


class Discovery:
    def __init__(self, resources: list[ResourceType]) -> None:
        self._resources = list(resources)
        self._by_alias: dict[str, ResourceType] = {}
        for rt in self._resources:
            for alias in rt.aliases():
                self._by_alias.setdefault(alias.lower(), rt)

    def __iter__(self) -> Iterator[ResourceType]:
        return iter(self._resources)

    @classmethod
    def from_documents(cls, resource_lists: list[dict[str, Any]]) -> Discovery:
        """Build from ``APIResourceList`` documents, in the order the server listed the groups."""
        resources = []
        for doc in resource_lists:
            group, _, version = str(doc.get("groupVersion", "")).rpartition("/")
            for entry in doc.get("resources") or []:
                usable = isinstance(entry, dict) and entry.get("kind") and entry.get("name")
                if usable and "/" not in entry["name"]:  # subresources such as agents/status are not types
                    resources.append(_resource_type(group, version, entry))
        return cls(resources)

    def resolve(self, name: str) -> ResourceType:
        found = self._by_alias.get(name.lower())
        if found is None:
            from joch.admission.diagnostics import closest  # lazy: only a typo pays for pydantic

            bare = [word for rt in self._resources for word in (rt.plural, rt.singular, *rt.short_names)]
            match = closest(name.lower(), bare)
            hint = f'; did you mean "{match}"?' if match else ""
            raise errors.NotFound(
                f'the server doesn\'t have a resource type "{name}"{hint} (see `joch api-resources`)', kind=name
            )
        return found

    def resolve_many(self, names: str) -> list[ResourceType]:
        """``agents,ap`` or a category such as ``all``, like kubectl: each comma-separated word is a
        resource name or, failing that, a discovery category; repeats are dropped."""
        found: list[ResourceType] = []
        for word in (w.strip() for w in names.split(",")):
            if not word:
                raise errors.BadRequest(f"empty resource type in {names!r}: separate types with single commas")
            if word.lower() in self._by_alias:
                matches = [self._by_alias[word.lower()]]
            else:
                matches = [rt for rt in self._resources if word.lower() in rt.categories]
                if not matches:
                    self.resolve(word)  # raises the not-found error that names the word
            found += [rt for rt in matches if rt not in found]
        return found

    def for_object(self, api_version: str, kind: str) -> ResourceType:
        for rt in self._resources:
            if rt.api_version == api_version and rt.kind == kind:
                return rt
        same = sorted({rt.api_version for rt in self._resources if rt.kind == kind})
        hint = f"; the server serves {kind} in {', '.join(same)}" if same else ""
        if not same:
            from joch.admission.diagnostics import closest  # lazy: only a typo pays for pydantic

            match = closest(kind, [rt.kind for rt in self._resources if rt.api_version == api_version])
            hint = f"; did you mean kind: {match}?" if match else ""
        raise errors.NotFound(f'no matches for kind "{kind}" in version "{api_version}"{hint}', kind=kind)


def _resource_type(group: str, version: str, entry: APIResource) -> ResourceType:
    return ResourceType(
        group=group,
        version=version,
        kind=entry["kind"],
        plural=entry["name"],
        singular=entry.get("singularName") or entry["kind"].lower(),
        namespaced=bool(entry.get("namespaced", True)),
        short_names=tuple(entry.get("shortNames") or ()),
        categories=tuple(entry.get("categories") or ()),
    )


def discover(client: Getter) -> Discovery:
    """Fetch ``/apis`` and the preferred version of every group, then ``/api/v1``."""
    group_list = client.get_object("/apis")
    documents = []
    for group in group_list.get("groups") or []:
        if not isinstance(group, dict):
            continue
        preferred = group.get("preferredVersion") or (group.get("versions") or [{}])[0]
        group_version = preferred.get("groupVersion") if isinstance(preferred, dict) else None
        if group_version:
            documents.append(client.get_object(f"/apis/{group_version}"))
    # The core group (Namespaces, the Events view) last: kubectl prefers it for a bare name, but
    # `joch get events` keeps meaning Joch's own Events, which the views translate.
    if "v1" in (client.get_object("/api").get("versions") or []):
        documents.append(client.get_object("/api/v1"))
    return Discovery.from_documents(documents)
