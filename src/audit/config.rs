//! The `[audit]` section of the firewall's TOML config.
//!
//! Owns parsing (serde, unknown keys rejected), the documented defaults (one named
//! function each, so the defaults are greppable and shared by `Default` impls and
//! serde), and [`AuditConfig::validate`], which rejects values the pipeline cannot run
//! with. Invariant: secrets never live in this struct; only *where* to find the
//! ClickHouse password (`password_env` / `password_file`), so `Debug` output and
//! config dumps are safe to log.

use std::path::PathBuf;

use serde::Deserialize;

use super::{AuditError, FailMode, Risk};

/// The `[audit]` section: where rows are spooled, where they are shipped, and how
/// the proxy behaves when the spool cannot take a row.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct AuditConfig {
    /// Turns the whole pipeline on. When false, [`super::start`] returns a disabled
    /// [`super::Auditor`] whose `record` is a no-op (demo without ClickHouse).
    #[serde(default = "default_enabled")]
    pub enabled: bool,
    /// The ClickHouse endpoint and table rows are shipped to.
    #[serde(default)]
    pub clickhouse: ClickHouseConfig,
    /// The local write-ahead spool every row goes through.
    #[serde(default)]
    pub spool: SpoolConfig,
    /// How rows are grouped into `INSERT`s.
    #[serde(default)]
    pub batch: BatchConfig,
    /// What is removed or shortened before a row is written anywhere.
    #[serde(default)]
    pub redact: RedactConfig,
    /// Days of audit partitions kept in ClickHouse; `None` keeps everything.
    /// Enforced by a background task dropping whole day partitions.
    #[serde(default)]
    pub retention_days: Option<u32>,
    /// Whether a call proceeds when its audit row cannot be spooled, per risk class.
    #[serde(default)]
    pub on_spool_failure: FailModes,
    /// Name written to the `instance` column; defaults to the host name.
    #[serde(default)]
    pub instance: Option<String>,
    /// The firewall reports not ready (`/readyz`, reason `audit_backlog`)
    /// while the oldest row not yet in ClickHouse is older than this. 0
    /// disables. Default 300.
    #[serde(default = "default_max_backlog_age_s")]
    pub max_backlog_age_s: u64,
    /// Link every row into this writer's hash chain (`<table>_chain`) and
    /// sign checkpoints: what `mcp-firewall audit verify` proves. Default
    /// true; false ships unchained rows (nothing about them is provable;
    /// the bench's `firewall-unchained` target measures the chain's cost).
    #[serde(default = "default_chain")]
    pub chain: bool,
    /// This replica's name in the audit hash chain (`[A-Za-z0-9._:-]`, at
    /// most 128 bytes). Default: made at first start and kept in the spool
    /// (`<spool.dir>/writer_id`), so it survives restarts.
    #[serde(default)]
    pub writer_id: Option<String>,
    /// Ed25519 key (PKCS#8 PEM, `mcp-firewall audit keygen --out FILE`)
    /// that signs checkpoints of the chain. Without it rows are chained
    /// but no checkpoint is signed (logged at start).
    #[serde(default)]
    pub signing_key_file: Option<PathBuf>,
    /// A checkpoint is signed after this many rows or seconds, whichever
    /// comes first: `checkpoint_every = 1000`, or `{ rows = 1000, seconds = 10 }`.
    #[serde(default)]
    pub checkpoint_every: CheckpointEvery,
    /// The local append-only copy of every signed checkpoint (JSON lines).
    /// Default: `<spool.dir>/checkpoints.jsonl`.
    #[serde(default)]
    pub checkpoint_file: Option<PathBuf>,
}

/// `audit.checkpoint_every`: rows, or rows and seconds.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(untagged)]
pub enum CheckpointEvery {
    /// After this many rows (and at most [`DEFAULT_CHECKPOINT_SECONDS`] apart).
    Rows(u64),
    /// After `rows` rows or `seconds` seconds.
    Both {
        /// Rows between checkpoints.
        #[serde(default = "default_checkpoint_rows")]
        rows: u64,
        /// Seconds between checkpoints (while rows arrive).
        #[serde(default = "default_checkpoint_seconds")]
        seconds: u64,
    },
}

fn default_chain() -> bool {
    true
}

/// Default seconds between checkpoints.
pub const DEFAULT_CHECKPOINT_SECONDS: u64 = 10;

fn default_checkpoint_rows() -> u64 {
    1000
}

fn default_checkpoint_seconds() -> u64 {
    DEFAULT_CHECKPOINT_SECONDS
}

impl Default for CheckpointEvery {
    fn default() -> Self {
        CheckpointEvery::Both {
            rows: default_checkpoint_rows(),
            seconds: default_checkpoint_seconds(),
        }
    }
}

impl CheckpointEvery {
    /// Rows and seconds between checkpoints.
    pub fn limits(self) -> (u64, u64) {
        match self {
            CheckpointEvery::Rows(rows) => (rows, DEFAULT_CHECKPOINT_SECONDS),
            CheckpointEvery::Both { rows, seconds } => (rows, seconds),
        }
    }
}

/// Whether `id` may name a writer of the hash chain.
pub(crate) fn is_writer_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 128
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-'))
}

impl Default for AuditConfig {
    fn default() -> Self {
        Self {
            enabled: default_enabled(),
            clickhouse: ClickHouseConfig::default(),
            spool: SpoolConfig::default(),
            batch: BatchConfig::default(),
            redact: RedactConfig::default(),
            retention_days: None,
            on_spool_failure: FailModes::default(),
            instance: None,
            max_backlog_age_s: default_max_backlog_age_s(),
            chain: default_chain(),
            writer_id: None,
            signing_key_file: None,
            checkpoint_every: CheckpointEvery::default(),
            checkpoint_file: None,
        }
    }
}

/// `[audit.clickhouse]`: the destination of shipped rows.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClickHouseConfig {
    /// HTTP(S) endpoint of ClickHouse, e.g. `http://127.0.0.1:8123`.
    #[serde(default = "default_url")]
    pub url: String,
    /// Database holding the audit tables (an identifier: `[A-Za-z_][A-Za-z0-9_]*`).
    #[serde(default = "default_database")]
    pub database: String,
    /// Table rows are inserted into; the daily aggregate is `<table>_daily_stats`.
    #[serde(default = "default_table")]
    pub table: String,
    /// ClickHouse user.
    #[serde(default = "default_user")]
    pub user: String,
    /// Name of an environment variable holding the password (never logged).
    #[serde(default)]
    pub password_env: Option<String>,
    /// File whose content (trailing newline trimmed) is the password (never logged).
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// Create the database, tables and view at start when missing (idempotent DDL).
    #[serde(default = "default_create_schema")]
    pub create_schema: bool,
    /// Upper bound on one `INSERT` round trip before it counts as failed and is retried.
    #[serde(default = "default_insert_timeout_ms")]
    pub insert_timeout_ms: u64,
}

impl Default for ClickHouseConfig {
    fn default() -> Self {
        Self {
            url: default_url(),
            database: default_database(),
            table: default_table(),
            user: default_user(),
            password_env: None,
            password_file: None,
            create_schema: default_create_schema(),
            insert_timeout_ms: default_insert_timeout_ms(),
        }
    }
}

/// `[audit.spool]`: the local append-only log that makes `record` durable without
/// touching the network.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SpoolConfig {
    /// Directory of segment files; created if missing, locked against a second process.
    #[serde(default = "default_spool_dir")]
    pub dir: PathBuf,
    /// A segment is closed and a new one started once it reaches this size (at
    /// most a quarter of `max_bytes`: space is freed a whole segment at a time).
    #[serde(default = "default_segment_bytes")]
    pub segment_bytes: u64,
    /// fsync cadence; 0 fsyncs after every group write (slowest, power-loss safe).
    #[serde(default = "default_fsync_interval_ms")]
    pub fsync_interval_ms: u64,
    /// Bytes of unshipped rows the spool may hold; past this `record` fails.
    #[serde(default = "default_spool_max_bytes")]
    pub max_bytes: u64,
    /// Free bytes the spool's filesystem must keep; below, rows are refused
    /// like on a full spool (checked once a second). Default 64 MiB; 0 off.
    #[serde(default = "default_spool_min_free_bytes")]
    pub min_free_bytes: u64,
    /// Longest a spool write may take: while one runs longer (a frozen or
    /// failing disk), rows are refused at once and waiting calls stop
    /// waiting, so reads are served (counted as unaudited) and fail-closed
    /// risks refused instead of hanging. Default 1000.
    #[serde(default = "default_spool_write_timeout_ms")]
    pub write_timeout_ms: u64,
}

impl Default for SpoolConfig {
    fn default() -> Self {
        Self {
            dir: default_spool_dir(),
            segment_bytes: default_segment_bytes(),
            fsync_interval_ms: default_fsync_interval_ms(),
            max_bytes: default_spool_max_bytes(),
            min_free_bytes: default_spool_min_free_bytes(),
            write_timeout_ms: default_spool_write_timeout_ms(),
        }
    }
}

/// `[audit.batch]`: `INSERT` sizing and retry pacing.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct BatchConfig {
    /// Rows per `INSERT` at most.
    #[serde(default = "default_batch_max_rows")]
    pub max_rows: usize,
    /// Encoded bytes per `INSERT` at most (a single larger row still goes alone).
    #[serde(default = "default_batch_max_bytes")]
    pub max_bytes: usize,
    /// A partial batch is sent once its first row waited this long.
    #[serde(default = "default_batch_max_age_ms")]
    pub max_age_ms: u64,
    /// `INSERT`s running at once (acknowledged in order); more hides network
    /// latency to a remote ClickHouse.
    #[serde(default = "default_batch_max_in_flight")]
    pub max_in_flight: usize,
    /// First retry delay after a failed `INSERT`; doubles per attempt.
    #[serde(default = "default_retry_min_ms")]
    pub retry_min_ms: u64,
    /// Ceiling of the retry delay.
    #[serde(default = "default_retry_max_ms")]
    pub retry_max_ms: u64,
}

impl Default for BatchConfig {
    fn default() -> Self {
        Self {
            max_rows: default_batch_max_rows(),
            max_bytes: default_batch_max_bytes(),
            max_age_ms: default_batch_max_age_ms(),
            max_in_flight: default_batch_max_in_flight(),
            retry_min_ms: default_retry_min_ms(),
            retry_max_ms: default_retry_max_ms(),
        }
    }
}

/// `[audit.redact]`: secrets removal and size caps applied before a row exists
/// anywhere (spool included).
///
/// A pattern without glob metacharacters (`*`, `?`, `[`, `{`) matches any object
/// key *containing* it, ASCII case-insensitively (`token` hides `max_tokens` too:
/// over-redaction is the safe failure). A pattern with metacharacters is a glob
/// matched against the whole key, case-insensitively (`*_key` hides `ssh_key` but
/// not `keyboard`).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RedactConfig {
    /// Key patterns whose values are replaced by `"[REDACTED]"`, at any depth.
    #[serde(default = "default_key_patterns")]
    pub key_patterns: Vec<String>,
    /// The stored result summary is cut to this many bytes (on a char boundary).
    #[serde(default = "default_max_result_bytes")]
    pub max_result_bytes: usize,
    /// The stored arguments are cut to this many bytes (on a char boundary); a cut
    /// argument text is no longer valid JSON, which auditors see from its length.
    #[serde(default = "default_max_arguments_bytes")]
    pub max_arguments_bytes: usize,
}

impl Default for RedactConfig {
    fn default() -> Self {
        Self {
            key_patterns: default_key_patterns(),
            max_result_bytes: default_max_result_bytes(),
            max_arguments_bytes: default_max_arguments_bytes(),
        }
    }
}

/// `[audit.on_spool_failure]`: per risk class, whether a call whose row cannot be
/// spooled is served anyway (`"open"`) or refused (`"closed"`).
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct FailModes {
    /// Read-only calls; default open (serve, count the lost row).
    #[serde(default = "default_fail_read")]
    pub read: FailMode,
    /// Calls that change state; default closed.
    #[serde(default = "default_fail_write")]
    pub write: FailMode,
    /// Irreversible calls; default closed.
    #[serde(default = "default_fail_destructive")]
    pub destructive: FailMode,
}

impl Default for FailModes {
    fn default() -> Self {
        Self {
            read: default_fail_read(),
            write: default_fail_write(),
            destructive: default_fail_destructive(),
        }
    }
}

impl FailModes {
    /// The mode configured for `risk`.
    pub fn for_risk(&self, risk: Risk) -> FailMode {
        match risk {
            Risk::Read => self.read,
            Risk::Write => self.write,
            Risk::Destructive => self.destructive,
        }
    }
}

/// Audit is on unless switched off explicitly.
pub fn default_enabled() -> bool {
    true
}
/// A ClickHouse on the same host, plain HTTP.
pub fn default_url() -> String {
    "http://127.0.0.1:8123".to_owned()
}
/// Database `mcp_firewall`.
pub fn default_database() -> String {
    "mcp_firewall".to_owned()
}
/// Table `audit_events`.
pub fn default_table() -> String {
    "audit_events".to_owned()
}
/// ClickHouse's built-in `default` user.
pub fn default_user() -> String {
    "default".to_owned()
}
/// The firewall creates its schema unless told the DBA owns it.
pub fn default_create_schema() -> bool {
    true
}
/// 30 s per `INSERT`: long enough for a 10k-row batch on a busy server.
pub fn default_insert_timeout_ms() -> u64 {
    30_000
}
/// `/var/lib/mcp-firewall/audit-spool`.
pub fn default_spool_dir() -> PathBuf {
    PathBuf::from("/var/lib/mcp-firewall/audit-spool")
}
/// 64 MiB segments: few files, and a shipped segment frees space soon.
pub fn default_segment_bytes() -> u64 {
    64 << 20
}
/// fsync every 100 ms: a power loss costs at most that much, a crash nothing.
pub fn default_fsync_interval_ms() -> u64 {
    100
}
/// 1 GiB of unshipped rows (several million rows, hours of a ClickHouse outage).
pub fn default_spool_max_bytes() -> u64 {
    1 << 30
}
/// 10,000 rows per `INSERT`, ClickHouse's sweet spot for part sizes.
pub fn default_batch_max_rows() -> usize {
    10_000
}
/// 4 MiB per `INSERT` body before compression: ~10,000 typical rows, and a
/// bound on what the shipper holds (batches in flight plus the one filling).
pub fn default_batch_max_bytes() -> usize {
    4 << 20
}
/// A row waits at most 1 s for its batch to fill.
pub fn default_batch_max_age_ms() -> u64 {
    1_000
}
/// Two `INSERT`s in flight: one being parsed by ClickHouse while the next is sent.
pub fn default_batch_max_in_flight() -> usize {
    2
}
/// First retry after 200 ms.
pub fn default_retry_min_ms() -> u64 {
    200
}
/// Retries back off to one every 30 s.
/// 2 s: a recovered ClickHouse is probed within a second or two.
pub fn default_retry_max_ms() -> u64 {
    2_000
}
/// 300 s.
pub fn default_max_backlog_age_s() -> u64 {
    300
}
/// 64 MiB.
pub fn default_spool_min_free_bytes() -> u64 {
    64 << 20
}
/// 1000 ms.
pub fn default_spool_write_timeout_ms() -> u64 {
    1_000
}
/// `password`, `secret`, `token`, `authorization`, `api_key`.
pub fn default_key_patterns() -> Vec<String> {
    ["password", "secret", "token", "authorization", "api_key"]
        .into_iter()
        .map(str::to_owned)
        .collect()
}
/// 2 KiB of result per row.
pub fn default_max_result_bytes() -> usize {
    2048
}
/// 64 KiB of arguments per row.
pub fn default_max_arguments_bytes() -> usize {
    64 << 10
}
/// Reads are served when the spool fails.
pub fn default_fail_read() -> FailMode {
    FailMode::Open
}
/// Writes are refused when the spool fails.
pub fn default_fail_write() -> FailMode {
    FailMode::Closed
}
/// Destructive calls are refused when the spool fails.
pub fn default_fail_destructive() -> FailMode {
    FailMode::Closed
}

/// Smallest segment accepted: a header plus a few rows.
const MIN_SEGMENT_BYTES: u64 = 4096;

impl AuditConfig {
    /// Rejects values the pipeline cannot run with. Only meaningful when `enabled`.
    pub fn validate(&self) -> Result<(), AuditError> {
        let ch = &self.clickhouse;
        for (field, value) in [("database", &ch.database), ("table", &ch.table)] {
            if !is_identifier(value) {
                return Err(AuditError::InvalidIdentifier {
                    field,
                    value: value.clone(),
                });
            }
        }
        if !(ch.url.starts_with("http://") || ch.url.starts_with("https://")) {
            return Err(AuditError::InvalidUrl {
                url: ch.url.clone(),
            });
        }
        if ch.password_env.is_some() && ch.password_file.is_some() {
            return Err(AuditError::TwoPasswordSources);
        }
        if self.spool.segment_bytes < MIN_SEGMENT_BYTES {
            return Err(AuditError::SegmentTooSmall {
                segment_bytes: self.spool.segment_bytes,
                min: MIN_SEGMENT_BYTES,
            });
        }
        for (field, value) in [
            ("batch.max_rows", self.batch.max_rows),
            ("batch.max_bytes", self.batch.max_bytes),
            ("batch.max_in_flight", self.batch.max_in_flight),
            (
                "spool.write_timeout_ms",
                self.spool.write_timeout_ms as usize,
            ),
        ] {
            if value == 0 {
                return Err(AuditError::ZeroLimit { field });
            }
        }
        if self.batch.retry_min_ms == 0 || self.batch.retry_max_ms < self.batch.retry_min_ms {
            return Err(AuditError::RetryRange {
                min_ms: self.batch.retry_min_ms,
                max_ms: self.batch.retry_max_ms,
            });
        }
        if self.retention_days == Some(0) {
            return Err(AuditError::ZeroLimit {
                field: "retention_days",
            });
        }
        if let Some(id) = &self.writer_id {
            if !is_writer_id(id) {
                return Err(AuditError::InvalidWriterId { value: id.clone() });
            }
        }
        let (rows, seconds) = self.checkpoint_every.limits();
        if rows == 0 || seconds == 0 {
            return Err(AuditError::ZeroLimit {
                field: "checkpoint_every",
            });
        }
        Ok(())
    }
}

/// Database and table names are spliced into SQL, so only plain identifiers pass.
pub(crate) fn is_identifier(s: &str) -> bool {
    let mut bytes = s.bytes();
    matches!(bytes.next(), Some(b) if b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && s.len() <= 64
}
