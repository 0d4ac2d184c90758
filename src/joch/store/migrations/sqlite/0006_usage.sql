-- Metered usage (joch.controllers.metering): one row per usage event a run reported, keyed by
-- (run uid, event id) so that a retried event counts once. Written in the transaction that adds it
-- to the run's status.costUsd. Rows outlive their run: deleting a run does not refund its spend.
CREATE TABLE joch_usage (
    run_uid TEXT NOT NULL,
    event_id TEXT NOT NULL,
    namespace TEXT NOT NULL,
    run_name TEXT NOT NULL,
    agent TEXT NOT NULL,
    team TEXT NOT NULL DEFAULT '',
    model TEXT NOT NULL DEFAULT '',
    input_tokens INTEGER NOT NULL DEFAULT 0,
    output_tokens INTEGER NOT NULL DEFAULT 0,
    cached_tokens INTEGER NOT NULL DEFAULT 0,
    cost_usd REAL NOT NULL,
    recorded_at REAL NOT NULL,
    PRIMARY KEY (run_uid, event_id)
);
CREATE INDEX joch_usage_time ON joch_usage (recorded_at);
CREATE INDEX joch_usage_namespace ON joch_usage (namespace, recorded_at);
-- Random keys every server of this store shares (the run-token HMAC key), created on first use.
CREATE TABLE joch_keys (
    name TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
