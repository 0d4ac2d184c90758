"""Schema migrations, owned by the server: numbered SQL files per dialect, applied at start.

``migrations/<dialect>/NNNN_name.sql`` run in order; each applied file is recorded in
``joch_schema_migrations`` in the same transaction as its statements, so a crash mid-migration
leaves the schema at the previous version. Both dialects always get the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

from joch.api import errors


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    def statements(self) -> list[str]:
        # Migration files hold plain DDL/DML without semicolons inside literals.
        return [s.strip() for s in self.sql.split(";") if s.strip() and not _only_comments(s)]


def _only_comments(chunk: str) -> bool:
    return all(not line.strip() or line.strip().startswith("--") for line in chunk.splitlines())


def load(dialect: str) -> list[Migration]:
    folder = resources.files("joch.store").joinpath("migrations", dialect)
    out = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            number, _, rest = entry.name.partition("_")
            out.append(Migration(int(number), rest.removesuffix(".sql"), entry.read_text(encoding="utf-8")))
    return sorted(out, key=lambda m: m.version)


CREATE_TABLE = (
    "CREATE TABLE IF NOT EXISTS joch_schema_migrations ("
    "version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_at TEXT NOT NULL)"
)


def check_not_newer(applied: int, known: list[Migration], where: str) -> None:
    """Refuse a database migrated by a newer Joch: this binary would misread its tables."""
    newest = max((m.version for m in known), default=0)
    if applied > newest:
        raise errors.ServiceUnavailable(
            f"the store at {where} has schema version {applied}, newer than this joch knows "
            f"(up to {newest}): upgrade joch, or point it at another store"
        )
