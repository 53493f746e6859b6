//! A real headless browser for end-to-end tests of the console: Debian's
//! `chromium` driven by `chromedriver` over WebDriver (W3C, plain JSON over
//! HTTP, spoken here with reqwest).
//!
//! Nothing is skipped silently: if `chromedriver` or `chromium` is missing
//! or does not start, [`Browser::start`] panics with what to install, so
//! the test fails instead of passing vacuously. CI installs
//! `chromium chromium-driver`.
//!
//! The browser runs with a throwaway profile (`--user-data-dir` in a temp
//! directory). Dropping a [`Browser`] ends the session (which closes
//! chromium) and kills chromedriver.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

/// The W3C WebDriver element reference key.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

/// A browser session.
pub struct Browser {
    driver: Child,
    port: u16,
    session: String,
    http: reqwest::Client,
    _profile: tempfile::TempDir,
}

/// An element of the current page.
#[derive(Debug, Clone)]
pub struct Element(String);

fn find_binary(env: &str, candidates: &[&str]) -> Option<String> {
    if let Ok(p) = std::env::var(env) {
        return Some(p);
    }
    candidates
        .iter()
        .find(|c| std::path::Path::new(c).exists())
        .map(|c| (*c).to_owned())
}

impl Browser {
    /// Starts chromedriver and a headless chromium session. Panics with a
    /// clear message when either cannot start.
    pub async fn start() -> Browser {
        let driver_bin = find_binary(
            "CHROMEDRIVER",
            &["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"],
        )
        .unwrap_or_else(|| {
            panic!(
                "chromedriver not found (looked at $CHROMEDRIVER, /usr/bin/chromedriver): \
                 install it with `apt-get install -y chromium chromium-driver`"
            )
        });
        let chromium = find_binary(
            "CHROMIUM",
            &["/usr/bin/chromium", "/usr/lib/chromium/chromium"],
        )
        .unwrap_or_else(|| {
            panic!(
                "chromium not found (looked at $CHROMIUM, /usr/bin/chromium): \
                 install it with `apt-get install -y chromium chromium-driver`"
            )
        });
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port for chromedriver")
            .port();
        let driver = Command::new(&driver_bin)
            .arg(format!("--port={port}"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {driver_bin}: {e}"));
        let profile = tempfile::tempdir().expect("browser profile dir");
        super::install_crypto();
        let http = reqwest::Client::builder()
            .no_proxy()
            .timeout(Duration::from_secs(60))
            .build()
            .expect("webdriver client");
        let mut browser = Browser {
            driver,
            port,
            session: String::new(),
            http,
            _profile: profile,
        };
        browser.wait_ready().await;
        let caps = json!({
            "capabilities": { "alwaysMatch": {
                "browserName": "chrome",
                "goog:chromeOptions": {
                    "binary": chromium,
                    "args": [
                        "--headless",
                        "--no-sandbox",
                        "--disable-gpu",
                        "--disable-dev-shm-usage",
                        "--disable-background-networking",
                        "--disable-component-update",
                        "--no-first-run",
                        format!("--user-data-dir={}", browser._profile.path().display()),
                    ]
                }
            }}
        });
        let created = browser.raw("POST", "/session", Some(caps)).await;
        browser.session = match created.get("value").and_then(|v| v.get("sessionId")) {
            Some(Value::String(id)) => id.clone(),
            _ => panic!(
                "chromium did not start under chromedriver ({chromium}): {created}. \
                 Is the `chromium` package installed and runnable headless?"
            ),
        };
        browser
    }

    async fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(status)) = self.driver.try_wait() {
                panic!("chromedriver exited at start with {status}");
            }
            let url = format!("http://127.0.0.1:{}/status", self.port);
            if let Ok(r) = self.http.get(&url).send().await {
                if let Ok(v) = r.json::<Value>().await {
                    if v["value"]["ready"] == true {
                        return;
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "chromedriver did not become ready on port {} within 15 s",
                self.port
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn raw(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let url = format!("http://127.0.0.1:{}{path}", self.port);
        let req = match method {
            "GET" => self.http.get(&url),
            "POST" => self
                .http
                .post(&url)
                .json(&body.unwrap_or_else(|| json!({}))),
            "DELETE" => self.http.delete(&url),
            m => panic!("unsupported WebDriver method {m}"),
        };
        let resp = req
            .send()
            .await
            .unwrap_or_else(|e| panic!("WebDriver {method} {path}: {e}"));
        resp.json::<Value>()
            .await
            .unwrap_or_else(|e| panic!("WebDriver {method} {path}: not JSON: {e}"))
    }

    /// A session command; panics on a WebDriver error.
    async fn cmd(&self, method: &str, path: &str, body: Option<Value>) -> Value {
        let v = self
            .raw(method, &format!("/session/{}{path}", self.session), body)
            .await;
        if let Some(err) = v["value"].get("error") {
            panic!(
                "WebDriver {method} {path} failed: {err}: {}",
                v["value"]["message"]
            );
        }
        v["value"].clone()
    }

    /// Navigates and waits for the page to load.
    pub async fn goto(&self, url: &str) {
        self.cmd("POST", "/url", Some(json!({ "url": url }))).await;
    }

    /// The first element matching `css`, if any.
    pub async fn try_find(&self, css: &str) -> Option<Element> {
        let v = self
            .raw(
                "POST",
                &format!("/session/{}/element", self.session),
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        v["value"][ELEMENT]
            .as_str()
            .map(|id| Element(id.to_owned()))
    }

    /// The first element matching `css`, waiting up to `timeout` for it.
    pub async fn wait_for(&self, css: &str, timeout: Duration) -> Element {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = self.try_find(css).await {
                return e;
            }
            assert!(
                Instant::now() < deadline,
                "no element matches {css:?} after {timeout:?}; page text: {}",
                self.page_text().await
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Types into an element.
    pub async fn send_keys(&self, e: &Element, text: &str) {
        self.cmd(
            "POST",
            &format!("/element/{}/value", e.0),
            Some(json!({ "text": text })),
        )
        .await;
    }

    /// Clicks an element.
    pub async fn click(&self, e: &Element) {
        self.cmd("POST", &format!("/element/{}/click", e.0), Some(json!({})))
            .await;
    }

    /// The rendered text of an element.
    pub async fn text(&self, e: &Element) -> String {
        self.cmd("GET", &format!("/element/{}/text", e.0), None)
            .await
            .as_str()
            .unwrap_or_default()
            .to_owned()
    }

    /// Runs `script` (a function body; `return` a value) in the page.
    pub async fn execute(&self, script: &str) -> Value {
        self.cmd(
            "POST",
            "/execute/sync",
            Some(json!({ "script": script, "args": [] })),
        )
        .await
    }

    /// Records every message the console's status line shows from now on,
    /// as `class|text`: its own refresh may overwrite one before a test
    /// reads it. See [`Browser::wait_said`].
    pub async fn record_status(&self) {
        self.execute(
            "window.__said = []; var s = document.getElementById('status'); \
             new MutationObserver(function () { window.__said.push(s.className + '|' + s.textContent); }) \
             .observe(s, {childList: true, characterData: true, subtree: true}); return true;",
        )
        .await;
    }

    /// Waits until the status line has shown a message of `class` starting
    /// with `prefix` since [`Browser::record_status`].
    pub async fn wait_said(&self, class: &str, prefix: &str, timeout: Duration) {
        let want = format!("{class}|{prefix}");
        let deadline = std::time::Instant::now() + timeout;
        loop {
            let said = self.execute("return window.__said;").await;
            let seen = said.as_array().is_some_and(|all| {
                all.iter()
                    .any(|m| m.as_str().is_some_and(|m| m.starts_with(&want)))
            });
            if seen {
                return;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the status line never said {want:?}; it said: {said}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Opens the review console at `url` and signs in with `token`.
    pub async fn sign_in(&self, url: &str, token: &str) {
        self.goto(url).await;
        let field = self.wait_for("#token", Duration::from_secs(10)).await;
        self.send_keys(&field, token).await;
        let save = self.wait_for("#save-token", Duration::from_secs(5)).await;
        self.click(&save).await;
    }

    /// Asserts that text an attacker controls (an `<img onerror>` in it)
    /// was shown as text: no image in the page, the title unchanged.
    pub async fn assert_no_markup_injected(&self) {
        let injected = self
            .execute("return [document.querySelectorAll('img').length, document.title]")
            .await;
        assert_eq!(
            injected,
            json!([0, "mcp-firewall review: approvals and tool pins"])
        );
    }

    /// The page's whole text, for failure messages.
    pub async fn page_text(&self) -> String {
        let v = self
            .raw(
                "POST",
                &format!("/session/{}/execute/sync", self.session),
                Some(json!({"script": "return document.body ? document.body.innerText : ''", "args": []})),
            )
            .await;
        v["value"].as_str().unwrap_or_default().to_owned()
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Ending the session closes chromium; a plain blocking request,
        // since Drop cannot await.
        if !self.session.is_empty() {
            if let Ok(mut s) = TcpStream::connect(("127.0.0.1", self.port)) {
                let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
                let _ = write!(
                    s,
                    "DELETE /session/{} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\nContent-Length: 0\r\n\r\n",
                    self.session
                );
                let mut sink = Vec::new();
                let _ = s.read_to_end(&mut sink);
            }
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}
