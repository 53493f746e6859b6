//! Approvals in PostgreSQL, shared by every replica (`[approvals] store =
//! "postgres"`).
//!
//! One row per approval. Every transition is one conditional `UPDATE …
//! RETURNING`, so of two replicas racing to approve, consume, withdraw or
//! expire the same approval exactly one sees the row come back; that
//! replica emits the transition (audit row, webhook, metrics), the other
//! sees nothing happened. A partial unique index on the call key over live
//! rows makes filing idempotent: an identical call on any replica finds
//! the same pending approval.
//!
//! A call held on replica B waits on a local watch; a trigger sends
//! `NOTIFY mcp_firewall_approvals, '<id> <status>'` on every status change
//! and B's listener connection wakes the waiter. If that connection is lost,
//! a slow poll of the waited ids covers the gap until it is back.
//!
//! The schema is created and migrated at start (or by `mcp-firewall
//! migrate`), under an advisory lock so replicas starting together migrate
//! once. Every statement has a deadline and a circuit breaker in front:
//! with the database down, gated calls are answered "approval unavailable"
//! at once, and nothing else on the request path waits on it.
//!
//! The service reaches it through [`ApprovalBackend`]; each `WHERE` states
//! the checks it shares with the file store ([`rules`]), which also explain
//! a refusal from the row read back.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use dashmap::DashMap;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use futures_util::future::BoxFuture;
use tokio::sync::watch;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use crate::state::breaker::{Breaker, Permit};

use super::backend::{Answer, ApprovalBackend, Subscription};
use super::rules;
use super::{
    Approval, ApprovalError, ApprovalId, ApprovalsConfig, Approver, CallKey, Decision, NewApproval,
    RoundRefused, Status, Transition,
};

/// The channel status changes are announced on.
const CHANNEL: &str = "mcp_firewall_approvals";
/// Serialises migrations of replicas starting at once.
const MIGRATION_LOCK: i64 = 0x6d63_7066_7701;

/// Schema versions, applied in order, each once.
const MIGRATIONS: &[&str] = &[
    r#"
CREATE TABLE mcp_firewall_approvals (
    id text PRIMARY KEY,
    tenant text NOT NULL,
    run_id text NOT NULL,
    subject text NOT NULL,
    upstream text NOT NULL,
    tool text NOT NULL,
    args_sha256 bytea NOT NULL,
    agent text NOT NULL,
    risk text NOT NULL,
    arguments text NOT NULL,
    token_exp bigint NOT NULL,
    preview_tool text,
    self_approval boolean NOT NULL,
    created_ms bigint NOT NULL,
    expires_ms bigint NOT NULL,
    status text NOT NULL,
    decided_approved boolean,
    decided_by text,
    decided_ms bigint,
    reason text,
    consumed_ms bigint,
    ended_ms bigint
);
CREATE UNIQUE INDEX mcp_firewall_approvals_live ON mcp_firewall_approvals
    (tenant, run_id, subject, upstream, tool, args_sha256)
    WHERE status IN ('pending', 'approved');
CREATE INDEX mcp_firewall_approvals_by_tenant ON mcp_firewall_approvals (tenant, created_ms DESC);
CREATE INDEX mcp_firewall_approvals_due ON mcp_firewall_approvals (expires_ms)
    WHERE status IN ('pending', 'approved');
CREATE INDEX mcp_firewall_approvals_ended ON mcp_firewall_approvals (ended_ms)
    WHERE ended_ms IS NOT NULL;
CREATE FUNCTION mcp_firewall_approvals_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('mcp_firewall_approvals', NEW.id || ' ' || NEW.status);
    RETURN NULL;
END
$$;
CREATE TRIGGER mcp_firewall_approvals_notify
    AFTER INSERT OR UPDATE OF status ON mcp_firewall_approvals
    FOR EACH ROW EXECUTE FUNCTION mcp_firewall_approvals_notify();
"#,
    r#"
ALTER TABLE mcp_firewall_approvals ADD COLUMN rounds integer NOT NULL DEFAULT 0;
"#,
    r#"
ALTER TABLE mcp_firewall_approvals ADD COLUMN why text;
"#,
];

const COLS: &str = "id, tenant, run_id, subject, upstream, tool, args_sha256, agent, risk, \
    arguments, token_exp, preview_tool, self_approval, created_ms, expires_ms, status, \
    decided_approved, decided_by, decided_ms, reason, consumed_ms, rounds, why";

const KEY_MATCH: &str = "tenant = $1 AND run_id = $2 AND subject = $3 AND upstream = $4 \
    AND tool = $5 AND args_sha256 = $6";

/// The parameters `$1`–`$6` of [`KEY_MATCH`] for one call, bound here only.
struct KeyParams<'a> {
    key: &'a CallKey,
    args_sha256: &'a [u8],
}

impl<'a> KeyParams<'a> {
    fn new(key: &'a CallKey) -> KeyParams<'a> {
        KeyParams {
            key,
            args_sha256: key.args_sha256.as_slice(),
        }
    }

    /// `$1`–`$6`, then `extra` from `$7` on.
    fn and<'b>(&'b self, extra: &[&'b (dyn ToSql + Sync)]) -> Vec<&'b (dyn ToSql + Sync)> {
        let k = self.key;
        let mut params: Vec<&'b (dyn ToSql + Sync)> = vec![
            &k.tenant,
            &k.run_id,
            &k.subject,
            &k.upstream,
            &k.tool,
            &self.args_sha256,
        ];
        params.extend_from_slice(extra);
        params
    }
}

/// The PostgreSQL side of [`super::Approvals`].
pub(crate) struct PgStore {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Pool,
    pg: tokio_postgres::Config,
    tls: tokio_postgres_rustls::MakeRustlsConnect,
    breaker: Breaker,
    timeout: Duration,
    poll: Duration,
    migrated: AtomicBool,
    pending: AtomicUsize,
    /// `created_ms` of the oldest pending approval (0: none), as of the last sweep.
    oldest_pending: AtomicU64,
    waiters: DashMap<String, watch::Sender<Status>>,
}

/// The connection settings of `cfg`: URL, password, TLS roots.
pub(crate) fn connection(
    cfg: &ApprovalsConfig,
) -> anyhow::Result<(
    tokio_postgres::Config,
    tokio_postgres_rustls::MakeRustlsConnect,
)> {
    let url = cfg
        .postgres_url
        .as_deref()
        .ok_or_else(|| anyhow::anyhow!("approvals.postgres_url is required"))?;
    let mut pg: tokio_postgres::Config = url
        .parse()
        .map_err(|e| anyhow::anyhow!("approvals.postgres_url: {e}"))?;
    match (&cfg.postgres_password_env, &cfg.postgres_password_file) {
        (Some(var), _) => {
            let pw = std::env::var(var).map_err(|_| {
                anyhow::anyhow!(
                    "approvals.postgres_password_env: environment variable {var} is not set"
                )
            })?;
            pg.password(pw);
        }
        (None, Some(path)) => {
            let pw = std::fs::read_to_string(path).map_err(|e| {
                anyhow::anyhow!(
                    "approvals.postgres_password_file: cannot read {}: {e}",
                    path.display()
                )
            })?;
            pg.password(pw.trim_end_matches(['\r', '\n']));
        }
        (None, None) => {}
    }
    if pg.get_connect_timeout().is_none() {
        pg.connect_timeout(Duration::from_millis(cfg.postgres_timeout_ms.max(1000)));
    }
    pg.application_name("mcp-firewall");
    // TLS (sslmode=prefer or require) verifies the server against the
    // system's roots, or the configured CA.
    let mut roots = rustls::RootCertStore::empty();
    match &cfg.postgres_ca_file {
        Some(path) => {
            let pem = std::fs::read(path).map_err(|e| {
                anyhow::anyhow!(
                    "approvals.postgres_ca_file: cannot read {}: {e}",
                    path.display()
                )
            })?;
            use rustls_pki_types::pem::PemObject;
            for cert in rustls_pki_types::CertificateDer::pem_slice_iter(&pem) {
                let cert = cert.map_err(|e| anyhow::anyhow!("approvals.postgres_ca_file: {e}"))?;
                roots
                    .add(cert)
                    .map_err(|e| anyhow::anyhow!("approvals.postgres_ca_file: {e}"))?;
            }
        }
        None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
    }
    let tls = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok((pg, tokio_postgres_rustls::MakeRustlsConnect::new(tls)))
}

fn failed(e: impl std::fmt::Display) -> ApprovalError {
    ApprovalError::Unavailable(e.to_string())
}

impl PgStore {
    /// A pool for `cfg` (connections are made on first use), with its
    /// listener and poller started. The schema is migrated on first use if
    /// the database was unreachable at start.
    pub(crate) async fn open(cfg: &ApprovalsConfig) -> anyhow::Result<PgStore> {
        let (pg, tls) = connection(cfg)?;
        let timeout = Duration::from_millis(cfg.postgres_timeout_ms);
        let manager = Manager::from_config(
            pg.clone(),
            tls.clone(),
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(cfg.postgres_pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(timeout))
            .create_timeout(Some(timeout.max(Duration::from_millis(1000))))
            .recycle_timeout(Some(timeout))
            .build()
            .map_err(|e| anyhow::anyhow!("approvals.postgres_url: {e}"))?;
        let inner = Arc::new(Inner {
            pool,
            pg,
            tls,
            breaker: Breaker::new(3, Duration::from_millis(1000)),
            timeout,
            poll: Duration::from_millis(cfg.postgres_poll_ms.max(100)),
            migrated: AtomicBool::new(false),
            pending: AtomicUsize::new(0),
            oldest_pending: AtomicU64::new(0),
            waiters: DashMap::new(),
        });
        match inner.migrate().await {
            Ok(()) => {}
            Err(e) => {
                tracing::error!(error = %e, "approvals database not ready at start; gated calls are refused until it is")
            }
        }
        tokio::spawn(listen(Arc::downgrade(&inner)));
        tokio::spawn(poll(Arc::downgrade(&inner)));
        Ok(PgStore { inner })
    }

    /// One approval, any tenant, as stored.
    async fn get_any(&self, id: &str) -> Result<Option<Approval>, ApprovalError> {
        self.inner
            .run(|c| async move {
                c.query_opt(
                    &format!("SELECT {COLS} FROM mcp_firewall_approvals WHERE id = $1"),
                    &[&id],
                )
                .await?
                .map(|r| approval(&r))
                .transpose()
            })
            .await
    }

    /// Wakes the local waiters of `transitions`.
    fn wake_all(&self, transitions: &[Transition]) {
        for t in transitions {
            self.inner.wake(t.approval.id.as_str(), t.to);
        }
    }
}

/// Every operation is one or a few statements through [`Inner::run`]; a
/// transition is one conditional `UPDATE` whose `WHERE` states the rules
/// ([`rules`]), so of racing replicas exactly one sees the row come back.
impl ApprovalBackend for PgStore {
    /// As of the last sweep.
    fn pending(&self) -> usize {
        self.inner.pending.load(Ordering::Relaxed)
    }

    /// Whether the breaker is open or the schema is not migrated yet.
    fn unavailable(&self) -> bool {
        self.inner.breaker.is_open() || !self.inner.migrated.load(Ordering::Relaxed)
    }

    /// As of the last sweep.
    fn oldest_pending_ms(&self, _now: u64) -> Option<u64> {
        Some(self.inner.oldest_pending.load(Ordering::Relaxed)).filter(|ms| *ms > 0)
    }

    /// Idempotent across replicas: the partial unique index over live rows
    /// lets one filing of a call win; the others take its approval.
    fn request<'a>(
        &'a self,
        new: NewApproval,
        now: u64,
        expiry_ms: u64,
        max_pending: usize,
        out: &'a mut Vec<Transition>,
    ) -> Answer<'a, Approval> {
        Box::pin(async move {
            let expires = rules::deadline(&new, now, expiry_ms)?;
            let (new, now_i) = (&new, to_i64(now));
            let key = &new.key;
            let (result, transitions) = self
                .inner
                .run(|c| async move {
                    // An overdue live approval of this call ends first.
                    let mut transitions = expire_overdue(&c, key, now_i).await?;
                    for _ in 0..3 {
                        if let Some(a) = live_approval(&c, key).await? {
                            return Ok((Ok(a), transitions));
                        }
                        let pending = pending_count(&c, &key.tenant, now_i).await?;
                        if let Err(e) = rules::check_room(&key.tenant, pending, max_pending) {
                            return Ok((Err(e), transitions));
                        }
                        if let Some(a) = insert_pending(&c, new, now_i, expires).await? {
                            transitions.push(Transition {
                                approval: a.clone(),
                                from: None,
                                to: Status::Pending,
                                at_ms: now,
                            });
                            return Ok((Ok(a), transitions));
                        }
                        // Another replica filed the same call in between:
                        // take its approval on the next round.
                    }
                    Err(Pg::Other(
                        "the approval for this call kept changing; try again".into(),
                    ))
                })
                .await?;
            self.wake_all(&transitions);
            out.extend(transitions);
            result
        })
    }

    /// `Err` when the database cannot be asked (the call does not run).
    fn consume<'a>(
        &'a self,
        key: &'a CallKey,
        now: u64,
        out: &'a mut Vec<Transition>,
    ) -> Answer<'a, Option<Approval>> {
        Box::pin(async move {
            let now_i = to_i64(now);
            let row = self
                .inner
                .run(|c| async move {
                    c.query_opt(
                        &format!(
                            "UPDATE mcp_firewall_approvals SET status = 'consumed', consumed_ms = $7, \
                             ended_ms = $7 WHERE {KEY_MATCH} AND status = 'approved' AND expires_ms > $7 \
                             RETURNING {COLS}"
                        ),
                        &KeyParams::new(key).and(&[&now_i]),
                    )
                    .await?
                    .map(|r| approval(&r))
                    .transpose()
                })
                .await?;
            Ok(row.inspect(|a| {
                let t = Transition {
                    approval: a.clone(),
                    from: Some(Status::Approved),
                    to: Status::Consumed,
                    at_ms: now,
                };
                self.wake_all(std::slice::from_ref(&t));
                out.push(t);
            }))
        })
    }

    /// One `UPDATE` that moves `rounds` from `round - 1` to `round`, so one
    /// retry wins.
    fn spend_round<'a>(
        &'a self,
        tenant: &'a str,
        id: &'a ApprovalId,
        round: u32,
        _now: u64,
    ) -> BoxFuture<'a, Result<(), RoundRefused>> {
        Box::pin(async move {
            rules::rounds_before(round)?;
            let Ok(round_i) = i32::try_from(round) else {
                return Err(RoundRefused::Spent);
            };
            let found = self
                .inner
                .run(|c| async move {
                    let spent = c
                        .query_opt(
                            "UPDATE mcp_firewall_approvals SET rounds = $3 WHERE id = $1 AND tenant = $2 \
                             AND status = 'consumed' AND rounds = $3 - 1 RETURNING id",
                            &[&id.as_str(), &tenant, &round_i],
                        )
                        .await?;
                    if spent.is_some() {
                        return Ok(Some(true));
                    }
                    let known = c
                        .query_opt(
                            "SELECT id FROM mcp_firewall_approvals WHERE id = $1 AND tenant = $2 \
                             AND status = 'consumed'",
                            &[&id.as_str(), &tenant],
                        )
                        .await?;
                    Ok(known.map(|_| false))
                })
                .await
                .map_err(|e: ApprovalError| RoundRefused::Unavailable(e.to_string()))?;
            match found {
                Some(true) => Ok(()),
                Some(false) => Err(RoundRefused::Spent),
                None => Err(RoundRefused::Unknown),
            }
        })
    }

    fn withdraw<'a>(
        &'a self,
        tenant: &'a str,
        id: &'a ApprovalId,
        now: u64,
        out: &'a mut Vec<Transition>,
    ) -> Answer<'a, Option<Approval>> {
        Box::pin(async move {
            let now_i = to_i64(now);
            let row = self
                .inner
                .run(|c| async move {
                    c.query_opt(
                        &format!(
                            "WITH old AS (SELECT id, status FROM mcp_firewall_approvals WHERE id = $1 \
                             AND tenant = $2 AND status IN ('pending', 'approved') AND expires_ms > $3 \
                             FOR UPDATE) \
                             UPDATE mcp_firewall_approvals a SET status = 'withdrawn', consumed_ms = $3, \
                             ended_ms = $3 FROM old WHERE a.id = old.id \
                             RETURNING {}, old.status AS from_status",
                            prefixed("a")
                        ),
                        &[&id.as_str(), &tenant, &now_i],
                    )
                    .await?
                    .map(|r| Ok::<_, Pg>((approval(&r)?, from_status(&r)?)))
                    .transpose()
                })
                .await?;
            Ok(row.map(|(a, from)| {
                let t = Transition {
                    approval: a.clone(),
                    from: Some(from),
                    to: Status::Withdrawn,
                    at_ms: now,
                };
                self.wake_all(std::slice::from_ref(&t));
                out.push(t);
                a
            }))
        })
    }

    /// The `UPDATE` states [`rules::check_decidable`]; when it matches no
    /// row, the approval as it reads now says why.
    fn decide<'a>(
        &'a self,
        id: &'a str,
        by: &'a Approver,
        approve: bool,
        reason: &'a str,
        now: u64,
        out: &'a mut Vec<Transition>,
    ) -> Answer<'a, Approval> {
        Box::pin(async move {
            let now_i = to_i64(now);
            let to = if approve {
                Status::Approved
            } else {
                Status::Denied
            };
            let (updated, current) = self
                .inner
                .run(|c| async move {
                    let updated = c
                        .query_opt(
                            &format!(
                                "UPDATE mcp_firewall_approvals SET status = $3, decided_approved = $4, \
                                 decided_by = $5, decided_ms = $6, reason = $7, \
                                 ended_ms = CASE WHEN $4 THEN NULL ELSE $6 END \
                                 WHERE id = $1 AND tenant = $2 AND status = 'pending' AND expires_ms > $6 \
                                 AND (self_approval OR subject <> $5) RETURNING {COLS}"
                            ),
                            &[&id, &by.tenant, &to.as_str(), &approve, &by.subject, &now_i, &reason],
                        )
                        .await?;
                    if let Some(row) = updated {
                        return Ok((Some(approval(&row)?), None));
                    }
                    let current = c
                        .query_opt(
                            &format!(
                                "SELECT {COLS} FROM mcp_firewall_approvals WHERE id = $1 AND tenant = $2"
                            ),
                            &[&id, &by.tenant],
                        )
                        .await?
                        .map(|r| approval(&r))
                        .transpose()?;
                    Ok((None, current))
                })
                .await?;
            if let Some(a) = updated {
                let t = Transition {
                    approval: a.clone(),
                    from: Some(Status::Pending),
                    to,
                    at_ms: now,
                };
                self.wake_all(std::slice::from_ref(&t));
                out.push(t);
                return Ok(a);
            }
            match current {
                Some(a) => Err(rules::refusal(a, by, now)),
                None => Err(ApprovalError::NotFound { id: id.to_owned() }),
            }
        })
    }

    fn subscribe<'a>(&'a self, id: &'a ApprovalId, now: u64) -> Answer<'a, Subscription> {
        Box::pin(async move {
            // Registered before the read: a change between the two is not lost.
            let rx = self
                .inner
                .waiters
                .entry(id.as_str().to_owned())
                .or_insert_with(|| watch::channel(Status::Pending).0)
                .subscribe();
            let a = self.get_any(id.as_str()).await?;
            Ok(rules::wait_from(a.as_ref(), now).map(|expires_ms| (rx, expires_ms)))
        })
    }

    fn status<'a>(&'a self, id: &'a str, now: u64) -> Answer<'a, Option<Status>> {
        Box::pin(async move { Ok(self.get_any(id).await?.map(|a| a.status_at(now))) })
    }

    fn get<'a>(&'a self, tenant: &'a str, id: &'a str, now: u64) -> Answer<'a, Option<Approval>> {
        Box::pin(async move {
            Ok(self
                .get_any(id)
                .await?
                .and_then(|a| rules::visible(&a, tenant, now)))
        })
    }

    /// At most the newest 1000.
    fn list<'a>(
        &'a self,
        tenant: &'a str,
        status: Option<Status>,
        now: u64,
    ) -> Answer<'a, Vec<Approval>> {
        Box::pin(async move {
            let now_i = to_i64(now);
            let rows = self
                .inner
                .run(|c| async move {
                    let rows = match status {
                        None => {
                            c.query(
                                &format!(
                                    "SELECT {COLS} FROM mcp_firewall_approvals WHERE tenant = $1 \
                                     ORDER BY created_ms DESC, id DESC LIMIT 1000"
                                ),
                                &[&tenant],
                            )
                            .await?
                        }
                        // Live rows past their deadline read as expired.
                        Some(Status::Expired) => {
                            c.query(
                                &format!(
                                    "SELECT {COLS} FROM mcp_firewall_approvals WHERE tenant = $1 \
                                     AND (status = 'expired' OR (status IN ('pending', 'approved') \
                                     AND expires_ms <= $2)) ORDER BY created_ms DESC, id DESC LIMIT 1000"
                                ),
                                &[&tenant, &now_i],
                            )
                            .await?
                        }
                        Some(s) if s.is_live() => {
                            c.query(
                                &format!(
                                    "SELECT {COLS} FROM mcp_firewall_approvals WHERE tenant = $1 \
                                     AND status = $2 AND expires_ms > $3 \
                                     ORDER BY created_ms DESC, id DESC LIMIT 1000"
                                ),
                                &[&tenant, &s.as_str(), &now_i],
                            )
                            .await?
                        }
                        Some(s) => {
                            c.query(
                                &format!(
                                    "SELECT {COLS} FROM mcp_firewall_approvals WHERE tenant = $1 \
                                     AND status = $2 ORDER BY created_ms DESC, id DESC LIMIT 1000"
                                ),
                                &[&tenant, &s.as_str()],
                            )
                            .await?
                        }
                    };
                    rows.iter().map(approval).collect::<Result<Vec<_>, _>>()
                })
                .await?;
            Ok(rows.iter().map(|a| rules::as_of(a, now)).collect())
        })
    }

    /// Each due expiry is made by exactly one replica (`SKIP LOCKED`); also
    /// refreshes the pending count and the oldest pending approval.
    fn sweep(&self, now: u64, history_ms: u64) -> Answer<'_, Vec<Transition>> {
        Box::pin(async move {
            let now_i = to_i64(now);
            let cutoff = to_i64(now.saturating_sub(history_ms));
            let (expired, (pending, oldest)) = self
                .inner
                .run(|c| async move {
                    let rows = c
                        .query(
                            &format!(
                                "WITH old AS (SELECT id, status FROM mcp_firewall_approvals \
                                 WHERE status IN ('pending', 'approved') AND expires_ms <= $1 \
                                 FOR UPDATE SKIP LOCKED) \
                                 UPDATE mcp_firewall_approvals a SET status = 'expired', ended_ms = a.expires_ms \
                                 FROM old WHERE a.id = old.id RETURNING {}, old.status AS from_status",
                                prefixed("a")
                            ),
                            &[&now_i],
                        )
                        .await?;
                    c.execute(
                        "DELETE FROM mcp_firewall_approvals WHERE ended_ms IS NOT NULL AND ended_ms < $1",
                        &[&cutoff],
                    )
                    .await?;
                    let counted = c
                        .query_one(
                            "SELECT count(*), COALESCE(min(created_ms), 0) FROM mcp_firewall_approvals \
                             WHERE status = 'pending' AND expires_ms > $1",
                            &[&now_i],
                        )
                        .await?;
                    let pending: i64 = counted.get(0);
                    let oldest: i64 = counted.get(1);
                    Ok((expirations(&rows)?, (pending, oldest)))
                })
                .await?;
            self.inner
                .pending
                .store(usize::try_from(pending).unwrap_or(0), Ordering::Relaxed);
            self.inner
                .oldest_pending
                .store(u64::try_from(oldest).unwrap_or(0), Ordering::Relaxed);
            self.wake_all(&expired);
            Ok(expired)
        })
    }

    #[cfg(test)]
    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}

/// Creates or upgrades the PostgreSQL schema of `cfg` (every migration not
/// yet applied); returns its version.
pub async fn migrate(cfg: &ApprovalsConfig) -> anyhow::Result<u32> {
    let (pg, tls) = connection(cfg)?;
    let (mut client, conn) = pg
        .connect(tls)
        .await
        .map_err(|e| anyhow::anyhow!("cannot connect to approvals.postgres_url: {e}"))?;
    let driver = tokio::spawn(conn);
    let version = apply_migrations(&mut client).await;
    drop(client);
    let _ = driver.await;
    version.map_err(|e| anyhow::anyhow!("{e}"))
}

/// Connects to the PostgreSQL store of `cfg` and reads its schema version
/// (0: not created yet), changing nothing.
pub async fn probe(cfg: &ApprovalsConfig) -> anyhow::Result<u32> {
    let (pg, tls) = connection(cfg)?;
    let (client, conn) = tokio::time::timeout(Duration::from_secs(5), pg.connect(tls))
        .await
        .map_err(|_| anyhow::anyhow!("no answer within 5 s"))??;
    let driver = tokio::spawn(conn);
    let version = async {
        let exists: bool = client
            .query_one("SELECT to_regclass('mcp_firewall_schema') IS NOT NULL", &[])
            .await?
            .get(0);
        if !exists {
            return Ok::<i32, tokio_postgres::Error>(0);
        }
        let v: Option<i32> = client
            .query_one("SELECT max(version) FROM mcp_firewall_schema", &[])
            .await?
            .get(0);
        Ok(v.unwrap_or(0))
    }
    .await;
    drop(client);
    let _ = driver.await;
    let v = version?;
    Ok(u32::try_from(v).unwrap_or(0))
}

async fn apply_migrations(client: &mut tokio_postgres::Client) -> Result<u32, Pg> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    tx.batch_execute(
        "CREATE TABLE IF NOT EXISTS mcp_firewall_schema (version integer NOT NULL, \
         applied_ms bigint NOT NULL)",
    )
    .await?;
    let current: Option<i32> = tx
        .query_one("SELECT max(version) FROM mcp_firewall_schema", &[])
        .await?
        .get(0);
    let current = usize::try_from(current.unwrap_or(0)).unwrap_or(0);
    if current > MIGRATIONS.len() {
        return Err(Pg::Other(format!(
            "the approvals schema is at version {current}, newer than this firewall knows ({}); upgrade the firewall",
            MIGRATIONS.len()
        )));
    }
    for (i, m) in MIGRATIONS.iter().enumerate().skip(current) {
        tx.batch_execute(m).await?;
        let v = i32::try_from(i + 1).unwrap_or(i32::MAX);
        tx.execute(
            "INSERT INTO mcp_firewall_schema (version, applied_ms) VALUES ($1, $2)",
            &[&v, &to_i64(super::clock::Clock::System.now_ms())],
        )
        .await?;
        tracing::info!(version = v, "approvals schema migrated");
    }
    tx.commit().await?;
    Ok(u32::try_from(MIGRATIONS.len()).unwrap_or(0))
}

/// What a statement can fail with.
#[derive(Debug)]
enum Pg {
    Db(tokio_postgres::Error),
    Other(String),
}

impl From<tokio_postgres::Error> for Pg {
    fn from(e: tokio_postgres::Error) -> Pg {
        Pg::Db(e)
    }
}

impl std::fmt::Display for Pg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Pg::Db(e) => match e.as_db_error() {
                Some(db) => write!(f, "{}: {}", db.code().code(), db.message()),
                None => write!(f, "{e}"),
            },
            Pg::Other(s) => f.write_str(s),
        }
    }
}

impl Inner {
    /// Runs `f` on a pooled connection, within the deadline and through
    /// the breaker; migrates first if that has not happened yet.
    async fn run<T, F, Fut>(&self, f: F) -> Result<T, ApprovalError>
    where
        F: FnOnce(deadpool_postgres::Client) -> Fut,
        Fut: std::future::Future<Output = Result<T, Pg>>,
    {
        if self.breaker.permit() == Permit::Refused {
            return Err(failed(
                "the approvals database is unavailable (circuit breaker open after repeated failures)",
            ));
        }
        let work = async {
            if !self.migrated.load(Ordering::Acquire) {
                self.migrate().await.map_err(Pg::Other)?;
            }
            let client = self
                .pool
                .get()
                .await
                .map_err(|e| Pg::Other(format!("no database connection: {e}")))?;
            f(client).await
        };
        match tokio::time::timeout(self.timeout, work).await {
            Ok(Ok(v)) => {
                self.breaker.success();
                Ok(v)
            }
            Ok(Err(e)) => {
                if !matches!(&e, Pg::Db(d) if d.as_db_error().is_some()) {
                    self.breaker.failure();
                }
                Err(failed(format!("approvals database: {e}")))
            }
            Err(_) => {
                self.breaker.failure();
                Err(failed(format!(
                    "the approvals database did not answer within {} ms",
                    self.timeout.as_millis()
                )))
            }
        }
    }

    async fn migrate(&self) -> Result<(), String> {
        let mut client = self
            .pool
            .get()
            .await
            .map_err(|e| format!("no database connection: {e}"))?;
        apply_migrations(&mut client)
            .await
            .map_err(|e| e.to_string())?;
        self.migrated.store(true, Ordering::Release);
        Ok(())
    }

    fn wake(&self, id: &str, status: Status) {
        if status == Status::Pending {
            return;
        }
        if let Some(w) = self.waiters.get(id) {
            w.send_replace(status);
        }
    }
}

/// Holds a `LISTEN` connection and wakes local waiters on every
/// notification; reconnects after a second when it is lost.
async fn listen(inner: Weak<Inner>) {
    let mut logged = false;
    loop {
        let Some(i) = inner.upgrade() else { return };
        let (pg, tls) = (i.pg.clone(), i.tls.clone());
        drop(i);
        match pg.connect(tls).await {
            Ok((client, mut conn)) => {
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
                let driver = tokio::spawn(async move {
                    loop {
                        match std::future::poll_fn(|cx| conn.poll_message(cx)).await {
                            Some(Ok(tokio_postgres::AsyncMessage::Notification(n))) => {
                                if tx.send(n.payload().to_owned()).is_err() {
                                    return;
                                }
                            }
                            Some(Ok(_)) => {}
                            Some(Err(_)) | None => return,
                        }
                    }
                });
                if client
                    .batch_execute(&format!("LISTEN {CHANNEL}"))
                    .await
                    .is_ok()
                {
                    if logged {
                        tracing::info!("approvals notifications listening again");
                        logged = false;
                    }
                    while let Some(payload) = rx.recv().await {
                        let Some(i) = inner.upgrade() else { return };
                        if let Some((id, status)) = payload.split_once(' ') {
                            if let Some(s) = Status::from_name(status) {
                                i.wake(id, s);
                            }
                        }
                    }
                }
                driver.abort();
            }
            Err(e) if !logged => {
                tracing::warn!(error = %e, "approvals notifications unavailable; held calls are woken by polling until they are back");
                logged = true;
            }
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The slow path: every `poll` interval, the status of every waited id is
/// read, so a lost notification delays a wake-up by at most one interval.
async fn poll(inner: Weak<Inner>) {
    loop {
        let Some(i) = inner.upgrade() else { return };
        let every = i.poll;
        i.waiters.retain(|_, w| w.receiver_count() > 0);
        let ids: Vec<String> = i.waiters.iter().map(|e| e.key().clone()).collect();
        if !ids.is_empty() {
            let statuses = i
                .run(|c| async move {
                    let rows = c
                        .query(
                            "SELECT id, status FROM mcp_firewall_approvals WHERE id = ANY($1)",
                            &[&ids],
                        )
                        .await?;
                    Ok(rows
                        .iter()
                        .map(|r| (r.get::<_, String>(0), r.get::<_, String>(1)))
                        .collect::<Vec<_>>())
                })
                .await;
            if let Ok(statuses) = statuses {
                for (id, status) in statuses {
                    if let Some(s) = Status::from_name(&status) {
                        i.wake(&id, s);
                    }
                }
            }
        }
        drop(i);
        tokio::time::sleep(every).await;
    }
}
/// Expires the live approvals of call `key` that are overdue at `now`; their
/// transitions.
async fn expire_overdue(
    c: &deadpool_postgres::Client,
    key: &CallKey,
    now: i64,
) -> Result<Vec<Transition>, Pg> {
    let expired = c
        .query(
            &format!(
                "WITH old AS (SELECT id, status FROM mcp_firewall_approvals \
                 WHERE {KEY_MATCH} AND status IN ('pending', 'approved') \
                 AND expires_ms <= $7 FOR UPDATE) \
                 UPDATE mcp_firewall_approvals a SET status = 'expired', ended_ms = a.expires_ms \
                 FROM old WHERE a.id = old.id RETURNING {}, old.status AS from_status",
                prefixed("a")
            ),
            &KeyParams::new(key).and(&[&now]),
        )
        .await?;
    expirations(&expired)
}

/// The expiries an expiring `UPDATE … RETURNING` (with `from_status`) made.
fn expirations(rows: &[Row]) -> Result<Vec<Transition>, Pg> {
    rows.iter()
        .map(|row| {
            let a = approval(row)?;
            Ok(Transition {
                at_ms: a.expires_ms,
                from: Some(from_status(row)?),
                to: Status::Expired,
                approval: a,
            })
        })
        .collect()
}

/// The live (pending or approved) approval of call `key`, if any.
async fn live_approval(
    c: &deadpool_postgres::Client,
    key: &CallKey,
) -> Result<Option<Approval>, Pg> {
    let live = c
        .query_opt(
            &format!(
                "SELECT {COLS} FROM mcp_firewall_approvals WHERE {KEY_MATCH} \
                 AND status IN ('pending', 'approved')"
            ),
            &KeyParams::new(key).and(&[]),
        )
        .await?;
    live.as_ref().map(approval).transpose()
}

/// How many of `tenant`'s approvals are pending and not overdue at `now`.
async fn pending_count(c: &deadpool_postgres::Client, tenant: &str, now: i64) -> Result<usize, Pg> {
    let pending: i64 = c
        .query_one(
            "SELECT count(*) FROM mcp_firewall_approvals WHERE tenant = $1 \
             AND status = 'pending' AND expires_ms > $2",
            &[&tenant, &now],
        )
        .await?
        .get(0);
    Ok(usize::try_from(pending).unwrap_or(usize::MAX))
}

/// Files `new` as pending, filed at `now` and expiring at `expires`;
/// `None` when a live approval of the same call is already there.
async fn insert_pending(
    c: &deadpool_postgres::Client,
    new: &NewApproval,
    now: i64,
    expires: u64,
) -> Result<Option<Approval>, Pg> {
    let key = &new.key;
    let id = ApprovalId::generate().map_err(|e| Pg::Other(e.to_string()))?;
    let arguments = new.arguments.to_string();
    let inserted = c
        .query_opt(
            &format!(
                "INSERT INTO mcp_firewall_approvals (id, tenant, run_id, subject, \
                 upstream, tool, args_sha256, agent, risk, arguments, token_exp, \
                 preview_tool, self_approval, created_ms, expires_ms, status, why) \
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, 'pending', $16) \
                 ON CONFLICT (tenant, run_id, subject, upstream, tool, args_sha256) \
                 WHERE status IN ('pending', 'approved') DO NOTHING RETURNING {COLS}"
            ),
            &[
                &id.as_str(),
                &key.tenant,
                &key.run_id,
                &key.subject,
                &key.upstream,
                &key.tool,
                &key.args_sha256.as_slice(),
                &new.agent,
                &new.risk.as_str(),
                &arguments,
                &to_i64(new.token_exp),
                &new.preview_tool,
                &new.self_approval,
                &now,
                &to_i64(expires),
                &new.why,
            ],
        )
        .await?;
    inserted.as_ref().map(approval).transpose()
}

fn prefixed(alias: &str) -> String {
    COLS.split(", ")
        .map(|c| format!("{alias}.{c}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn from_status(row: &Row) -> Result<Status, Pg> {
    let s: String = row.try_get("from_status")?;
    Status::from_name(&s).ok_or_else(|| Pg::Other(format!("unknown approval status {s:?}")))
}

/// A row as an [`Approval`].
fn approval(row: &Row) -> Result<Approval, Pg> {
    let bad = |what: &str| Pg::Other(format!("unreadable approval row: {what}"));
    let id: String = row.try_get("id")?;
    let hash: Vec<u8> = row.try_get("args_sha256")?;
    let status: String = row.try_get("status")?;
    let risk: String = row.try_get("risk")?;
    let arguments: String = row.try_get("arguments")?;
    let decided_by: Option<String> = row.try_get("decided_by")?;
    let decision = match decided_by {
        Some(by) => Some(Decision {
            approved: row
                .try_get::<_, Option<bool>>("decided_approved")?
                .unwrap_or(false),
            by,
            at_ms: to_u64(row.try_get::<_, Option<i64>>("decided_ms")?.unwrap_or(0)),
            reason: row
                .try_get::<_, Option<String>>("reason")?
                .unwrap_or_default(),
        }),
        None => None,
    };
    Ok(Approval {
        id: ApprovalId::parse(&id).ok_or_else(|| bad("id"))?,
        key: CallKey {
            tenant: row.try_get("tenant")?,
            run_id: row.try_get("run_id")?,
            subject: row.try_get("subject")?,
            upstream: row.try_get("upstream")?,
            tool: row.try_get("tool")?,
            args_sha256: hash.try_into().map_err(|_| bad("args_sha256"))?,
        },
        agent: row.try_get("agent")?,
        risk: risk.parse().map_err(|_| bad("risk"))?,
        arguments: Arc::new(serde_json::from_str(&arguments).map_err(|_| bad("arguments"))?),
        token_exp: to_u64(row.try_get("token_exp")?),
        preview_tool: row.try_get("preview_tool")?,
        self_approval: row.try_get("self_approval")?,
        created_ms: to_u64(row.try_get("created_ms")?),
        expires_ms: to_u64(row.try_get("expires_ms")?),
        status: Status::from_name(&status).ok_or_else(|| bad("status"))?,
        decision,
        consumed_ms: row.try_get::<_, Option<i64>>("consumed_ms")?.map(to_u64),
        rounds: u32::try_from(row.try_get::<_, i32>("rounds")?).unwrap_or(0),
        why: row.try_get("why")?,
    })
}
