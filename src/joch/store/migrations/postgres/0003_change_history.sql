-- Kinds with "latest" history keep only the newest change row of each object (see joch.store.sql).
-- superseded: the revision of the change row of the same object that this write removed (NULL:
-- none), so a watch that resumes from before it knows it missed a change.
ALTER TABLE joch_changes ADD COLUMN superseded BIGINT;
CREATE INDEX joch_changes_object ON joch_changes (kind, namespace, name);
-- Secret values written before this rule: drop every superseded change of a Secret and the values
-- in the DELETED ones, so no watch can replay a value that was changed or deleted.
DELETE FROM joch_changes WHERE kind = 'ops.joch.dev/Secret' AND type <> 'DELETED' AND revision < (
    SELECT MAX(later.revision) FROM joch_changes AS later
    WHERE later.kind = joch_changes.kind AND later.namespace = joch_changes.namespace
      AND later.name = joch_changes.name
);
UPDATE joch_changes SET body = (body::jsonb #- '{spec,data}')::text
WHERE kind = 'ops.joch.dev/Secret' AND type = 'DELETED';
