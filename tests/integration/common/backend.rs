//! The two homes of budgets and approvals, for suites that run the same
//! cases on both: [`Backend::Local`] (memory budgets, a journal file for
//! approvals: one process, nothing external) and [`Backend::Shared`]
//! (Redis and PostgreSQL, as several replicas run). A [`Scope`] isolates
//! one test on the shared servers: its own Redis key prefix and its own
//! database, the same for every firewall the test starts from it (replicas,
//! or one firewall restarted).
//!
//! [`on_both_backends!`] turns `async fn case(b: Backend)` into the tests
//! `case::memory` and `case::shared`.

use super::postgres::Postgres;
use super::redis::Redis;
use super::{toml_path, TestConfig};

/// Where budgets and approvals live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    /// Memory budgets and a journal file.
    Local,
    /// Redis budgets and PostgreSQL approvals.
    Shared,
}

/// One test's share of the backend.
pub struct Scope {
    /// The backend.
    pub backend: Backend,
    /// A unique id (key prefix, database name).
    pub id: String,
    /// A directory for the approvals journal (and anything else local).
    pub dir: tempfile::TempDir,
    database: Option<String>,
    redis_url: Option<String>,
}

impl Backend {
    /// A fresh scope.
    pub async fn scope(self) -> Scope {
        let id = format!("t{}", uuid::Uuid::new_v4().simple());
        let (database, redis_url) = match self {
            Backend::Local => (None, None),
            Backend::Shared => (
                Some(Postgres::shared().await.create_database(&id)),
                Some(Redis::shared().await.url.clone()),
            ),
        };
        Scope {
            backend: self,
            id,
            dir: tempfile::tempdir().expect("tempdir"),
            database,
            redis_url,
        }
    }
}

impl Scope {
    /// `cfg` with this scope's `[state]` (nothing for local budgets).
    pub fn state(&self, cfg: TestConfig) -> TestConfig {
        match &self.redis_url {
            None => cfg,
            Some(url) => cfg
                .set("state.backend", "redis")
                .set("state.redis_url", url.as_str())
                .set("state.key_prefix", self.id.as_str())
                .set("state.timeout_ms", 200),
        }
    }

    /// `cfg` with this scope's approvals store (a journal in `dir`, or the
    /// scope's PostgreSQL database).
    pub fn approvals_store(&self, cfg: TestConfig) -> TestConfig {
        match &self.database {
            None => cfg.set(
                "approvals.store_dir",
                toml_path(&self.dir.path().join("approvals")),
            ),
            Some(url) => cfg
                .set("approvals.store", "postgres")
                .set("approvals.postgres_url", url.as_str())
                .set("approvals.postgres_timeout_ms", 2000)
                .set("approvals.postgres_poll_ms", 500),
        }
    }

    /// The database URL (shared scopes).
    pub fn database(&self) -> Option<&str> {
        self.database.as_deref()
    }
}

/// `async fn case(b: Backend)` as `case::memory` and `case::shared`.
#[macro_export]
macro_rules! on_both_backends {
    ($($case:ident),* $(,)?) => {
        $(
            mod $case {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn memory() {
                    super::$case($crate::common::backend::Backend::Local).await
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn shared() {
                    super::$case($crate::common::backend::Backend::Shared).await
                }
            }
        )*
    };
}
