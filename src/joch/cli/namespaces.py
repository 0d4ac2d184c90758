"""Which namespace a command works in, and where that choice came from.

kubectl has two sources of a namespace and treats them differently: an explicit ``-n``, which a
manifest naming another namespace contradicts (an error), and the context's namespace, a default
that such a manifest simply overrides. Joch's equivalents are ``-n/--namespace`` and the
``JOCH_NAMESPACE`` environment variable, then the current context's namespace (``joch.cli.contexts``),
both defaults like kubectl's context namespace; with none of them, ``default``.

``JOCH_NAMESPACE`` is invisible on the command line, so messages about a namespace that came from
it say so (``No resources found in team-a namespace (from JOCH_NAMESPACE).``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from joch.api import errors
from joch.api.meta import DEFAULT_NAMESPACE, DNS1123_LABEL

ENV = "JOCH_NAMESPACE"
CONTEXT = "the current context"
FLAG = "-n/--namespace"
DEFAULT = "default"
MAX_LENGTH = 63


@dataclass(frozen=True)
class Namespace:
    name: str
    source: str = DEFAULT

    @property
    def explicit(self) -> bool:
        """Given with ``-n``: a manifest naming another namespace is then an error."""
        return self.source == FLAG

    @property
    def origin(self) -> str:
        """`` (from JOCH_NAMESPACE)`` when the user cannot see the choice on the command line."""
        return f" (from {self.source})" if self.source in (ENV, CONTEXT) else ""


def choose(flag: str | None, context: str | None = None) -> Namespace:
    """``-n``, else ``JOCH_NAMESPACE``, else the current context's namespace, else ``default``."""
    env = os.environ.get(ENV)
    chosen = (Namespace(flag, FLAG) if flag else Namespace(env, ENV) if env else
              Namespace(context, CONTEXT) if context else Namespace(DEFAULT_NAMESPACE))
    if len(chosen.name) > MAX_LENGTH or not DNS1123_LABEL.match(chosen.name):
        where = (f"{ENV}={chosen.name}" if chosen.source == ENV else f"{FLAG} {chosen.name}" if chosen.explicit
                 else f"{CONTEXT}'s namespace {chosen.name}")
        raise errors.BadRequest(
            f'invalid namespace "{chosen.name}" (from {where}): a namespace is a DNS-1123 label, at most '
            f"{MAX_LENGTH} lower-case letters, digits and '-', starting and ending with a letter or digit"
        )
    return chosen


def noted(exc: errors.JochError, namespace: Namespace) -> errors.JochError:
    """A not-found error, saying where an invisible namespace came from."""
    if not namespace.origin or not isinstance(exc, errors.NotFound):
        return exc
    message = f"{exc.message} (the namespace came from {namespace.source})"
    return type(exc)(message, kind=exc.kind, name=exc.name, causes=exc.causes, extra=exc.extra)


def mismatch(label: str, named: str, namespace: Namespace) -> str:
    return (f'{label}: the namespace from the provided object "{named}" does not match the namespace '
            f'"{namespace.name}" given with {FLAG}; pass --namespace={named} or remove metadata.namespace')
