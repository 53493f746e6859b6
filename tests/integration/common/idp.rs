//! A real OAuth 2.0 authorization server for integration tests:
//! `tests/idp/as.py` (Authlib + Flask, see `tests/idp/README.md`) in a Python
//! venv, listening on 127.0.0.1 only, on a port picked at runtime, with its
//! config and log in a temp dir.
//!
//! It does RFC 8693 token exchange (client_secret_basic, private_key_jwt),
//! client credentials, authorization code with PKCE S256 and rotating refresh
//! tokens, and issues signed JWT access tokens ([`Idp::public_jwks`]). Tests
//! read what it was asked ([`Idp::log`]) and make its token endpoint misbehave
//! ([`Idp::set_mode`]).
//!
//! The venv ([`venv`]) is made once per process and kept across processes in
//! `target/test-cache/idp-venv`, re-made when `tests/idp/requirements.txt` or
//! the interpreter changes. Making it needs `/usr/bin/python3` with its venv
//! module (Debian: `python3-venv`) and PyPI; `$MCPFW_IDP_PYTHON` names
//! another interpreter. Tests never skip: no venv is a panic.
//!
//! Invariant: no server outlives the test process: it is killed on drop, and a
//! watchdog shell (the pattern of `redis.rs`) kills it and removes its
//! directory once the test process is gone, even after a SIGKILL.

// Each test binary uses a subset of this shared harness.
#![allow(dead_code)]

use std::ffi::OsStr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use base64::Engine as _;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use tokio::sync::OnceCell;

/// How long the server gets to answer its metadata URL after spawning.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Bound on one control request (`/_log`, `/_mode`, `/jwks`).
const CONTROL_TIMEOUT: Duration = Duration::from_secs(30);

/// Names the requirements and interpreter a venv was made for.
const MARKER: &str = ".mcpfw-idp-venv";

/// What the server knows: its clients and whom it trusts for subject tokens.
#[derive(Clone, Debug)]
pub struct IdpConfig {
    /// Client entries as `as.py` reads them: `client_id`, `client_secret`
    /// (client_secret_basic) or `jwks` (private_key_jwt), `redirect_uris`,
    /// `grant_types` (e.g. `urn:ietf:params:oauth:grant-type:token-exchange`,
    /// `client_credentials`, `authorization_code`, `refresh_token`),
    /// `token_endpoint_auth_method` (`client_secret_basic`, `private_key_jwt`
    /// or `none`) and optionally `scope` (what the client may ask for).
    pub clients: Vec<Value>,
    /// The `iss` subject tokens must carry.
    pub subject_issuer: String,
    /// The keys subject tokens are verified with (a JWKS; an `oct` key allows
    /// HS256, see [`hs256_jwks`]).
    pub subject_jwks: Value,
    /// `aud` of issued tokens when a request names no `audience`/`resource`.
    pub default_audience: String,
    /// Lifetime of issued access tokens (`expires_in`, `exp - iat`).
    pub token_lifetime_s: u64,
}

/// A running test authorization server (killed when dropped).
pub struct Idp {
    /// `http://127.0.0.1:PORT`, also the `iss` of its tokens.
    pub issuer: String,
    /// `<issuer>/token`
    pub token_endpoint: String,
    /// `<issuer>/authorize`
    pub authorization_endpoint: String,
    /// `<issuer>/revoke`
    pub revocation_endpoint: String,
    /// `<issuer>/jwks`
    pub jwks_uri: String,
    /// TCP port.
    pub port: u16,
    dir: PathBuf,
    http: reqwest::Client,
    server: Mutex<Option<Child>>,
    watchdog: Mutex<Option<Child>>,
}

impl Idp {
    /// Starts a server with `cfg` (users `alice` and `bob`; `/authorize`
    /// approves `login_hint`, by default `alice`) and waits until its RFC 8414
    /// metadata answers.
    pub async fn start(cfg: IdpConfig) -> Idp {
        let python = venv().await.join("bin").join("python");
        let script = manifest_dir().join("tests/idp/as.py");
        let mut last_err = String::new();
        // Ports are probed then released, so another process may grab one in
        // between: retry with fresh ports.
        for _ in 0..3 {
            let port = super::watchdog::free_port();
            let dir = std::env::temp_dir().join(format!(
                "mcpfw-idp-{}-{}",
                std::process::id(),
                rand::random::<u32>()
            ));
            std::fs::create_dir_all(&dir).expect("create idp dir");
            let issuer = format!("http://127.0.0.1:{port}");
            let idp = Idp {
                token_endpoint: format!("{issuer}/token"),
                authorization_endpoint: format!("{issuer}/authorize"),
                revocation_endpoint: format!("{issuer}/revoke"),
                jwks_uri: format!("{issuer}/jwks"),
                issuer,
                port,
                dir,
                http: super::http(),
                server: Mutex::new(None),
                watchdog: Mutex::new(None),
            };
            // Dropping `idp` on failure kills what was started and removes
            // the directory.
            if let Err(e) = idp.write_config(&cfg).and_then(|()| idp.spawn_watchdog()) {
                panic!("could not start the test authorization server: {e}");
            }
            match idp.spawn(&python, &script).await {
                Ok(()) => return idp,
                Err(e) => last_err = e,
            }
        }
        panic!("could not start the test authorization server (tests/idp/as.py): {last_err}");
    }

    /// Every token-endpoint request handled so far, oldest first: objects with
    /// `grant_type`, `client_id`, `ok` and, when they apply, `error`,
    /// `error_description`, `status`, `mode`, `audience`, `resource`, `scope`,
    /// `subject_token_type`, `requested_token_type`, `subject_sub`,
    /// `subject_run_id`, `subject_tenant_id`, `refresh_reuse`. `audience` and
    /// `resource` are a string, or a list when repeated.
    pub async fn log(&self) -> Vec<Value> {
        match self.get_json("/_log").await {
            Value::Array(entries) => entries,
            other => panic!("/_log answered {other}"),
        }
    }

    /// Forgets the log.
    pub async fn clear_log(&self) {
        let url = format!("{}/_log", self.issuer);
        let resp = self
            .http
            .delete(&url)
            .timeout(CONTROL_TIMEOUT)
            .send()
            .await
            .unwrap_or_else(|e| panic!("DELETE {url}: {e}; log:\n{}", self.log_tail()));
        assert!(
            resp.status().is_success(),
            "DELETE {url}: {}",
            resp.status()
        );
    }

    /// How the token endpoint answers from now on: `ok`; `refuse` (400
    /// `{"error":"invalid_grant"}`); `error500` (500, text body); `slow` (10 s,
    /// then normally); `garbage` (200, `{"access_token": 5, ...}`); `notjson`
    /// (200, an HTML body).
    pub async fn set_mode(&self, mode: &str) {
        self.set_mode_with(json!({ "mode": mode })).await;
    }

    /// [`Idp::set_mode`] with options: `{"mode": "refuse", "times": 2}` (for
    /// the next 2 requests, then `ok`), `{"mode": "slow", "delay_s": 3}`.
    pub async fn set_mode_with(&self, body: Value) {
        let url = format!("{}/_mode", self.issuer);
        let resp = self
            .http
            .post(&url)
            .json(&body)
            .timeout(CONTROL_TIMEOUT)
            .send()
            .await
            .unwrap_or_else(|e| panic!("POST {url}: {e}; log:\n{}", self.log_tail()));
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        assert!(status.is_success(), "POST {url} {body}: {status}: {text}");
    }

    /// The server's signing keys (`GET /jwks`), for [`verify`].
    pub async fn public_jwks(&self) -> Value {
        self.get_json("/jwks").await
    }

    /// The RFC 8414 metadata document.
    pub async fn metadata(&self) -> Value {
        self.get_json("/.well-known/oauth-authorization-server")
            .await
    }

    /// Last lines of the server's log (stderr), for failure messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.dir.join("as.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(40);
        lines[from..].join("\n")
    }

    async fn get_json(&self, path: &str) -> Value {
        let url = format!("{}{path}", self.issuer);
        let resp = self
            .http
            .get(&url)
            .timeout(CONTROL_TIMEOUT)
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {url}: {e}; log:\n{}", self.log_tail()));
        let status = resp.status();
        let text = resp.text().await.unwrap_or_default();
        assert!(status.is_success(), "GET {url}: {status}: {text}");
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("GET {url}: not JSON ({e}): {text}"))
    }

    fn write_config(&self, cfg: &IdpConfig) -> Result<(), String> {
        let config = json!({
            "port": self.port,
            "issuer": self.issuer,
            "clients": cfg.clients,
            "subject_issuer": cfg.subject_issuer,
            "subject_jwks": cfg.subject_jwks,
            "default_audience": cfg.default_audience,
            "token_lifetime_s": cfg.token_lifetime_s,
            "users": ["alice", "bob"],
        });
        let text = serde_json::to_vec_pretty(&config).expect("config serializes");
        std::fs::write(self.dir.join("config.json"), text)
            .map_err(|e| format!("writing config.json: {e}"))
    }

    /// One watchdog per server, for its whole life.
    fn spawn_watchdog(&self) -> Result<(), String> {
        let wd = super::watchdog::spawn(super::watchdog::KILL_GROUP, &self.dir)?;
        *self.watchdog.lock().unwrap() = Some(wd);
        Ok(())
    }

    async fn spawn(&self, python: &Path, script: &Path) -> Result<(), String> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("as.log"))
            .map_err(|e| format!("opening as.log: {e}"))?;
        let log2 = log.try_clone().map_err(|e| format!("as.log: {e}"))?;
        let mut child = Command::new(python)
            .arg("-u")
            .arg(script)
            .arg(self.dir.join("config.json"))
            .current_dir(&self.dir)
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .env_remove("PYTHONPATH")
            .env_remove("PYTHONHOME")
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log2)
            // Its own group, so that the watchdog and drop kill all of it.
            .process_group(0)
            .spawn()
            .map_err(|e| format!("spawning {}: {e}", python.display()))?;
        if let Err(e) = std::fs::write(self.dir.join("harness.pid"), child.id().to_string()) {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("writing harness.pid: {e}"));
        }
        crate::common::watchdog::until_ready(
            &mut child,
            &self.dir,
            &format!("metadata on port {} (as.py)", self.port),
            START_TIMEOUT,
            Duration::from_millis(50),
            || self.answers(),
            || self.log_tail(),
        )
        .await?;
        *self.server.lock().unwrap() = Some(child);
        Ok(())
    }

    /// Whether the metadata URL answers with this server's issuer (not some
    /// other process that took the port).
    async fn answers(&self) -> bool {
        let url = format!("{}/.well-known/oauth-authorization-server", self.issuer);
        let Ok(resp) = self
            .http
            .get(url)
            .timeout(Duration::from_secs(2))
            .send()
            .await
        else {
            return false;
        };
        if !resp.status().is_success() {
            return false;
        }
        match resp.json::<Value>().await {
            Ok(v) => v["issuer"].as_str() == Some(self.issuer.as_str()),
            Err(_) => false,
        }
    }
}

impl Drop for Idp {
    fn drop(&mut self) {
        if let Some(mut child) = self.server.lock().unwrap().take() {
            let _ = Command::new("sh")
                .arg("-c")
                .arg("kill -9 \"-$0\" 2>/dev/null")
                .arg(child.id().to_string())
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(self.dir.join("harness.pid"));
        // Closing its stdin makes the watchdog remove the directory.
        if let Some(mut wd) = self.watchdog.lock().unwrap().take() {
            drop(wd.stdin.take());
            let _ = wd.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The venv with `tests/idp/requirements.txt`: `target/test-cache/idp-venv`,
/// made once per process and reused across processes while its marker names
/// the same requirements and interpreter. A venv is made in a temp directory
/// beside it and renamed into place (only `bin/python` is used, which works
/// after a move), so concurrent test processes never see half of one. Panics
/// when it cannot be made.
pub async fn venv() -> PathBuf {
    static VENV: OnceCell<PathBuf> = OnceCell::const_new();
    VENV.get_or_init(make_venv).await.clone()
}

async fn make_venv() -> PathBuf {
    let root = manifest_dir().join("target").join("test-cache");
    let dir = root.join("idp-venv");
    let requirements = manifest_dir().join("tests/idp/requirements.txt");
    let python = python();
    let wanted = venv_id(&python, &requirements).await;
    if venv_ready(&dir, &wanted) {
        return dir;
    }
    std::fs::create_dir_all(&root).unwrap_or_else(|e| panic!("creating {}: {e}", root.display()));
    let tmp = root.join(format!(
        "idp-venv.tmp-{}-{}",
        std::process::id(),
        rand::random::<u32>()
    ));
    let made = async {
        run_setup(
            Path::new(&python),
            &[OsStr::new("-m"), OsStr::new("venv"), tmp.as_os_str()],
        )
        .await?;
        run_setup(
            &tmp.join("bin").join("python"),
            &[
                OsStr::new("-m"),
                OsStr::new("pip"),
                OsStr::new("install"),
                OsStr::new("--quiet"),
                OsStr::new("--disable-pip-version-check"),
                OsStr::new("--no-input"),
                OsStr::new("-r"),
                requirements.as_os_str(),
            ],
        )
        .await?;
        std::fs::write(tmp.join(MARKER), &wanted)
            .map_err(|e| format!("writing the venv marker: {e}"))
    }
    .await;
    if let Err(e) = made {
        let _ = std::fs::remove_dir_all(&tmp);
        panic!("{}", setup_help(&python, &e));
    }
    for _ in 0..3 {
        match std::fs::rename(&tmp, &dir) {
            Ok(()) => return dir,
            Err(_) if venv_ready(&dir, &wanted) => {
                // Another process got there first.
                let _ = std::fs::remove_dir_all(&tmp);
                return dir;
            }
            Err(_) => {
                // A stale venv (other requirements): move it aside, drop it.
                let old = root.join(format!(
                    "idp-venv.old-{}-{}",
                    std::process::id(),
                    rand::random::<u32>()
                ));
                if std::fs::rename(&dir, &old).is_ok() {
                    let _ = std::fs::remove_dir_all(&old);
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&tmp);
    panic!(
        "could not put the test IdP venv in place at {}",
        dir.display()
    );
}

/// Identifies a venv: the requirements, the interpreter and its version.
async fn venv_id(python: &str, requirements: &Path) -> String {
    let reqs = std::fs::read(requirements)
        .unwrap_or_else(|e| panic!("reading {}: {e}", requirements.display()));
    let version = tokio::process::Command::new(python)
        .arg("--version")
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap_or_else(|e| {
            panic!(
                "{}",
                setup_help(python, &format!("running `{python} --version`: {e}"))
            )
        });
    let mut h = Sha256::new();
    h.update(&reqs);
    h.update([0u8]);
    h.update(python.as_bytes());
    h.update([0u8]);
    h.update(&version.stdout);
    h.update(&version.stderr);
    h.finalize().iter().map(|b| format!("{b:02x}")).collect()
}

fn venv_ready(dir: &Path, wanted: &str) -> bool {
    dir.join("bin").join("python").exists()
        && std::fs::read_to_string(dir.join(MARKER)).is_ok_and(|m| m.trim() == wanted)
}

/// Runs one venv setup step; `Err` carries its output.
async fn run_setup(program: &Path, args: &[&OsStr]) -> Result<(), String> {
    let shown = format!(
        "{} {}",
        program.display(),
        args.iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" ")
    );
    let out = tokio::process::Command::new(program)
        .args(args)
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        .env("PIP_NO_INPUT", "1")
        .env_remove("PYTHONPATH")
        .env_remove("PYTHONHOME")
        .env_remove("VIRTUAL_ENV")
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| format!("running `{shown}`: {e}"))?;
    if out.status.success() {
        return Ok(());
    }
    Err(format!(
        "`{shown}` failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    ))
}

fn setup_help(python: &str, what: &str) -> String {
    format!(
        "could not make the test IdP's Python venv: {what}\n\
         The token-exchange tests need {python} with its venv module (Debian: \
         `apt-get install python3-venv`) and PyPI reachable for \
         tests/idp/requirements.txt; set MCPFW_IDP_PYTHON to use another \
         interpreter."
    )
}

/// The interpreter venvs are made with.
fn python() -> String {
    if let Ok(p) = std::env::var("MCPFW_IDP_PYTHON") {
        return p;
    }
    if Path::new("/usr/bin/python3").exists() {
        return "/usr/bin/python3".into();
    }
    "python3".into()
}

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The claims of a JWT, base64url-decoded, NOT verified: for looking at
/// tokens. Tests check signatures with [`verify`].
pub fn decode_claims(jwt: &str) -> Value {
    decode_part(jwt, 1)
}

/// The header of a JWT (`alg`, `kid`, `typ`), not verified.
pub fn decode_header(jwt: &str) -> Value {
    decode_part(jwt, 0)
}

fn decode_part(jwt: &str, index: usize) -> Value {
    let parts: Vec<&str> = jwt.split('.').collect();
    assert_eq!(parts.len(), 3, "not a compact JWS: {jwt:?}");
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(parts[index].trim_end_matches('='))
        .unwrap_or_else(|e| panic!("JWT part {index} is not base64url ({e}): {jwt:?}"));
    serde_json::from_slice(&bytes)
        .unwrap_or_else(|e| panic!("JWT part {index} is not JSON ({e}): {jwt:?}"))
}

/// Verifies `jwt` against `jwks` (e.g. [`Idp::public_jwks`]) with
/// jsonwebtoken: an asymmetric `alg`, the key named by `kid` (or the only
/// key), the signature, `aud` containing `audience`, `exp` (jsonwebtoken's
/// default 60 s leeway) and the presence of `iss`, `sub`, `exp`, `aud`.
/// Returns the claims; panics when anything fails.
pub fn verify(jwt: &str, jwks: &Value, audience: &str) -> Value {
    try_verify(jwt, jwks, audience)
        .unwrap_or_else(|e| panic!("token does not verify: {e}\nclaims: {}", decode_claims(jwt)))
}

/// [`verify`], with `Err` instead of a panic (for negative tests).
pub fn try_verify(jwt: &str, jwks: &Value, audience: &str) -> Result<Value, String> {
    use jsonwebtoken::jwk::JwkSet;
    use jsonwebtoken::{Algorithm, DecodingKey, Validation};

    let header = jsonwebtoken::decode_header(jwt).map_err(|e| format!("header: {e}"))?;
    if !matches!(
        header.alg,
        Algorithm::ES256
            | Algorithm::ES384
            | Algorithm::RS256
            | Algorithm::PS256
            | Algorithm::EdDSA
    ) {
        return Err(format!("unexpected alg {:?}", header.alg));
    }
    let set: JwkSet = serde_json::from_value(jwks.clone()).map_err(|e| format!("JWKS: {e}"))?;
    let jwk = match header.kid.as_deref() {
        Some(kid) => set
            .find(kid)
            .ok_or_else(|| format!("no key {kid:?} in the JWKS"))?,
        None if set.keys.len() == 1 => &set.keys[0],
        None => return Err("no kid in the header and several keys in the JWKS".into()),
    };
    let key = DecodingKey::from_jwk(jwk).map_err(|e| format!("key: {e}"))?;
    let mut validation = Validation::new(header.alg);
    validation.set_audience(&[audience]);
    validation.set_required_spec_claims(&["exp", "aud", "iss", "sub"]);
    jsonwebtoken::decode::<Value>(jwt, &key, &validation)
        .map(|data| data.claims)
        .map_err(|e| e.to_string())
}

/// A JWKS with one `oct` key, so that [`IdpConfig::subject_jwks`] accepts
/// HS256 subject tokens signed with `secret` (as the firewall's test tokens
/// are, see `common::SECRET`). With `kid: None` the tokens need no `kid`.
pub fn hs256_jwks(secret: &[u8], kid: Option<&str>) -> Value {
    let mut key = json!({
        "kty": "oct",
        "alg": "HS256",
        "k": base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(secret),
    });
    if let Some(kid) = kid {
        key["kid"] = json!(kid);
    }
    json!({ "keys": [key] })
}
