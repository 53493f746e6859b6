//! Where users' upstream tokens (`auth = "oauth_user"`) are kept, sealed
//! ([`super::vault`]): one record per owner (issuer, tenant, subject,
//! upstream), and the consents in flight (the PKCE verifier and whom the
//! consent is for, by `state`). `local` keeps one file per record in a
//! directory, and the consents in flight and the spent links as files
//! beside them (one replica; `mcp-firewall credentials` on the same
//! machine sees and revokes them, and a restart forgets nothing);
//! `postgres` keeps them in the `[approvals]` database, so every replica uses, refreshes and revokes the same tokens
//! and a consent begun on one replica completes on another.
//!
//! A refresh happens under the owner's lock (an advisory lock in
//! PostgreSQL, held for the transaction): a rotated refresh token is used
//! once, never by two replicas at the same time (an authorization server
//! that detects reuse revokes the whole family).

use std::path::PathBuf;
use std::time::Duration;

use futures_util::future::BoxFuture;
use serde::{Deserialize, Serialize};

/// Who a token belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub(crate) struct Owner {
    /// The tool token's issuer.
    pub issuer: String,
    /// Its tenant.
    pub tenant: String,
    /// Its subject: the user who consented.
    pub subject: String,
    /// The upstream.
    pub upstream: String,
}

impl Owner {
    /// The parts the vault binds a sealed token to.
    pub(crate) fn parts(&self) -> [&str; 4] {
        [&self.issuer, &self.tenant, &self.subject, &self.upstream]
    }

    /// A digest of it: its file's name (so no part can name a path) and
    /// its lock's key.
    fn digest(&self) -> [u8; 32] {
        let mut h = crate::digest::Sha256::new();
        for p in self.parts() {
            h.update((p.len() as u64).to_be_bytes());
            h.update(p.as_bytes());
        }
        h.finalize()
    }

    /// A file name for it.
    fn file_name(&self) -> String {
        format!("{}.json", hex::encode(self.digest()))
    }

    /// A lock key for it (PostgreSQL advisory locks take a bigint).
    fn lock_key(&self) -> i64 {
        let d = self.digest();
        i64::from_be_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
    }
}

/// A kept token, sealed, and what may be shown of it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct Record {
    /// Whose.
    #[serde(flatten)]
    pub owner: Owner,
    /// The access and refresh tokens, sealed (base64 on disk).
    #[serde(with = "b64")]
    pub sealed: Vec<u8>,
    /// The access token's id (never the token).
    pub credential_id: String,
    /// The scope granted.
    pub scope: String,
    /// When the user consented (ms).
    pub created_ms: u64,
    /// When it was last refreshed (ms).
    pub updated_ms: u64,
    /// When the access token expires (ms); 0: not said.
    pub expires_ms: u64,
    /// Whether a refresh token is kept.
    pub refreshable: bool,
}

mod b64 {
    use base64::Engine as _;
    use serde::{Deserialize, Deserializer, Serializer};

    pub(super) fn serialize<S: Serializer>(v: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(v))
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)
    }
}

/// Which records a listing or a revocation covers; `None` matches all.
#[derive(Debug, Clone, Default)]
pub(crate) struct Filter {
    pub tenant: Option<String>,
    pub subject: Option<String>,
    pub upstream: Option<String>,
    pub issuer: Option<String>,
}

impl Filter {
    fn matches(&self, o: &Owner) -> bool {
        let ok = |want: &Option<String>, have: &str| want.as_deref().is_none_or(|w| w == have);
        ok(&self.tenant, &o.tenant)
            && ok(&self.subject, &o.subject)
            && ok(&self.upstream, &o.upstream)
            && ok(&self.issuer, &o.issuer)
    }
}

/// What a locked update does to the record.
pub(crate) enum Change {
    /// Leave it.
    Keep,
    /// Write this one.
    Put(Record),
    /// Remove it.
    Delete,
}

/// The store could not be asked.
#[derive(Debug, Clone, thiserror::Error)]
#[error("credential store: {0}")]
pub(crate) struct StoreError(pub String);

fn failed(e: impl std::fmt::Display) -> StoreError {
    StoreError(e.to_string())
}

/// The tokens' store.
pub(crate) enum Store {
    /// Files in a directory.
    Local(Local),
    /// The approvals database.
    Postgres(Pg),
}

/// The local store.
pub(crate) struct Local {
    dir: PathBuf,
    lock: tokio::sync::Mutex<()>,
}

/// The PostgreSQL store.
pub(crate) struct Pg {
    pool: deadpool_postgres::Pool,
    timeout: Duration,
    /// The tables exist (made at start, or at first use after a start
    /// without the database).
    migrated: std::sync::atomic::AtomicBool,
}

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS mcp_firewall_user_credentials (
    issuer TEXT NOT NULL,
    tenant TEXT NOT NULL,
    subject TEXT NOT NULL,
    upstream TEXT NOT NULL,
    sealed BYTEA NOT NULL,
    credential_id TEXT NOT NULL,
    scope TEXT NOT NULL,
    created_ms BIGINT NOT NULL,
    updated_ms BIGINT NOT NULL,
    expires_ms BIGINT NOT NULL,
    refreshable BOOLEAN NOT NULL,
    PRIMARY KEY (issuer, tenant, subject, upstream)
);
CREATE TABLE IF NOT EXISTS mcp_firewall_credential_consents (
    state TEXT PRIMARY KEY,
    nonce TEXT NOT NULL UNIQUE,
    sealed BYTEA NOT NULL,
    expires_ms BIGINT NOT NULL
);";

const COLUMNS: &str = "issuer, tenant, subject, upstream, sealed, credential_id, scope, created_ms, updated_ms, expires_ms, refreshable";

impl Store {
    /// The store `cfg` names (its directory made, its tables created).
    ///
    /// # Errors
    /// The directory cannot be made, or the database's settings are wrong.
    /// A database that cannot be reached at start is not an error: it is
    /// asked again on each use.
    pub(crate) async fn open(cfg: &crate::config::CredentialStore) -> Result<Store, StoreError> {
        match cfg {
            crate::config::CredentialStore::Local(dir) => {
                std::fs::create_dir_all(dir)
                    .map_err(|e| failed(format!("{}: {e}", dir.display())))?;
                #[cfg(unix)]
                {
                    use std::os::unix::fs::PermissionsExt as _;
                    let _ = std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700));
                }
                Ok(Store::Local(Local {
                    dir: dir.clone(),
                    lock: tokio::sync::Mutex::new(()),
                }))
            }
            crate::config::CredentialStore::Postgres(a) => {
                let (pg, tls) = crate::approval::postgres::connection(a).map_err(failed)?;
                let timeout = Duration::from_millis(a.postgres_timeout_ms.max(1000));
                let manager = deadpool_postgres::Manager::from_config(
                    pg,
                    tls,
                    deadpool_postgres::ManagerConfig {
                        recycling_method: deadpool_postgres::RecyclingMethod::Fast,
                    },
                );
                let pool = deadpool_postgres::Pool::builder(manager)
                    .max_size(a.postgres_pool_size.clamp(2, 8))
                    .runtime(deadpool_postgres::Runtime::Tokio1)
                    .wait_timeout(Some(timeout))
                    .create_timeout(Some(timeout))
                    .recycle_timeout(Some(timeout))
                    .build()
                    .map_err(failed)?;
                let pg = Pg {
                    pool,
                    timeout,
                    migrated: std::sync::atomic::AtomicBool::new(false),
                };
                if let Err(e) = pg.migrate().await {
                    tracing::error!(error = %e, "credential store not ready at start; asked again on each use");
                }
                Ok(Store::Postgres(pg))
            }
        }
    }

    /// The owner's record.
    pub(crate) async fn get(&self, owner: &Owner) -> Result<Option<Record>, StoreError> {
        match self {
            Store::Local(l) => l.read(owner),
            Store::Postgres(p) => {
                let c = p.client().await?;
                p.bounded(get_with(&c, owner)).await
            }
        }
    }

    /// Records `filter` matches, without opening them.
    pub(crate) async fn list(&self, filter: &Filter) -> Result<Vec<Record>, StoreError> {
        match self {
            Store::Local(l) => l.all(filter),
            Store::Postgres(p) => {
                let c = p.client().await?;
                let rows = p
                    .bounded(async {
                        c.query(
                            &format!("SELECT {COLUMNS} FROM mcp_firewall_user_credentials ORDER BY tenant, subject, upstream"),
                            &[],
                        )
                        .await
                        .map_err(failed)
                    })
                    .await?;
                let mut out = Vec::new();
                for r in &rows {
                    let rec = record_of(r)?;
                    if filter.matches(&rec.owner) {
                        out.push(rec);
                    }
                }
                Ok(out)
            }
        }
    }

    /// Removes every record `filter` matches; returns them (their refresh
    /// tokens are revoked at the server after).
    pub(crate) async fn remove(&self, filter: &Filter) -> Result<Vec<Record>, StoreError> {
        let found = self.list(filter).await?;
        for rec in &found {
            self.update(&rec.owner, |_| Box::pin(async { Ok((Change::Delete, ())) }))
                .await?;
        }
        Ok(found)
    }

    /// Changes the owner's record under its lock: `f` sees the record as
    /// stored now and says what to do with it.
    pub(crate) async fn update<'a, T: Send + 'a, E: From<StoreError> + Send + 'a>(
        &'a self,
        owner: &'a Owner,
        f: impl FnOnce(Option<Record>) -> BoxFuture<'a, Result<(Change, T), E>> + Send + 'a,
    ) -> Result<T, E> {
        match self {
            Store::Local(l) => {
                let _held = l.lock.lock().await;
                let now = l.read(owner)?;
                let (change, out) = f(now).await?;
                l.apply(owner, change)?;
                Ok(out)
            }
            Store::Postgres(p) => {
                let mut c = p.client().await?;
                let tx = p
                    .bounded(async { c.transaction().await.map_err(failed) })
                    .await?;
                p.bounded(async {
                    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&owner.lock_key()])
                        .await
                        .map_err(failed)
                })
                .await?;
                let now = p.bounded(get_with(&tx, owner)).await?;
                let (change, out) = f(now).await?;
                p.bounded(async {
                    match change {
                        Change::Keep => Ok(0),
                        Change::Put(r) => put_with(&tx, &r).await,
                        Change::Delete => tx
                            .execute(
                                "DELETE FROM mcp_firewall_user_credentials WHERE issuer = $1 AND tenant = $2 AND subject = $3 AND upstream = $4",
                                &[&owner.issuer, &owner.tenant, &owner.subject, &owner.upstream],
                            )
                            .await
                            .map_err(failed),
                    }
                })
                .await?;
                p.bounded(async { tx.commit().await.map_err(failed) })
                    .await?;
                Ok(out)
            }
        }
    }

    /// Records a consent in flight under `state`; false when `nonce` (the
    /// link it came from) was already used.
    pub(crate) async fn begin_consent(
        &self,
        state: &str,
        nonce: &str,
        sealed: &[u8],
        expires_ms: u64,
    ) -> Result<bool, StoreError> {
        match self {
            Store::Local(l) => l.begin_consent(state, nonce, sealed, expires_ms),
            Store::Postgres(p) => {
                let c = p.client().await?;
                p.bounded(async {
                    let now = crate::clock::now_ms() as i64;
                    c.execute(
                        "DELETE FROM mcp_firewall_credential_consents WHERE expires_ms < $1",
                        &[&(now - 86_400_000)],
                    )
                    .await
                    .map_err(failed)?;
                    let n = c
                        .execute(
                            "INSERT INTO mcp_firewall_credential_consents (state, nonce, sealed, expires_ms) VALUES ($1, $2, $3, $4) ON CONFLICT DO NOTHING",
                            &[&state, &nonce, &sealed, &(expires_ms as i64)],
                        )
                        .await
                        .map_err(failed)?;
                    Ok(n == 1)
                })
                .await
            }
        }
    }

    /// Takes the consent in flight under `state` (once), if it has not
    /// expired.
    pub(crate) async fn take_consent(&self, state: &str) -> Result<Option<Vec<u8>>, StoreError> {
        let now = crate::clock::now_ms();
        match self {
            Store::Local(l) => l.take_consent(state, now),
            Store::Postgres(p) => {
                let c = p.client().await?;
                p.bounded(async {
                    let rows = c
                        .query(
                            "WITH old AS (SELECT state, sealed FROM mcp_firewall_credential_consents WHERE state = $1 AND expires_ms > $2 AND length(sealed) > 0 FOR UPDATE) \
                             UPDATE mcp_firewall_credential_consents c SET sealed = ''::bytea FROM old WHERE c.state = old.state RETURNING old.sealed",
                            &[&state, &(now as i64)],
                        )
                        .await
                        .map_err(failed)?;
                    Ok(rows.first().map(|r| r.get::<_, Vec<u8>>(0)))
                })
                .await
            }
        }
    }
}

impl Local {
    fn path(&self, owner: &Owner) -> PathBuf {
        self.dir.join(owner.file_name())
    }

    fn read(&self, owner: &Owner) -> Result<Option<Record>, StoreError> {
        match std::fs::read(self.path(owner)) {
            Ok(bytes) => {
                let rec: Record = serde_json::from_slice(&bytes)
                    .map_err(|e| failed(format!("{}: {e}", self.path(owner).display())))?;
                // A file renamed onto another owner's name is not theirs.
                Ok((rec.owner == *owner).then_some(rec))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(failed(format!("{}: {e}", self.path(owner).display()))),
        }
    }

    fn all(&self, filter: &Filter) -> Result<Vec<Record>, StoreError> {
        let mut out = Vec::new();
        let entries = std::fs::read_dir(&self.dir)
            .map_err(|e| failed(format!("{}: {e}", self.dir.display())))?;
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            let Ok(bytes) = std::fs::read(&path) else {
                continue;
            };
            match serde_json::from_slice::<Record>(&bytes) {
                Ok(rec) if filter.matches(&rec.owner) => out.push(rec),
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!(file = %path.display(), error = %e, "credential store: unreadable record skipped")
                }
            }
        }
        out.sort_by(|a, b| {
            (&a.owner.tenant, &a.owner.subject, &a.owner.upstream).cmp(&(
                &b.owner.tenant,
                &b.owner.subject,
                &b.owner.upstream,
            ))
        });
        Ok(out)
    }

    fn apply(&self, owner: &Owner, change: Change) -> Result<(), StoreError> {
        let path = self.path(owner);
        match change {
            Change::Keep => Ok(()),
            Change::Delete => match std::fs::remove_file(&path) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(failed(format!("{}: {e}", path.display()))),
            },
            Change::Put(rec) => write_file(&path, &serde_json::to_vec(&rec).map_err(failed)?),
        }
    }

    /// Where consents in flight (`s-…`: until when, then the sealed
    /// consent) and spent links (`n-…`: until when) are kept, by digest.
    fn consents(&self) -> Result<PathBuf, StoreError> {
        let dir = self.dir.join("consents");
        std::fs::create_dir_all(&dir).map_err(|e| failed(format!("{}: {e}", dir.display())))?;
        Ok(dir)
    }

    fn begin_consent(
        &self,
        state: &str,
        nonce: &str,
        sealed: &[u8],
        expires_ms: u64,
    ) -> Result<bool, StoreError> {
        let dir = self.consents()?;
        sweep(&dir);
        // The link is spent by creating its marker: a second use (here,
        // or after a restart) finds it.
        let marker = dir.join(format!("n-{}", digest_hex(nonce)));
        match owner_only().create_new(true).open(&marker) {
            Ok(mut f) => {
                use std::io::Write as _;
                f.write_all(&expires_ms.to_be_bytes())
                    .map_err(|e| failed(format!("{}: {e}", marker.display())))?;
            }
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(false),
            Err(e) => return Err(failed(format!("{}: {e}", marker.display()))),
        }
        let mut body = expires_ms.to_be_bytes().to_vec();
        body.extend_from_slice(sealed);
        write_file(&dir.join(format!("s-{}", digest_hex(state))), &body)?;
        Ok(true)
    }

    fn take_consent(&self, state: &str, now: u64) -> Result<Option<Vec<u8>>, StoreError> {
        let path = self.consents()?.join(format!("s-{}", digest_hex(state)));
        let body = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(failed(format!("{}: {e}", path.display()))),
        };
        // Once: only the taker whose removal succeeds has it.
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(failed(format!("{}: {e}", path.display()))),
        }
        Ok(match until(&body) {
            Some(exp) if exp > now => Some(body[8..].to_vec()),
            _ => None,
        })
    }
}

/// A consent file's "until when" (its first 8 bytes).
fn until(body: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(body.get(..8)?.try_into().ok()?))
}

/// Removes the consent files a day past their time.
fn sweep(dir: &std::path::Path) {
    let old = crate::clock::now_ms().saturating_sub(86_400_000);
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let done = std::fs::read(&path)
            .ok()
            .and_then(|b| until(&b))
            .is_none_or(|exp| exp < old);
        if done {
            let _ = std::fs::remove_file(&path);
        }
    }
}

fn digest_hex(text: &str) -> String {
    hex::encode(crate::digest::Sha256::digest(text))
}

/// Options that write a file only its owner can read.
fn owner_only() -> std::fs::OpenOptions {
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        opts.mode(0o600);
    }
    opts
}

/// Writes `path` whole or not at all (a temporary file renamed), readable
/// by its owner only.
fn write_file(path: &std::path::Path, bytes: &[u8]) -> Result<(), StoreError> {
    let tmp = path.with_extension("tmp");
    let write = || -> std::io::Result<()> {
        use std::io::Write as _;
        let mut f = owner_only().create(true).truncate(true).open(&tmp)?;
        f.write_all(bytes)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|e| failed(format!("{}: {e}", path.display())))
}

impl Pg {
    async fn client(&self) -> Result<deadpool_postgres::Object, StoreError> {
        let c = self.pool.get().await.map_err(failed)?;
        if !self.migrated.load(std::sync::atomic::Ordering::Acquire) {
            self.bounded(async { c.batch_execute(SCHEMA).await.map_err(failed) })
                .await?;
            self.migrated
                .store(true, std::sync::atomic::Ordering::Release);
        }
        Ok(c)
    }

    async fn bounded<T>(
        &self,
        f: impl std::future::Future<Output = Result<T, StoreError>>,
    ) -> Result<T, StoreError> {
        tokio::time::timeout(self.timeout, f)
            .await
            .map_err(|_| failed(format!("no answer within {} ms", self.timeout.as_millis())))?
    }

    async fn migrate(&self) -> Result<(), StoreError> {
        self.client().await.map(drop)
    }
}

async fn get_with(
    c: &impl deadpool_postgres::GenericClient,
    owner: &Owner,
) -> Result<Option<Record>, StoreError> {
    let rows = c
        .query(
            &format!("SELECT {COLUMNS} FROM mcp_firewall_user_credentials WHERE issuer = $1 AND tenant = $2 AND subject = $3 AND upstream = $4"),
            &[&owner.issuer, &owner.tenant, &owner.subject, &owner.upstream],
        )
        .await
        .map_err(failed)?;
    rows.first().map(record_of).transpose()
}

async fn put_with(
    c: &impl deadpool_postgres::GenericClient,
    r: &Record,
) -> Result<u64, StoreError> {
    c.execute(
        &format!("INSERT INTO mcp_firewall_user_credentials ({COLUMNS}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)
         ON CONFLICT (issuer, tenant, subject, upstream) DO UPDATE SET sealed = EXCLUDED.sealed, credential_id = EXCLUDED.credential_id,
         scope = EXCLUDED.scope, created_ms = EXCLUDED.created_ms, updated_ms = EXCLUDED.updated_ms, expires_ms = EXCLUDED.expires_ms, refreshable = EXCLUDED.refreshable"),
        &[
            &r.owner.issuer,
            &r.owner.tenant,
            &r.owner.subject,
            &r.owner.upstream,
            &r.sealed,
            &r.credential_id,
            &r.scope,
            &(r.created_ms as i64),
            &(r.updated_ms as i64),
            &(r.expires_ms as i64),
            &r.refreshable,
        ],
    )
    .await
    .map_err(failed)
}

fn record_of(r: &tokio_postgres::Row) -> Result<Record, StoreError> {
    let ms = |i: usize| -> Result<u64, StoreError> {
        let v: i64 = r.try_get(i).map_err(failed)?;
        u64::try_from(v).map_err(failed)
    };
    Ok(Record {
        owner: Owner {
            issuer: r.try_get(0).map_err(failed)?,
            tenant: r.try_get(1).map_err(failed)?,
            subject: r.try_get(2).map_err(failed)?,
            upstream: r.try_get(3).map_err(failed)?,
        },
        sealed: r.try_get(4).map_err(failed)?,
        credential_id: r.try_get(5).map_err(failed)?,
        scope: r.try_get(6).map_err(failed)?,
        created_ms: ms(7)?,
        updated_ms: ms(8)?,
        expires_ms: ms(9)?,
        refreshable: r.try_get(10).map_err(failed)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_local_consent_is_taken_once_and_its_link_stays_spent_across_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = crate::config::CredentialStore::Local(dir.path().join("store"));
        let store = Store::open(&cfg).await.unwrap();
        let later = crate::clock::now_ms() + 60_000;
        assert!(store
            .begin_consent("st1", "n1", b"sealed", later)
            .await
            .unwrap());
        assert!(
            !store
                .begin_consent("st2", "n1", b"other", later)
                .await
                .unwrap(),
            "a link begins one consent"
        );
        assert_eq!(
            store.take_consent("st1").await.unwrap().as_deref(),
            Some(&b"sealed"[..])
        );
        assert_eq!(store.take_consent("st1").await.unwrap(), None, "taken once");
        assert_eq!(store.take_consent("st2").await.unwrap(), None);
        // Expired: not taken.
        assert!(store.begin_consent("st3", "n3", b"x", 1).await.unwrap());
        assert_eq!(store.take_consent("st3").await.unwrap(), None);
        // A restart (a new store on the directory) still knows the link.
        drop(store);
        let again = Store::open(&cfg).await.unwrap();
        assert!(!again.begin_consent("st4", "n1", b"y", later).await.unwrap());
        assert!(
            again.list(&Filter::default()).await.unwrap().is_empty(),
            "consents are not records"
        );
    }
}
