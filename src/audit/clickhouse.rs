//! Everything that talks to ClickHouse: the HTTP client, the schema (the DDL in
//! `config/clickhouse/schema.sql`, compiled in), `INSERT`s, retention, and the
//! classification of failures into retry / reject.
//!
//! Invariants:
//! * Works against 18.16 and current releases: no `DateTime64`, `TTL`,
//!   `async_insert`, `JSONExtract*`; row validation off (18.16 lacks
//!   `RowBinaryWithNamesAndTypes`); the `INSERT` names its columns.
//! * The connector sets `TCP_NODELAY`: with lz4 bodies, Nagle plus delayed ACKs
//!   otherwise stall every `INSERT` by ~40 ms.
//! * The password is resolved once, handed to the client, and never logged.
//! * Database and table names are validated identifiers before reaching SQL here.

use std::time::Duration;

use bytes::Bytes;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::rt::TokioExecutor;
use thiserror::Error;

use super::config::ClickHouseConfig;
use super::record::COLUMNS;

/// The DDL shipped for DBAs, with `{database}` and `{table}` placeholders.
pub const SCHEMA_SQL: &str = include_str!("../../config/clickhouse/schema.sql");

/// Setting that 18.16 requires to create `LowCardinality` columns.
const LOW_CARDINALITY_SETTING: &str = "allow_experimental_low_cardinality_type";

/// Largest chunk handed to the client per `send`; each chunk is one lz4 block.
const SEND_CHUNK: usize = 1 << 20;

/// Why the ClickHouse client could not be set up.
#[derive(Debug, Error)]
pub enum ClickHouseError {
    /// `password_env` names a variable that is unset or not UTF-8.
    #[error("environment variable {var} (audit.clickhouse.password_env) is not set")]
    PasswordEnv {
        /// The variable name.
        var: String,
    },
    /// `password_file` cannot be read.
    #[error("cannot read audit.clickhouse.password_file {path}: {source}")]
    PasswordFile {
        /// The file.
        path: std::path::PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// TLS setup for an `https://` URL failed.
    #[error("TLS setup for ClickHouse failed: {source}")]
    Tls {
        /// rustls' reason.
        #[source]
        source: rustls::Error,
    },
}

/// Builds the ClickHouse client: our own hyper client (TCP_NODELAY, keep-alive,
/// http and https), lz4 compression, no row validation.
pub(crate) fn build_client(cfg: &ClickHouseConfig) -> Result<clickhouse::Client, ClickHouseError> {
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.set_keepalive(Some(Duration::from_secs(60)));
    http.enforce_http(false);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())
        .map_err(|source| ClickHouseError::Tls { source })?
        .https_or_http()
        .enable_http1()
        .wrap_connector(http);
    // ClickHouse closes idle keep-alive connections after 3 s (18.16 default);
    // dropping ours first avoids sending an INSERT into a closing socket.
    let hyper = HyperClient::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(2))
        .pool_max_idle_per_host(4)
        .build(https);
    let mut client = clickhouse::Client::with_http_client(hyper)
        .with_url(cfg.url.as_str())
        .with_user(cfg.user.as_str())
        .with_validation(false);
    if let Some(pw) = resolve_password(cfg)? {
        client = client.with_password(pw);
    }
    Ok(client)
}

fn resolve_password(cfg: &ClickHouseConfig) -> Result<Option<String>, ClickHouseError> {
    if let Some(var) = &cfg.password_env {
        return std::env::var(var)
            .map(Some)
            .map_err(|_| ClickHouseError::PasswordEnv { var: var.clone() });
    }
    if let Some(path) = &cfg.password_file {
        let text =
            std::fs::read_to_string(path).map_err(|source| ClickHouseError::PasswordFile {
                path: path.clone(),
                source,
            })?;
        return Ok(Some(text.trim_end_matches(['\n', '\r']).to_owned()));
    }
    Ok(None)
}

/// The schema statements for `database`/`table`, in execution order, without
/// comments and without the `SET` (sent as a per-query setting instead).
pub fn schema_statements(database: &str, table: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in SCHEMA_SQL.lines() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with("--") {
            continue;
        }
        current.push_str(line);
        current.push('\n');
        if trimmed.ends_with(';') {
            let stmt = current.trim().trim_end_matches(';').trim().to_owned();
            current.clear();
            if !stmt.to_ascii_uppercase().starts_with("SET ") {
                out.push(
                    stmt.replace("{database}", database)
                        .replace("{table}", table),
                );
            }
        }
    }
    out
}

/// The retention job's question: the active day partitions of the audit
/// table and its daily aggregate (`table`, `partition` as TabSeparated).
pub fn partitions_sql(database: &str, table: &str) -> String {
    format!(
        "SELECT DISTINCT table, partition FROM system.parts \
         WHERE database = '{database}' AND table IN ('{table}', '{table}_daily_stats', '{table}_chain') AND active"
    )
}

/// The retention job's statement for one expired day partition of `table`.
pub fn drop_partition_sql(database: &str, table: &str, partition: u32) -> String {
    format!("ALTER TABLE {database}.{table} DROP PARTITION {partition}")
}

/// Columns added after the first release, with their types: a table
/// created before them gets them at start.
const ADDED_COLUMNS: [(&str, &str); 16] = [
    ("row_version", "UInt8 DEFAULT 1"),
    ("screen_kinds", "Array(String)"),
    ("screen_action", "LowCardinality(String)"),
    ("run_labels", "Array(String)"),
    ("virtual_server", "LowCardinality(String)"),
    ("approval_id", "String"),
    ("approver", "String"),
    ("approved_ms", "UInt64"),
    ("policy_sha256", "String"),
    ("pin_sha256", "String"),
    ("delegation", "Array(String)"),
    ("token_jti", "String"),
    ("shadow_decision", "LowCardinality(String)"),
    ("principal_claims", "String"),
    ("upstream_auth", "LowCardinality(String)"),
    ("credential_id", "String"),
];

/// The migration of a table created by an earlier release: per column
/// added since the first release, in order, its name and the statement
/// that adds it (`ALTER TABLE … ADD COLUMN`), run at start for each one the
/// table lacks (18.16 has no `ADD COLUMN IF NOT EXISTS`).
pub fn added_columns_sql(database: &str, table: &str) -> Vec<(&'static str, String)> {
    ADDED_COLUMNS
        .iter()
        .map(|(column, ty)| {
            (
                *column,
                format!("ALTER TABLE {database}.{table} ADD COLUMN {column} {ty}"),
            )
        })
        .collect()
}

/// Columns added to the chain table after its first release (`link`:
/// entries of earlier releases keep it empty).
const ADDED_CHAIN_COLUMNS: [(&str, &str); 1] = [("link", "FixedString(32)")];

/// The migration of a chain table created by an earlier release, as
/// [`added_columns_sql`].
pub fn added_chain_columns_sql(database: &str, table: &str) -> Vec<(&'static str, String)> {
    ADDED_CHAIN_COLUMNS
        .iter()
        .map(|(column, ty)| {
            (
                *column,
                format!("ALTER TABLE {database}.{table}_chain ADD COLUMN {column} {ty}"),
            )
        })
        .collect()
}

/// Creates what is missing of the schema (idempotent).
pub(crate) async fn ensure_schema(
    client: &clickhouse::Client,
    database: &str,
    table: &str,
) -> Result<(), clickhouse::error::Error> {
    let version = client
        .query_raw("SELECT version()")
        .fetch_bytes("TabSeparated")?
        .collect()
        .await?;
    // Only 18.x needs (and knows) the LowCardinality opt-in; later releases made
    // it obsolete and may reject it as unknown.
    let needs_opt_in = needs_low_cardinality_opt_in(&String::from_utf8_lossy(&version));
    for stmt in schema_statements(database, table) {
        let mut q = client.query_raw(&stmt);
        if needs_opt_in {
            q = q.with_setting(LOW_CARDINALITY_SETTING, "1");
        }
        q.execute().await?;
    }
    // Columns later releases added to the table (18.16 has no ADD COLUMN
    // IF NOT EXISTS, so look first).
    let chain = format!("{table}_chain");
    let main = added_columns_sql(database, table)
        .into_iter()
        .map(|(c, sql)| (table, c, sql));
    let chained = added_chain_columns_sql(database, table)
        .into_iter()
        .map(|(c, sql)| (chain.as_str(), c, sql));
    for (table, column, alter) in main.chain(chained) {
        let present = client
            .query_raw(&format!(
                "SELECT count() FROM system.columns WHERE database = '{database}' AND table = '{table}' AND name = '{column}'"
            ))
            .fetch_bytes("TabSeparated")?
            .collect()
            .await?;
        if String::from_utf8_lossy(&present).trim() == "0" {
            let mut q = client.query_raw(&alter);
            if needs_opt_in {
                q = q.with_setting(LOW_CARDINALITY_SETTING, "1");
            }
            q.execute().await?;
        }
    }
    Ok(())
}

/// Pure: whether a server of `version` (`18.16.1`, `24.8.4.13`) needs
/// `allow_experimental_low_cardinality_type` to create `LowCardinality` columns.
pub(crate) fn needs_low_cardinality_opt_in(version: &str) -> bool {
    version
        .trim()
        .split('.')
        .next()
        .and_then(|major| major.parse::<u32>().ok())
        .is_some_and(|major| major < 19)
}

/// `INSERT INTO db.table (columns…) FORMAT RowBinary`.
pub(crate) fn insert_sql(database: &str, table: &str) -> String {
    format!(
        "INSERT INTO {database}.{table} ({}) FORMAT RowBinary",
        COLUMNS.join(", ")
    )
}

/// `INSERT INTO db.table_chain (columns…) FORMAT RowBinary`.
pub(crate) fn chain_insert_sql(database: &str, table: &str) -> String {
    format!(
        "INSERT INTO {database}.{table}_chain ({}) FORMAT RowBinary",
        super::chain::CHAIN_COLUMNS.join(", ")
    )
}

/// `INSERT INTO db.table_checkpoints (columns…) FORMAT RowBinary`.
pub(crate) fn checkpoint_insert_sql(database: &str, table: &str) -> String {
    format!(
        "INSERT INTO {database}.{table}_checkpoints ({}) FORMAT RowBinary",
        super::chain::CHECKPOINT_COLUMNS.join(", ")
    )
}

/// What ClickHouse says of a writer's chain, for a writer whose spool
/// lost the chain's head (see `Shipper::learn_head`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct ChainState {
    /// The entry of the first row to send, if it was sent before: the
    /// `seq` before it and that entry's link.
    pub replay: Option<(u64, [u8; 32])>,
    /// The writer's last entry: its `seq` and link.
    pub last: Option<(u64, [u8; 32])>,
    /// The first `seq` of the writer's chain with a link.
    pub linked_from: Option<u64>,
    /// The writer's checkpoints in the table (`seq`, link) that `key`
    /// verifies, the last one.
    pub signed: Option<(u64, [u8; 32])>,
}

/// An empty link (entries of releases before links), as SQL.
pub(crate) const EMPTY_LINK_SQL: &str =
    "unhex('0000000000000000000000000000000000000000000000000000000000000000')";

/// The statements [`chain_state`] runs: the entry of the first row to send
/// (when there is one), the writer's last entry and link, where its links
/// begin.
pub fn chain_state_sql(
    database: &str,
    table: &str,
    writer_id: &str,
    first: Option<(uuid::Uuid, u8)>,
) -> [Option<String>; 3] {
    let chain = format!("{database}.{table}_chain");
    [
        first.map(|(event_id, version)| {
            format!(
                "SELECT seq, prev_hash FROM {chain} WHERE writer_id = '{writer_id}' \
                 AND event_id = toUUID('{event_id}') AND row_version = {version} ORDER BY seq LIMIT 1"
            )
        }),
        Some(format!(
            "SELECT seq, if(link = {EMPTY_LINK_SQL}, row_hash, link) FROM {chain} \
             WHERE writer_id = '{writer_id}' ORDER BY seq DESC LIMIT 1"
        )),
        Some(format!(
            "SELECT seq, link FROM {chain} WHERE writer_id = '{writer_id}' \
             AND link != {EMPTY_LINK_SQL} ORDER BY seq LIMIT 1"
        )),
    ]
}

/// What ClickHouse has of `writer_id`'s chain (`first`: the first row to
/// send, `(event_id, row_version)`; `key`: the writer's own public key).
/// `writer_id` is a validated name (`[A-Za-z0-9._:-]`).
pub(crate) async fn chain_state(
    client: &clickhouse::Client,
    database: &str,
    table: &str,
    writer_id: &str,
    first: Option<(uuid::Uuid, u8)>,
    key: Option<[u8; 32]>,
) -> Result<ChainState, clickhouse::error::Error> {
    let mut state = ChainState::default();
    let [replay, last, linked] = chain_state_sql(database, table, writer_id, first);
    if let Some(sql) = replay {
        state.replay = seq_and_hash(client, &sql)
            .await?
            .map(|(seq, prev)| (seq.saturating_sub(1), prev));
    }
    state.last = seq_and_hash(client, last.as_deref().unwrap_or_default()).await?;
    state.linked_from = seq_and_hash(client, linked.as_deref().unwrap_or_default())
        .await?
        .map(|(seq, _)| seq);
    if let Some(key) = key {
        let sql = format!(
            "SELECT {} FROM {database}.{table}_checkpoints WHERE writer_id = '{writer_id}'",
            super::chain::CHECKPOINT_COLUMNS.join(", ")
        );
        let bytes = client
            .query_raw(&sql)
            .fetch_bytes("RowBinary")?
            .collect()
            .await?;
        let mut at = 0;
        while let Some((cp, len)) = bytes
            .get(at..)
            .and_then(super::chain::SignedCheckpoint::decode)
        {
            at += len;
            if cp.verify(&[key]) && state.signed.is_none_or(|(seq, _)| seq < cp.checkpoint.seq) {
                state.signed = Some((cp.checkpoint.seq, cp.checkpoint.row_hash));
            }
        }
    }
    Ok(state)
}

/// The one `(UInt64, FixedString(32))` row `sql` selects, if any.
async fn seq_and_hash(
    client: &clickhouse::Client,
    sql: &str,
) -> Result<Option<(u64, [u8; 32])>, clickhouse::error::Error> {
    let bytes = client
        .query_raw(sql)
        .fetch_bytes("RowBinary")?
        .collect()
        .await?;
    let (Some(seq), Some(hash)) = (bytes.get(..8), bytes.get(8..40)) else {
        return Ok(None);
    };
    let mut s = [0u8; 8];
    s.copy_from_slice(seq);
    let mut h = [0u8; 32];
    h.copy_from_slice(hash);
    Ok(Some((u64::from_le_bytes(s), h)))
}

/// Sends one batch body (concatenated RowBinary rows) as a single `INSERT`.
/// `body` is shared, so a retry re-sends it without copying.
pub(crate) async fn insert(
    client: &clickhouse::Client,
    sql: &str,
    body: &Bytes,
    timeout: Duration,
) -> Result<(), clickhouse::error::Error> {
    let mut insert = client
        .insert_formatted_with(sql.to_owned())
        .with_timeouts(Some(timeout), Some(timeout));
    let mut start = 0;
    while start < body.len() {
        let end = (start + SEND_CHUNK).min(body.len());
        insert.send(body.slice(start..end)).await?;
        start = end;
    }
    insert.end().await
}

/// What to do with a batch whose `INSERT` failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Disposition {
    /// Transient or operator-fixable (network, overload, auth, missing table):
    /// keep the batch and retry with backoff.
    Retry,
    /// ClickHouse cannot parse the data; retrying cannot help. Move the batch to
    /// `rejected/`, count it, and go on.
    Reject,
}

/// Server exception codes that mean "this data is bad", not "try later".
/// 6 CANNOT_PARSE_TEXT, 26/27 CANNOT_PARSE_*, 33 CANNOT_READ_ALL_DATA,
/// 38/41 CANNOT_PARSE_DATE(TIME), 53 TYPE_MISMATCH, 69 ARGUMENT_OUT_OF_BOUND,
/// 70 CANNOT_CONVERT_TYPE, 72 CANNOT_PARSE_NUMBER, 117 INCORRECT_DATA,
/// 131 TOO_LARGE_STRING_SIZE. Deliberately absent: 40 CHECKSUM_DOESNT_MATCH (a
/// corrupted transfer is retried) and schema errors such as 16 NO_SUCH_COLUMN or
/// 60 UNKNOWN_TABLE (the operator fixes the schema; the rows are fine).
const BAD_DATA_CODES: &[u32] = &[6, 26, 27, 33, 38, 41, 53, 69, 70, 72, 117, 131];

/// Pure: the disposition for an `INSERT` error.
pub(crate) fn classify(err: &clickhouse::error::Error) -> Disposition {
    use clickhouse::error::Error as E;
    match err {
        E::BadResponse(msg) => classify_code(exception_code(msg)),
        _ => Disposition::Retry,
    }
}

/// Pure: the disposition for a server exception code (`None`: no code seen).
pub(crate) fn classify_code(code: Option<u32>) -> Disposition {
    match code {
        Some(c) if BAD_DATA_CODES.contains(&c) => Disposition::Reject,
        _ => Disposition::Retry,
    }
}

/// The exception code in a ClickHouse error text: `Code: 117. DB::Exception…`
/// (current releases) or `Code: 117, e.displayText() = …` (18.16).
pub(crate) fn exception_code(msg: &str) -> Option<u32> {
    let idx = msg.find("Code:")?;
    let digits: &str = msg[idx + 5..].trim_start();
    let end = digits
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(digits.len());
    digits[..end].parse().ok()
}

/// Pure: partitions (`YYYYMMDD`) strictly older than `cutoff` (`YYYYMMDD`).
pub(crate) fn partitions_to_drop(partitions: &[u32], cutoff: u32) -> Vec<u32> {
    let mut out: Vec<u32> = partitions.iter().copied().filter(|&p| p < cutoff).collect();
    out.sort_unstable();
    out.dedup();
    out
}

/// Drops day partitions older than `keep_days` (counting today) from the audit
/// table, its daily aggregate and its chain (checkpoints are kept). Returns how many partitions were dropped.
pub(crate) async fn enforce_retention(
    client: &clickhouse::Client,
    database: &str,
    table: &str,
    keep_days: u32,
    today_days: i64,
) -> Result<usize, clickhouse::error::Error> {
    let cutoff = crate::clock::yyyymmdd_from_days(today_days - i64::from(keep_days) + 1);
    let stats = format!("{table}_daily_stats");
    let chain = format!("{table}_chain");
    let sql = partitions_sql(database, table);
    let text = client
        .query_raw(&sql)
        .fetch_bytes("TabSeparated")?
        .collect()
        .await?;
    let text = String::from_utf8_lossy(&text);
    let mut dropped = 0;
    for name in [table, stats.as_str(), chain.as_str()] {
        let parts: Vec<u32> = text
            .lines()
            .filter_map(|l| l.split_once('\t'))
            .filter(|(t, _)| *t == name)
            .filter_map(|(_, p)| p.trim_matches('\'').parse().ok())
            .collect();
        for p in partitions_to_drop(&parts, cutoff) {
            client
                .query_raw(&drop_partition_sql(database, name, p))
                .execute()
                .await?;
            tracing::info!(
                table = name,
                partition = p,
                "audit retention: dropped partition"
            );
            dropped += 1;
        }
    }
    Ok(dropped)
}

#[cfg(test)]
#[path = "clickhouse_tests.rs"]
mod tests;
