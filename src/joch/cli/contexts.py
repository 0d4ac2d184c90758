"""Contexts: named (server, token, namespace) triples in a config file, as kubectl's kubeconfig has.

The file is ``$JOCH_CONFIG``, else ``$XDG_CONFIG_HOME/joch/config.yaml``, else
``~/.config/joch/config.yaml``; it holds tokens, so it is written with mode 0600 (through a new
file renamed over the old one, so a crash never leaves half a file), in a directory created 0700::

    apiVersion: joch.dev/v1alpha1
    kind: Config
    current-context: prod
    contexts:
    - name: prod
      context: {server: https://joch.example.com, token: ..., namespace: team-a}

Where each setting comes from, first match wins (``token`` here, ``client.server_url``,
``namespaces.choose``): the command-line flag
(``--server``, ``--token``, ``-n``), the environment (``JOCH_SERVER``, ``JOCH_TOKEN``,
``JOCH_NAMESPACE``), the current context, the default (``http://127.0.0.1:8080``, no token,
``default``). A context's namespace is a default like ``JOCH_NAMESPACE``: a manifest naming
another namespace overrides it.

``view`` prints the file with every token shown as ``REDACTED`` (``--raw`` shows them), as
``kubectl config view`` does. A missing file is an empty config, read without importing yaml: a
command that needs no context pays nothing for this.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from joch.api import errors

CONFIG_ENV = "JOCH_CONFIG"
TOKEN_ENV = "JOCH_TOKEN"  # noqa: S105  # the variable's name, not a token
API_VERSION = "joch.dev/v1alpha1"
REDACTED = "REDACTED"
FIELDS = ("server", "token", "namespace")


@dataclass(frozen=True)
class Context:
    name: str
    server: str | None = None
    token: str | None = None
    namespace: str | None = None

    def to_dict(self, *, raw: bool = True) -> dict[str, Any]:
        settings = {key: getattr(self, key) for key in FIELDS if getattr(self, key)}
        if not raw and "token" in settings:
            settings["token"] = REDACTED
        return {"name": self.name, "context": settings}


@dataclass
class Config:
    path: Path
    current: str | None = None
    contexts: dict[str, Context] = field(default_factory=dict)

    def to_dict(self, *, raw: bool = True) -> dict[str, Any]:
        return {"apiVersion": API_VERSION, "kind": "Config", "current-context": self.current or "",
                "contexts": [context.to_dict(raw=raw) for context in self.contexts.values()]}

    def current_context(self) -> Context | None:
        if not self.current:
            return None
        context = self.contexts.get(self.current)
        if context is None:
            raise errors.BadRequest(f'the current context "{self.current}" of {self.path} does not exist: choose '
                                    "one with joch config use-context NAME (joch config get-contexts lists them)")
        return context


def path() -> Path:
    given = os.environ.get(CONFIG_ENV)
    if given:
        return Path(given).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "joch" / "config.yaml"


def load(where: Path | None = None) -> Config:
    where = where or path()
    try:
        text = where.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Config(where)
    except (OSError, UnicodeDecodeError) as exc:
        raise errors.BadRequest(f"cannot read the config file {where}: {getattr(exc, 'strerror', None) or exc}") \
            from None
    import yaml

    try:
        body = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise errors.BadRequest(f"the config file {where} is not valid YAML ({exc}); fix it or remove it") from None
    return _parse(body, where)


def _parse(body: Any, where: Path) -> Config:
    fix = f"fix {where} (joch config view shows what is understood) or remove it"
    if not isinstance(body, dict):
        raise errors.BadRequest(f"the config file {where} must be a mapping with contexts; {fix}")
    config = Config(where, current=str(body.get("current-context") or "") or None)
    entries = body.get("contexts") or []
    if not isinstance(entries, list):
        raise errors.BadRequest(f"contexts in {where} must be a list; {fix}")
    for i, entry in enumerate(entries):
        settings = entry.get("context") if isinstance(entry, dict) else None
        name = entry.get("name") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not name or not isinstance(settings or {}, dict):
            raise errors.BadRequest(f"contexts[{i}] in {where} needs a name and a context mapping; {fix}")
        values = {key: settings.get(key) for key in FIELDS} if settings else {}
        if any(value is not None and not isinstance(value, str) for value in values.values()):
            raise errors.BadRequest(f'context "{name}" in {where}: server, token and namespace must be strings; {fix}')
        config.contexts[name] = Context(name, **values)
    return config


def save(config: Config) -> None:
    """Write the config with mode 0600 (it holds tokens), atomically."""
    import yaml

    directory = config.path.parent
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=".config-", dir=directory)  # mkstemp creates it 0600
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                yaml.safe_dump(config.to_dict(), out, sort_keys=False)
            os.chmod(temporary, 0o600)
            os.replace(temporary, config.path)
        except BaseException:
            Path(temporary).unlink(missing_ok=True)
            raise
    except OSError as exc:
        raise errors.BadRequest(f"cannot write the config file {config.path}: {exc.strerror or exc}") from None


def set_context(name: str, *, server: str | None, token: str | None, namespace: str | None) -> str:
    config = load()
    existing = config.contexts.get(name)
    given = {key: value for key, value in (("server", server), ("token", token), ("namespace", namespace))
             if value is not None}
    config.contexts[name] = replace(existing or Context(name), **given)
    save(config)
    return f'Context "{name}" {"modified" if existing else "created"}.'


def use_context(name: str) -> str:
    config = load()
    if name not in config.contexts:
        known = ", ".join(sorted(config.contexts)) or "none yet: create one with joch config set-context NAME"
        raise errors.NotFound(f'no context exists with the name: "{name}" (contexts: {known})')
    config.current = name
    save(config)
    return f'Switched to context "{name}".'


def current_name() -> str:
    config = load()
    if not config.current:
        raise errors.NotFound("current-context is not set: joch config use-context NAME")
    return config.current


def token(flag: str | None, context: Context | None) -> str | None:
    """``--token``, else ``JOCH_TOKEN``, else the current context's token, else none."""
    return flag or os.environ.get(TOKEN_ENV) or (context.token if context else None)


def current() -> Context | None:
    where = path()
    if not where.exists():
        return None
    return load(where).current_context()
