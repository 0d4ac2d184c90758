"""Kinds, schemas, the kind registry, conditions and errors. Pure data: no I/O lives here.

Importing the package registers the built-in kinds, so ``REGISTRY`` is complete for every caller.
"""

from joch.api import integrations as integrations
from joch.api import kinds as kinds
from joch.api import namespaces as namespaces
from joch.api.registry import REGISTRY as REGISTRY
from joch.api.registry import KindInfo as KindInfo
