-- mcp-firewall audit schema (ClickHouse 18.16 and later).
--
-- The firewall runs this same file at start when [audit.clickhouse] create_schema
-- is true, substituting {database} and {table}; every statement is idempotent.
-- To create it by hand (defaults shown):
--   sed -e 's/{database}/mcp_firewall/g' -e 's/{table}/audit_events/g' schema.sql \
--     | clickhouse-client --multiquery
--
-- Duplicates: the firewall may send a row twice (retry after a lost ack, replay
-- after a crash). Rows are identical and keyed by event_id, so:
--   * read rows with FINAL:      SELECT ... FROM {database}.{table} FINAL WHERE ...
--   * count with uniqExact:      SELECT uniqExact(event_id) FROM {database}.{table} WHERE ...
--   * or collapse explicitly:    SELECT event_id, any(decision) ... GROUP BY event_id
-- A plain count() may exceed these until background merges remove duplicates.
--
-- Retention: TTL is not used (absent on 18.16); the firewall drops day partitions
-- older than retention_days from both tables.

-- Needed on 18.x only, where LowCardinality was experimental: remove this line
-- for later releases. (The firewall sends it only to 18.x servers.)
SET allow_experimental_low_cardinality_type = 1;

CREATE DATABASE IF NOT EXISTS {database};

-- One row per JSON-RPC message the firewall decided on.
-- ORDER BY (tenant, run_id, time, event_id): a run's timeline, and every
-- destructive call of a run (WHERE run_id = ... AND risk = 'destructive'), are one
-- contiguous range; day-level questions prune by the day partition; event_id
-- last makes it the ReplacingMergeTree deduplication key.
CREATE TABLE IF NOT EXISTS {database}.{table}
(
    event_id            UUID,
    time                DateTime('UTC'),
    time_ms             UInt64,
    tenant              LowCardinality(String),
    subject             String,
    agent_role          LowCardinality(String),
    run_id              String,
    session_id          String,
    token_id            String,
    client_ip           String,
    upstream            LowCardinality(String),
    project             LowCardinality(String),
    protocol_version    LowCardinality(String),
    method              LowCardinality(String),
    tool                LowCardinality(String),
    risk                LowCardinality(String),
    decision            LowCardinality(String),
    reason              String,
    stop_reason         LowCardinality(String),
    jsonrpc_id          String,
    arguments           String,
    result_summary      String,
    is_error            UInt8,
    upstream_status     UInt16,
    latency_us          UInt64,
    upstream_latency_us UInt64,
    bytes_in            UInt64,
    bytes_out           UInt64,
    instance            LowCardinality(String),
    trace_id            String,
    row_version         UInt8 DEFAULT 1,
    screen_kinds        Array(String),
    screen_action       LowCardinality(String),
    run_labels          Array(String),
    virtual_server      LowCardinality(String),
    approval_id         String,
    approver            String,
    approved_ms         UInt64,
    policy_sha256       String,
    pin_sha256          String,
    delegation          Array(String),
    token_jti           String,
    shadow_decision     LowCardinality(String),
    principal_claims    String,
    upstream_auth       LowCardinality(String),
    credential_id       String
)
ENGINE = ReplacingMergeTree(row_version)
PARTITION BY toYYYYMMDD(time)
ORDER BY (tenant, run_id, time, event_id)
SETTINGS index_granularity = 8192;

-- Tables created by releases before the write-ahead intent rows lack
-- row_version: the firewall adds the column at start (ALTER TABLE ... ADD
-- COLUMN row_version UInt8 DEFAULT 1; 18.16 has no ADD COLUMN IF NOT EXISTS).
-- Such a table keeps working, but only one created with
-- ReplacingMergeTree(row_version) collapses an intent into its completion
-- under FINAL; recreate it to get that.

-- Tables created before content screening lack screen_kinds, screen_action
-- and run_labels: the firewall adds them at start, the same way. Flagged
-- content of a day:
--   SELECT time, run_id, upstream, method, tool, screen_kinds, screen_action
--   FROM {database}.{table} FINAL
--   WHERE screen_action != '' AND time >= today() ORDER BY time

-- Tables created before virtual servers lack virtual_server; tables created
-- before rows stood on their own lack approval_id, approver, approved_ms
-- (which approval released a call, who gave it and when), policy_sha256
-- (the policy set that decided), pin_sha256 (the pinned definition the call
-- matched), delegation (the token's act chain, current actor first) and
-- token_jti. The firewall adds them at start, the same way; rows written
-- before read as empty ('', 0, []). Who approved which call today:
--   SELECT time, run_id, tool, approval_id, approver, approved_ms, policy_sha256, pin_sha256
--   FROM {database}.{table} FINAL
--   WHERE approval_id != '' AND time >= today() ORDER BY time

-- Tables created before the shadow policy lack shadow_decision (what the
-- shadow policy, [policy] shadow_dir, would have decided where it differs
-- from the live decision) and principal_claims (the token's claims the
-- decision used: agent, mode, projects, project_ceiling, iss; what
-- `mcp-firewall audit replay` re-decides with). The firewall adds them at
-- start, the same way.
-- The calls a candidate policy would change (mcp-firewall audit shadow):
--   SELECT tool, decision, shadow_decision, count() AS calls
--   FROM {database}.{table} FINAL
--   WHERE shadow_decision != '' AND time >= today() - 1
--   GROUP BY tool, decision, shadow_decision ORDER BY calls DESC

-- Tables created before delegated upstream credentials lack upstream_auth
-- (static, exchange or user: what a forwarded message reached its upstream
-- with) and credential_id (a stable id of that credential, a digest, never
-- the credential). The firewall adds them at start, the same way. Which
-- credentials a run used:
--   SELECT upstream, upstream_auth, credential_id, count() AS calls
--   FROM {database}.{table} FINAL
--   WHERE run_id = '…' AND upstream_auth != '' GROUP BY upstream, upstream_auth, credential_id

-- Per day, over final rows (a call's intent row is not counted; its completion
-- is): calls, denials, errors, distinct runs, latency quantiles, by tenant,
-- upstream, tool, decision, agent role and stop reason. Counts are uniqExact
-- states over event_id, so a row inserted twice still counts once (merge them
-- with uniqExactMerge / uniqExactIfMerge). Latency quantiles are not
-- duplicate-proof: a duplicated row weighs twice in the distribution.
--   SELECT day, tool, uniqExactMerge(calls) AS calls, uniqExactIfMerge(denials) AS denials,
--          uniqExactIfMerge(errors) AS errors, uniqExactMerge(runs) AS runs,
--          quantilesMerge(0.5, 0.95, 0.99)(latency_quantiles) AS p50_p95_p99_us
--   FROM {database}.{table}_daily_stats GROUP BY day, tool ORDER BY day, tool
CREATE TABLE IF NOT EXISTS {database}.{table}_daily_stats
(
    day               Date,
    tenant            String,
    upstream          String,
    tool              String,
    decision          String,
    agent_role        String,
    stop_reason       String,
    calls             AggregateFunction(uniqExact, UUID),
    denials           AggregateFunction(uniqExactIf, UUID, UInt8),
    errors            AggregateFunction(uniqExactIf, UUID, UInt8),
    runs              AggregateFunction(uniqExact, String),
    latency_quantiles AggregateFunction(quantiles(0.5, 0.95, 0.99), UInt64)
)
ENGINE = AggregatingMergeTree()
PARTITION BY toYYYYMMDD(day)
ORDER BY (day, tenant, upstream, tool, decision, agent_role, stop_reason)
SETTINGS index_granularity = 8192;

-- CAST(... AS String): 18.16 cannot group LowCardinality columns into a plain
-- String target column.
CREATE MATERIALIZED VIEW IF NOT EXISTS {database}.{table}_daily_stats_mv
TO {database}.{table}_daily_stats
AS SELECT
    toDate(time)                                               AS day,
    CAST(tenant AS String)                                     AS tenant,
    CAST(upstream AS String)                                   AS upstream,
    CAST(tool AS String)                                       AS tool,
    CAST(decision AS String)                                   AS decision,
    CAST(agent_role AS String)                                 AS agent_role,
    CAST(stop_reason AS String)                                AS stop_reason,
    uniqExactState(event_id)                                   AS calls,
    uniqExactIfState(event_id, CAST(decision AS String) = 'deny') AS denials,
    uniqExactIfState(event_id, is_error = 1 OR CAST(decision AS String) = 'error') AS errors,
    uniqExactState(run_id)                                     AS runs,
    quantilesState(0.5, 0.95, 0.99)(latency_us)                AS latency_quantiles
FROM {database}.{table}
WHERE row_version = 1
GROUP BY day, tenant, upstream, tool, decision, agent_role, stop_reason;

-- The hash chain (see docs/auditors.md, "Proving the audit trail"): one entry per row
-- the firewall shipped, per writer (replica) numbered seq = 1, 2, 3...,
-- row_hash = SHA-256 over the row's RowBinary bytes, link = SHA-256 over
-- the writer, seq, where its links begin, prev_hash (the link before) and
-- row_hash (entries of releases before links: link empty, row_hash over the
-- row, writer, seq and prev_hash). A plain MergeTree: entries are never collapsed, so merging the
-- audit table (an intent into its completion) never looks like a deletion,
-- and a second entry under a used seq stays visible. Read it with
-- `mcp-firewall audit verify`.
CREATE TABLE IF NOT EXISTS {database}.{table}_chain
(
    writer_id   String,
    seq         UInt64,
    event_id    UUID,
    row_version UInt8,
    time_ms     UInt64,
    prev_hash   FixedString(32),
    row_hash    FixedString(32),
    chained     DateTime('UTC'),
    link        FixedString(32)
)
ENGINE = MergeTree()
PARTITION BY toYYYYMMDD(chained)
ORDER BY (writer_id, seq)
SETTINGS index_granularity = 8192;

-- Signed checkpoints: every audit.checkpoint_every rows or seconds a writer
-- signs (writer_id, seq, row_hash, time_ms) with Ed25519; public_key says
-- which key (publish it: `mcp-firewall audit pubkey`). Kept forever (tiny);
-- a copy is appended to the writer's local checkpoint file.
CREATE TABLE IF NOT EXISTS {database}.{table}_checkpoints
(
    writer_id  String,
    seq        UInt64,
    row_hash   FixedString(32),
    time_ms    UInt64,
    signature  FixedString(64),
    public_key String,
    time       DateTime('UTC')
)
ENGINE = MergeTree()
PARTITION BY toYYYYMM(time)
ORDER BY (writer_id, seq)
SETTINGS index_granularity = 8192;
