-- Objects, the change log and the global revision counter.
CREATE TABLE joch_meta (
    key   TEXT PRIMARY KEY,
    value BIGINT NOT NULL
);
INSERT INTO joch_meta (key, value) VALUES ('revision', 0), ('compacted', 0);

CREATE TABLE joch_objects (
    kind      TEXT   NOT NULL,
    namespace TEXT   NOT NULL,
    name      TEXT   NOT NULL,
    uid       TEXT   NOT NULL,
    revision  BIGINT NOT NULL,
    body      TEXT   NOT NULL,
    PRIMARY KEY (kind, namespace, name)
);

CREATE TABLE joch_changes (
    revision  BIGINT PRIMARY KEY,
    kind      TEXT NOT NULL,
    namespace TEXT NOT NULL,
    name      TEXT NOT NULL,
    type      TEXT NOT NULL,
    body      TEXT NOT NULL
);
CREATE INDEX joch_changes_kind ON joch_changes (kind, revision);
