-- The labels an object had before a MODIFIED that changed them, so label-selector watches can
-- report an object entering (ADDED) or leaving (DELETED) their selection. NULL: unchanged.
ALTER TABLE joch_changes ADD COLUMN prev_labels TEXT;
