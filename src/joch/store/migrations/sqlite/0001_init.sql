-- Objects, the change log and the global revision counter.
CREATE TABLE joch_meta (
    key   TEXT PRIMARY KEY,
    value INTEGER NOT NULL
);
INSERT INTO joch_meta (key, value) VALUES ('revision', 0), ('compacted', 0);

CREATE TABLE joch_objects (
    kind      TEXT    NOT NULL,
    namespace TEXT    NOT NULL,
    name      TEXT    NOT NULL,
    uid       TEXT    NOT NULL,
    revision  INTEGER NOT NULL,
    body      TEXT    NOT NULL,
    PRIMARY KEY (kind, namespace, name)
) WITHOUT ROWID;

CREATE TABLE joch_changes (
    revision  INTEGER PRIMARY KEY,
    kind      TEXT NOT NULL,
    namespace TEXT NOT NULL,
    name      TEXT NOT NULL,
    type      TEXT NOT NULL,
    body      TEXT NOT NULL
);
CREATE INDEX joch_changes_kind ON joch_changes (kind, revision);
