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
}

impl Backend {
    /// A fresh scope.
    pub fn scope(self) -> Scope {
        let id = format!("t{}", uuid::Uuid::new_v4().simple());
        let database = (self == Backend::Shared).then(|| Postgres::shared().create_database(&id));
        Scope {
            backend: self,
            id,
            dir: tempfile::tempdir().expect("tempdir"),
            database,
        }
    }
}

impl Scope {
    /// The `[state]` section (empty for local budgets).
    pub fn state(&self) -> String {
        self.state_with("")
    }

    /// The `[state]` section with more keys (`on_store_unavailable`, ...).
    pub fn state_with(&self, more: &str) -> String {
        match self.backend {
            Backend::Local => String::new(),
            Backend::Shared => format!(
                "[state]\nbackend = \"redis\"\nredis_url = \"{}\"\nkey_prefix = \"{}\"\ntimeout_ms = 200\n{more}\n",
                Redis::shared().url,
                self.id
            ),
        }
    }

    /// The store keys of an `[approvals]` section.
    pub fn approvals_store(&self) -> String {
        match &self.database {
            None => format!(
                "store_dir = \"{}\"\n",
                self.dir.path().join("approvals").display()
            ),
            Some(url) => format!(
                "store = \"postgres\"\npostgres_url = \"{url}\"\npostgres_timeout_ms = 2000\npostgres_poll_ms = 500\n"
            ),
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
