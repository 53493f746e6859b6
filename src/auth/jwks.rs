//! The live key set: keys fixed by the config plus those fetched from JWKS
//! URLs in the background, published atomically for the request path.
//!
//! Invariants:
//! - the request path only ever reads an `Arc<KeySet>` snapshot (arc-swap, no
//!   lock); a refresh builds a new set and swaps it in whole;
//! - the generation counter is bumped exactly when the set's fingerprint
//!   changes, after the new set is stored; the verifier reads the generation
//!   *before* the set, so a verification that raced a swap is cached under
//!   the old generation and simply misses later;
//! - a fetch that fails (network, status, size, JSON) keeps the source's last
//!   good keys; a fetch that succeeds is authoritative, even if empty
//!   (removing a key from the JWKS revokes it);
//! - an unknown `kid` triggers at most one fetch per source per
//!   `min_refresh_interval_s`, shared by every request that asks meanwhile
//!   (single flight), and no request waits for it longer than
//!   [`UNKNOWN_KID_WAIT`];
//! - every fetch is bounded in time ([`FETCH_TIMEOUT`]) and size
//!   ([`MAX_JWKS_BYTES`]), so a slow or hostile key server can not wedge the
//!   refresh task.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{StatusCode, Uri};
use http_body_util::{BodyExt, Empty, LengthLimitError, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use super::config::{Alg, AuthConfig, JwksSourceConfig};
use super::keys::{self, Key, KeyError, KeySet, ParsedJwks};

/// Longest a request waits for a refresh triggered by an unknown `kid` before
/// it is refused with `UnknownKid`.
pub const UNKNOWN_KID_WAIT: Duration = Duration::from_millis(500);

/// Longest one JWKS fetch may take, connection to last byte.
pub const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

/// Largest JWKS document accepted.
pub const MAX_JWKS_BYTES: usize = 1024 * 1024;

type HttpClient = Client<HttpsConnector<HttpConnector>, Empty<Bytes>>;

/// Why the key ring could not start: a key that does not load, or a JWKS
/// URL client that cannot be set up.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// Key material could not be loaded.
    #[error(transparent)]
    Key(#[from] KeyError),
    /// A JWKS URL client could not be set up.
    #[error(transparent)]
    Jwks(#[from] JwksError),
}

/// Why a JWKS fetch failed (logged; the previous keys stay in force).
#[derive(Debug, thiserror::Error)]
pub enum JwksError {
    /// Connecting or sending failed.
    #[error("{url}: request failed: {source}")]
    Request {
        /// The URL.
        url: Uri,
        /// The client error.
        source: hyper_util::client::legacy::Error,
    },
    /// A status other than 200.
    #[error("{url}: answered {status}")]
    Status {
        /// The URL.
        url: Uri,
        /// The status.
        status: StatusCode,
    },
    /// The body exceeded [`MAX_JWKS_BYTES`].
    #[error("{url}: body exceeds {max} bytes", max = MAX_JWKS_BYTES)]
    TooLarge {
        /// The URL.
        url: Uri,
    },
    /// Reading the body failed.
    #[error("{url}: reading the body failed")]
    Body {
        /// The URL.
        url: Uri,
    },
    /// No answer within [`FETCH_TIMEOUT`].
    #[error("{url}: no complete answer within {FETCH_TIMEOUT:?}")]
    Timeout {
        /// The URL.
        url: Uri,
    },
    /// The body is not a JWKS document.
    #[error(transparent)]
    Parse(#[from] KeyError),
    /// The TLS client configuration could not be built.
    #[error("{key}: TLS setup failed: {source}")]
    Tls {
        /// Dotted config key.
        key: String,
        /// The rustls error.
        source: rustls::Error,
    },
    /// `ca_file` holds no usable certificate.
    #[error("{key}: no usable CA certificate in {}", path.display())]
    BadCa {
        /// Dotted config key.
        key: String,
        /// The file.
        path: std::path::PathBuf,
    },
}

/// Fetch coordination for one URL source.
#[derive(Default)]
struct RefreshState {
    /// A fetch is running; requests join it instead of starting another.
    in_flight: bool,
    /// When an unknown `kid` last started a fetch (the rate limit).
    last_on_demand: Option<Instant>,
}

/// One `[[auth.jwks]]` entry with a `url`.
struct UrlSource {
    key: String,
    url: Uri,
    refresh: Duration,
    min_interval: Duration,
    rsa_alg: Alg,
    client: HttpClient,
    /// The last good keys; `None` until a fetch succeeded.
    keys: Mutex<Option<Vec<Arc<Key>>>>,
    state: Mutex<RefreshState>,
    /// Wakes the task for an on-demand fetch.
    wake: Notify,
    /// Counts completed fetches (good or bad); waiters watch it.
    done: watch::Sender<u64>,
}

/// All keys the verifier trusts right now.
pub(crate) struct KeyRing {
    current: ArcSwap<KeySet>,
    generation: AtomicU64,
    fixed: Vec<Arc<Key>>,
    sources: Vec<Arc<UrlSource>>,
    /// Serializes rebuilds so two sources finishing together can not publish
    /// a set missing the other's keys.
    rebuild_lock: Mutex<()>,
}

impl KeyRing {
    /// Loads the fixed keys, fetches every URL source once (failures are
    /// logged, not fatal: the task keeps trying), and starts one refresh task
    /// per URL source. The caller owns the tasks and aborts them on drop.
    pub(crate) async fn start(
        cfg: &AuthConfig,
    ) -> Result<(Arc<KeyRing>, Vec<JoinHandle<()>>), StartError> {
        let mut fixed = Vec::with_capacity(cfg.keys.len());
        for (i, key) in cfg.keys.iter().enumerate() {
            fixed.push(Arc::new(keys::load_config_key(key, i)?));
        }
        let mut sources = Vec::new();
        for (i, source) in cfg.jwks.iter().enumerate() {
            let key = format!("auth.jwks[{i}]");
            let rsa_alg = source.parsed_rsa_alg(i).map_err(KeyError::from)?;
            if let Some(doc) = &source.inline {
                fixed.extend(strict(
                    keys::parse_jwks(doc.as_bytes(), rsa_alg, &key)?,
                    &key,
                )?);
            } else if let Some(path) = &source.file {
                let doc = tokio::fs::read(path).await.map_err(|e| KeyError::Read {
                    key: format!("{key}.file"),
                    path: path.clone(),
                    source: e,
                })?;
                fixed.extend(strict(keys::parse_jwks(&doc, rsa_alg, &key)?, &key)?);
            } else if let Some(url) = source.parsed_url(i).map_err(KeyError::from)? {
                sources.push(Arc::new(UrlSource::new(key, url, source, rsa_alg).await?));
            }
        }
        let ring = Arc::new(KeyRing {
            current: ArcSwap::from_pointee(KeySet::new(fixed.clone())),
            generation: AtomicU64::new(0),
            fixed,
            sources,
            rebuild_lock: Mutex::new(()),
        });
        let initial = ring.sources.iter().map(|s| s.fetch_and_store());
        futures_util::future::join_all(initial).await;
        ring.rebuild();
        let tasks = ring
            .sources
            .iter()
            .map(|s| tokio::spawn(refresh_task(Arc::clone(s), Arc::downgrade(&ring))))
            .collect();
        Ok((ring, tasks))
    }

    /// The current generation; read it before [`KeyRing::keys`].
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// The current key set.
    pub(crate) fn keys(&self) -> Arc<KeySet> {
        self.current.load_full()
    }

    /// Whether every URL source has been fetched successfully at least once.
    pub(crate) fn ready(&self) -> bool {
        self.sources.iter().all(|s| lock(&s.keys).is_some())
    }

    /// Asks every URL source for a fresh fetch because a token named an unknown
    /// `kid`, and waits (at most [`UNKNOWN_KID_WAIT`]) for those fetches.
    /// Returns false when no fetch could be started or joined (no URL source,
    /// or all rate-limited), so the caller can refuse at once.
    pub(crate) async fn refresh_for_unknown_kid(&self) -> bool {
        let waits: Vec<_> = self
            .sources
            .iter()
            .filter_map(|s| s.request_fetch())
            .collect();
        if waits.is_empty() {
            return false;
        }
        let all = futures_util::future::join_all(waits.into_iter().map(|mut rx| async move {
            // A closed channel means the task is gone: nothing to wait for.
            let _ = rx.changed().await;
        }));
        let _ = tokio::time::timeout(UNKNOWN_KID_WAIT, all).await;
        true
    }

    /// Republishes the union of fixed and fetched keys if it changed.
    fn rebuild(&self) {
        let _serial = lock(&self.rebuild_lock);
        let mut all = self.fixed.clone();
        for source in &self.sources {
            if let Some(keys) = &*lock(&source.keys) {
                all.extend(keys.iter().cloned());
            }
        }
        let set = KeySet::new(all);
        if set.fingerprint() != self.current.load().fingerprint() {
            let count = set.len();
            self.current.store(Arc::new(set));
            let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
            tracing::info!(keys = count, generation, "auth: key set changed");
        }
    }
}

/// Config-provided JWKS must be fully usable: a typo there is an operator
/// error to report at start, not a key to drop silently.
fn strict(parsed: ParsedJwks, key: &str) -> Result<Vec<Arc<Key>>, KeyError> {
    if let Some(skipped) = parsed.skipped.into_iter().next() {
        return Err(KeyError::BadJwk {
            key: key.to_owned(),
            index: skipped.index,
            kid: skipped.kid,
            problem: skipped.problem,
        });
    }
    Ok(parsed.keys)
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panic while holding one of these short locks leaves plain data that is
    // still consistent (no multi-step updates), so poisoning is ignored.
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl UrlSource {
    async fn new(
        key: String,
        url: Uri,
        cfg: &JwksSourceConfig,
        rsa_alg: Alg,
    ) -> Result<UrlSource, StartError> {
        let pem = match &cfg.ca_file {
            Some(path) => Some(tokio::fs::read(path).await.map_err(|e| KeyError::Read {
                key: format!("{key}.ca_file"),
                path: path.clone(),
                source: e,
            })?),
            None => None,
        };
        let builder = crate::http_util::https_builder(pem.as_deref()).map_err(|e| match e {
            crate::http_util::TlsSetupError::NoCertificate => JwksError::BadCa {
                key: format!("{key}.ca_file"),
                path: cfg.ca_file.clone().unwrap_or_default(),
            },
            crate::http_util::TlsSetupError::Tls(source) => JwksError::Tls {
                key: key.clone(),
                source,
            },
        })?;
        // Plain http is only reachable for loopback URLs: config validation
        // refuses it elsewhere.
        let connector = builder
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .build();
        let client = Client::builder(TokioExecutor::new()).build(connector);
        Ok(UrlSource {
            key,
            url,
            refresh: Duration::from_secs(cfg.refresh_s),
            min_interval: Duration::from_secs(cfg.min_refresh_interval_s),
            rsa_alg,
            client,
            keys: Mutex::new(None),
            state: Mutex::new(RefreshState::default()),
            wake: Notify::new(),
            done: watch::Sender::new(0),
        })
    }

    /// Starts or joins a fetch for an unknown `kid`; `None` when rate-limited.
    /// The receiver is subscribed under the state lock, and the task publishes
    /// completion under the same lock, so a joined fetch is never missed.
    fn request_fetch(&self) -> Option<watch::Receiver<u64>> {
        let mut state = lock(&self.state);
        if !state.in_flight {
            let now = Instant::now();
            if state
                .last_on_demand
                .is_some_and(|last| now.duration_since(last) < self.min_interval)
            {
                return None;
            }
            state.last_on_demand = Some(now);
            state.in_flight = true;
            self.wake.notify_one();
        }
        Some(self.done.subscribe())
    }

    async fn fetch(&self) -> Result<ParsedJwks, JwksError> {
        let url = &self.url;
        let request = http::Request::get(url.clone())
            .header(
                http::header::ACCEPT,
                "application/jwk-set+json, application/json",
            )
            .body(Empty::new())
            .map_err(|_| JwksError::Body { url: url.clone() })?;
        let work = async {
            let response =
                self.client
                    .request(request)
                    .await
                    .map_err(|source| JwksError::Request {
                        url: url.clone(),
                        source,
                    })?;
            if response.status() != StatusCode::OK {
                return Err(JwksError::Status {
                    url: url.clone(),
                    status: response.status(),
                });
            }
            let body = Limited::new(response.into_body(), MAX_JWKS_BYTES)
                .collect()
                .await
                .map_err(|e| {
                    if e.downcast_ref::<LengthLimitError>().is_some() {
                        JwksError::TooLarge { url: url.clone() }
                    } else {
                        JwksError::Body { url: url.clone() }
                    }
                })?;
            Ok(keys::parse_jwks(&body.to_bytes(), self.rsa_alg, &self.key)?)
        };
        tokio::time::timeout(FETCH_TIMEOUT, work)
            .await
            .map_err(|_| JwksError::Timeout { url: url.clone() })?
    }

    /// Fetches and, on success, stores the keys (the caller rebuilds).
    async fn fetch_and_store(&self) {
        match self.fetch().await {
            Ok(parsed) => {
                for skipped in &parsed.skipped {
                    tracing::warn!(
                        source = %self.key,
                        index = skipped.index,
                        kid = %skipped.kid,
                        problem = %skipped.problem,
                        "auth: JWKS key skipped"
                    );
                }
                *lock(&self.keys) = Some(parsed.keys);
            }
            Err(error) => {
                tracing::warn!(source = %self.key, %error, "auth: JWKS fetch failed; keeping previous keys")
            }
        }
    }
}

async fn refresh_task(source: Arc<UrlSource>, ring: Weak<KeyRing>) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(source.refresh) => {}
            () = source.wake.notified() => {}
        }
        lock(&source.state).in_flight = true;
        source.fetch_and_store().await;
        let Some(ring) = ring.upgrade() else { return };
        ring.rebuild();
        drop(ring);
        let mut state = lock(&source.state);
        state.in_flight = false;
        source.done.send_modify(|n| *n += 1);
    }
}
