-- Sensitive fields (a Secret's spec.data), sealed: one row per object that has them, written in the
-- same transaction as the object (see joch.store.sealing). value is "aes256gcm:<key id>:<base64>",
-- or "identity::<base64 JSON>" for a store opened without a key ring (tests). key_id repeats the
-- key id so a start can check, per key, that its ring decrypts what the store holds. Values an
-- older joch left in plain text in joch_objects and joch_changes are moved here, encrypted, by the
-- store at its next start (it needs the key ring, which SQL does not have).
CREATE TABLE joch_sealed (
    kind TEXT NOT NULL,
    namespace TEXT NOT NULL,
    name TEXT NOT NULL,
    key_id TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (kind, namespace, name)
);
CREATE INDEX joch_sealed_key ON joch_sealed (key_id);
