"""Compiling an Agent and what it references into one deterministic ``CompiledAgentManifest``.

A run never reads the Agent and its AgentProvider separately: it uses the manifest, so the two are
always read as one consistent version, and the hash in ``status.compiledManifestHash`` says which.

Design decisions:

* **The manifest is a pure function of its inputs.** Specs are re-validated through their schemas
  and dumped with every default filled in, so an Agent written with or without
  ``runtime.type: local`` compiles to the same bytes. ``sources`` names each input by kind, name,
  uid and generation: editing a spec or re-creating an object under the same name changes the
  hash; relabelling one, or a status write, does not. Nothing time- or revision-dependent
  (timestamps, resourceVersions) is inside.
* **The hash is over canonical JSON** (sorted keys, no whitespace, UTF-8) of the manifest without
  its ``hash`` field: ``sha256:<hex>``. The returned manifest is that canonical JSON parsed back,
  so even its key order is fixed.
* **References only, never secret values.** ``secretEnv`` keeps (env name, Secret name, key); the
  compiler checks that the Agent allows each Secret (``spec.security.allowedSecrets``), that the
  Secret exists and has the key, and reads nothing else from it. Secrets are not ``sources``:
  rotating a key changes no manifest.
* **Problems, not exceptions.** Everything a person must fix is a ``Problem(reason, message)``
  naming the object, the field and the way out. The manifest is ``None`` whenever there is one: a
  caller cannot start a run from a manifest that was found broken.
* Kinds the Agent names that Joch does not serve yet (tools, MCP servers, memory, model routes)
  are carried as the references written; Policies, which exist, must resolve.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from pydantic import BaseModel, ValidationError

from joch.api import errors
from joch.api.kinds import AGENT_PROVIDER, POLICY, SECRET, AgentProviderSpec, AgentSpec
from joch.api.registry import KindInfo
from joch.api.secrets import key_names as secret_keys
from joch.compiler.render import check_parameters, check_templates
from joch.store.base import Obj, Writer

API_VERSION = "joch.dev/v1alpha1"
KIND = "CompiledAgentManifest"

Reader = Callable[[KindInfo, str | None, str], Obj | None]
"""Reads one object (kind, namespace, name), or None when there is none: an informer cache or the store."""


class Problem(NamedTuple):
    reason: str
    message: str


REFERENCE_REASONS = frozenset({"ProviderNotFound", "SecretNotFound", "SecretKeyNotFound", "PolicyNotFound"})
"""The problems that mean a reference does not resolve (the Agent's ``ReferencesResolved`` condition)."""


@dataclass(frozen=True)
class Compiled:
    manifest: dict[str, Any] | None
    hash: str | None
    problems: list[Problem] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def compile_agent(read: Reader, agent: Obj) -> Compiled:
    meta = agent.get("metadata") or {}
    namespace, name = meta.get("namespace"), meta.get("name", "")
    agent_spec = _validated(AgentSpec, agent.get("spec") or {}, f'Agent "{name}"')
    if isinstance(agent_spec, Problem):
        return _failed([agent_spec])
    provider_name = agent_spec["providerRef"]["name"]
    provider = read(AGENT_PROVIDER, namespace, provider_name)
    if provider is None:
        return _failed([Problem("ProviderNotFound", (
            f'AgentProvider "{provider_name}" not found{_in(namespace)}: create it (joch apply -f '
            "provider.yaml) or fix spec.providerRef.name"))])
    provider_spec = _validated(AgentProviderSpec, provider.get("spec") or {}, f'AgentProvider "{provider_name}"')
    if isinstance(provider_spec, Problem):
        return _failed([provider_spec])

    problems = [*_secret_problems(read, namespace, name, provider_name, agent_spec, provider_spec),
                *_path_problems(provider_name, provider_spec)]
    policies = []
    for ref in agent_spec["policies"]:
        policy = read(POLICY, namespace, ref["name"])
        if policy is None:
            problems.append(Problem("PolicyNotFound", (
                f'Policy "{ref["name"]}" not found{_in(namespace)}: create it or remove it from the '
                "Agent's spec.policies")))
        else:
            policies.append(policy)

    spec = {k: v for k, v in agent_spec.items() if k != "providerRef"}
    spec["provider"] = {"name": provider_name, **provider_spec}
    manifest: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND,
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
        "sources": [_source(agent), _source(provider), *(_source(p) for p in policies)],
    }
    problems += [Problem("TemplateError", f"{path}: {message}") for path, message in check_templates(manifest)]
    problems += [Problem("UnknownParameter", f"{path}: {message}") for path, message in check_parameters(manifest)]
    if problems:
        return _failed(problems)
    digest = manifest_hash(manifest)
    sealed: dict[str, Any] = json.loads(canonical_json({**manifest, "hash": digest}))
    return Compiled(manifest=sealed, hash=digest)


def canonical_json(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def manifest_hash(manifest: dict[str, Any]) -> str:
    """``sha256:<hex>`` of the canonical JSON of ``manifest`` without its ``hash`` field."""
    body = {k: v for k, v in manifest.items() if k != "hash"}
    return "sha256:" + hashlib.sha256(canonical_json(body)).hexdigest()


def store_reader(store: Writer) -> Reader:
    """A ``Reader`` over a store (or an open transaction): ``NotFound`` becomes None."""

    def read(kind: KindInfo, namespace: str | None, name: str) -> Obj | None:
        try:
            return store.get(kind, namespace, name)
        except errors.NotFound:
            return None

    return read


# --- pieces --------------------------------------------------------------------------------------

def _failed(problems: list[Problem]) -> Compiled:
    return Compiled(manifest=None, hash=None, problems=problems)


def _validated(model: type[BaseModel], spec: Any, what: str) -> dict[str, Any] | Problem:
    """The spec with every default filled in, or the problem (a stored spec that no longer passes
    its schema, e.g. written before a schema change)."""
    try:
        dumped: dict[str, Any] = model.model_validate(spec).model_dump(mode="json", by_alias=True)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = "spec." + ".".join(str(p) for p in first["loc"]) if first["loc"] else "spec"
        return Problem("InvalidSpec", f"{what} has an invalid {where}: {first['msg']}; re-apply it to see "
                       "every problem")
    return dumped


def _source(obj: Obj) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    return {"kind": obj.get("kind"), "name": meta.get("name"), "uid": meta.get("uid"),
            "generation": meta.get("generation")}


def _in(namespace: str | None) -> str:
    return f' in namespace "{namespace}"' if namespace else ""


def _secret_problems(
    read: Reader, namespace: str | None, agent: str, provider: str, agent_spec: dict[str, Any],
    provider_spec: dict[str, Any],
) -> Iterator[Problem]:
    allowed = set(agent_spec["security"]["allowedSecrets"])
    not_allowed: set[str] = set()
    missing: set[str] = set()
    for i, env in enumerate(provider_spec["secretEnv"]):
        secret, key = env["secretRef"]["name"], env["secretRef"]["key"]
        where = f'AgentProvider "{provider}" spec.secretEnv[{i}] ({env["name"]})'
        if secret not in allowed and secret not in not_allowed:
            not_allowed.add(secret)
            yield Problem("SecretNotAllowed", (
                f'{where} uses Secret "{secret}", which Agent "{agent}" does not allow: add "{secret}" to '
                "the Agent's spec.security.allowedSecrets"))
        stored = read(SECRET, namespace, secret)
        if stored is None:
            if secret not in missing:
                missing.add(secret)
                yield Problem("SecretNotFound", (
                    f'Secret "{secret}" not found{_in(namespace)} ({where}): create it (joch apply -f '
                    f"secret.yaml) or fix spec.secretEnv[{i}].secretRef.name"))
            continue
        keys = secret_keys(stored)  # the public view: key names only, never a value
        if key not in keys:
            has = f"it has {', '.join(keys)}" if keys else "it has no keys"
            yield Problem("SecretKeyNotFound", (
                f'Secret "{secret}" has no key "{key}" ({where}); {has}: add the key to the Secret or fix '
                f"spec.secretEnv[{i}].secretRef.key"))


def _path_problems(provider: str, spec: dict[str, Any]) -> Iterator[Problem]:
    """Input and output paths stay inside their directories: relative, no ``..``."""
    fields = [(f"spec.inputFiles[{i}].path", f["path"]) for i, f in enumerate(spec["inputFiles"])]
    fields += [(f"spec.outputArtifacts[{i}].path", o["path"]) for i, o in enumerate(spec["outputArtifacts"])]
    for path, value in fields:
        normal = posixpath.normpath(value)
        if value.startswith("/") or normal == ".." or normal.startswith("../") or "\x00" in value:
            yield Problem("InvalidPath", (
                f'AgentProvider "{provider}" {path} is "{value}": it must be a relative path inside the '
                "run's inputs or outputs directory (no leading / and no ..)"))
