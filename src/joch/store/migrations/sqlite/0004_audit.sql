-- The audit log: append-only (the API has no route that changes or deletes a row, only retention
-- prunes rows older than --audit-retention). id is handed out in commit order: rows are written
-- under the store's write lock. time is RFC 3339 UTC with microseconds, always 27 characters, so
-- text order is time order. groups is a JSON array.
CREATE TABLE joch_audit (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    time       TEXT NOT NULL,
    actor      TEXT NOT NULL,
    groups     TEXT NOT NULL,
    verb       TEXT NOT NULL,
    kind       TEXT NOT NULL,
    namespace  TEXT NOT NULL,
    name       TEXT NOT NULL,
    decision   TEXT NOT NULL CHECK (decision IN ('allowed', 'denied')),
    reason     TEXT NOT NULL,
    request_id TEXT NOT NULL,
    source_ip  TEXT NOT NULL
);
CREATE INDEX joch_audit_time ON joch_audit (time);
CREATE INDEX joch_audit_actor ON joch_audit (actor, id);
CREATE INDEX joch_audit_object ON joch_audit (namespace, kind, name, id);
CREATE INDEX joch_audit_denied ON joch_audit (id) WHERE decision = 'denied';
