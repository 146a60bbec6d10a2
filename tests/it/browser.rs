//! A headless Chromium driven through chromedriver (WebDriver), for the dashboard's tests.
//!
//! The browser and driver come from `SKED_CHROMIUM` and `SKED_CHROMEDRIVER` (set by
//! `cargo xtask test`), else from the PATH. Without them the tests fail and say how to get
//! them, unless `SKED_BROWSER_TESTS=skip`. One browser runs at a time in the whole test
//! binary ([`Browser::start`] holds a lock): two Chromiums on two cores make timings flaky.
//! Screenshots go to `target/test-output/dashboard/`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use fantoccini::wd::WebDriverCompatibleCommand;
use fantoccini::{Client, ClientBuilder, Locator};
use serde_json::{Value, json};
use tokio::sync::{Mutex, MutexGuard};

use crate::support::free_port;

static ONE_BROWSER: Mutex<()> = Mutex::const_new(());

/// How long a test waits for the page to show something before failing.
pub const PATIENCE: Duration = Duration::from_secs(15);

pub struct Browser {
    pub client: Client,
    driver: tokio::process::Child,
    _profile: TempDir,
    _lock: MutexGuard<'static, ()>,
}

/// Why no browser: skipped on request.
pub struct Skipped;

impl Browser {
    /// Starts chromedriver and a headless Chromium with a fresh profile, `width`×`height`.
    pub async fn start(width: u32, height: u32, dark: bool) -> Result<Browser, Skipped> {
        if std::env::var("SKED_BROWSER_TESTS").is_ok_and(|v| v == "skip") {
            eprintln!("SKED_BROWSER_TESTS=skip: this browser test does not run");
            return Err(Skipped);
        }
        let lock = ONE_BROWSER.lock().await;
        let chromium = tool(
            "SKED_CHROMIUM",
            &["chromium", "chromium-browser", "google-chrome"],
        );
        let driver_bin = tool("SKED_CHROMEDRIVER", &["chromedriver"]);
        let port = free_port();
        let driver = tokio::process::Command::new(&driver_bin)
            .arg(format!("--port={port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", driver_bin.display()));
        let profile = TempDir::new("sked-chromium");
        let mut args = vec![
            "--headless=new".to_owned(),
            "--no-sandbox".to_owned(),
            "--disable-gpu".to_owned(),
            "--disable-dev-shm-usage".to_owned(),
            "--disable-background-networking".to_owned(),
            "--disable-component-update".to_owned(),
            "--disable-sync".to_owned(),
            "--disable-quic".to_owned(),
            "--no-first-run".to_owned(),
            "--hide-scrollbars".to_owned(),
            format!("--user-data-dir={}", profile.0.display()),
            format!("--window-size={width},{height}"),
        ];
        if dark {
            args.push("--blink-settings=preferredColorScheme=0".to_owned());
        }
        let mut options = json!({ "binary": chromium, "args": args });
        if width < 500 {
            // A desktop window cannot be narrower than 500 px: emulate a phone's viewport.
            options["mobileEmulation"] = json!({
                "deviceMetrics": { "width": width, "height": height, "pixelRatio": 2.0 }
            });
        }
        let caps = json!({
            "browserName": "chrome",
            "goog:chromeOptions": options,
            "goog:loggingPrefs": { "browser": "ALL" },
        });
        let caps = match caps {
            Value::Object(map) => map,
            _ => unreachable!(),
        };
        let url = format!("http://127.0.0.1:{port}");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let client = loop {
            let connector = hyper_util::client::legacy::connect::HttpConnector::new();
            match ClientBuilder::new(connector)
                .capabilities(caps.clone())
                .connect(&url)
                .await
            {
                Ok(c) => break c,
                Err(e) if tokio::time::Instant::now() < deadline => {
                    let _ = e;
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(e) => panic!("connecting to chromedriver at {url}: {e}"),
            }
        };
        Ok(Browser {
            client,
            driver,
            _profile: profile,
            _lock: lock,
        })
    }

    pub async fn goto(&self, url: &str) {
        self.client.goto(url).await.expect("navigate");
    }

    /// Waits until `css` matches an element, and returns it.
    pub async fn wait(&self, css: &str) -> fantoccini::elements::Element {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if let Ok(e) = self.client.find(Locator::Css(css)).await {
                return e;
            }
            if tokio::time::Instant::now() > deadline {
                self.snapshot("timeout").await;
                panic!("nothing matched {css:?} within {PATIENCE:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until a JavaScript expression is truthy.
    pub async fn wait_js(&self, what: &str, expr: &str) {
        let deadline = tokio::time::Instant::now() + PATIENCE;
        loop {
            if self.js(expr).await.as_bool() == Some(true) {
                return;
            }
            if tokio::time::Instant::now() > deadline {
                self.snapshot("timeout").await;
                panic!("{what}: `{expr}` was not true within {PATIENCE:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The value of a JavaScript expression.
    pub async fn js(&self, expr: &str) -> Value {
        self.client
            .execute(&format!("return ({expr});"), vec![])
            .await
            .unwrap_or(Value::Null)
    }

    /// Whether `css` matches an element now.
    pub async fn exists(&self, css: &str) -> bool {
        self.client.find(Locator::Css(css)).await.is_ok()
    }

    /// Saves a screenshot as `target/test-output/dashboard/<name>.png` and returns its path.
    pub async fn screenshot(&self, name: &str) -> PathBuf {
        let png = self.client.screenshot().await.expect("screenshot");
        assert!(png.starts_with(b"\x89PNG"), "a screenshot is a PNG");
        let dir = output_dir();
        std::fs::create_dir_all(&dir).expect("create the test-output folder");
        let path = dir.join(format!("{name}.png"));
        std::fs::write(&path, png).expect("write the screenshot");
        path
    }

    async fn snapshot(&self, name: &str) {
        if let Ok(png) = self.client.screenshot().await {
            let dir = output_dir();
            let _ = std::fs::create_dir_all(&dir);
            let _ = std::fs::write(dir.join(format!("failed-{name}.png")), png);
        }
        if let Ok(html) = self.client.source().await {
            eprintln!("page at failure: {}", &html[..html.len().min(4000)]);
        }
    }

    /// The browser console's messages at level SEVERE (errors) since the last call.
    pub async fn console_errors(&self) -> Vec<String> {
        let logs = self
            .client
            .issue_cmd(BrowserLog)
            .await
            .expect("read the browser console");
        logs.as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["level"] == "SEVERE" || e["level"] == "WARNING")
            .map(|e| e["message"].as_str().unwrap_or_default().to_owned())
            .collect()
    }

    /// Makes every page opened from now on unable to open a websocket, as behind a proxy
    /// that blocks them (`new WebSocket(…)` throws).
    pub async fn block_websockets(&self) {
        self.client
            .issue_cmd(Cdp {
                cmd: "Page.addScriptToEvaluateOnNewDocument",
                params: json!({
                    "source": "window.WebSocket = function () { throw new Error('websockets are blocked'); };"
                }),
            })
            .await
            .expect("install the websocket blocker");
    }

    /// Makes the page's time zone `zone` (an IANA name), as a browser set to it would have.
    pub async fn set_time_zone(&self, zone: &str) {
        self.client
            .issue_cmd(Cdp {
                cmd: "Emulation.setTimezoneOverride",
                params: json!({ "timezoneId": zone }),
            })
            .await
            .expect("set the time zone");
    }

    pub async fn close(mut self) {
        let _ = self.client.clone().close().await;
        let _ = self.driver.kill().await;
    }
}

/// chromedriver's `POST /session/{id}/se/log` with `{"type": "browser"}`.
#[derive(Debug)]
struct BrowserLog;

impl WebDriverCompatibleCommand for BrowserLog {
    fn endpoint(
        &self,
        base_url: &url::Url,
        session_id: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base_url.join(&format!(
            "session/{}/se/log",
            session_id.unwrap_or_default()
        ))
    }

    fn method_and_body(&self, _: &url::Url) -> (http::Method, Option<String>) {
        (http::Method::POST, Some(r#"{"type":"browser"}"#.to_owned()))
    }
}

/// chromedriver's `POST /session/{id}/goog/cdp/execute`: a Chrome DevTools Protocol command.
#[derive(Debug)]
struct Cdp {
    cmd: &'static str,
    params: Value,
}

impl WebDriverCompatibleCommand for Cdp {
    fn endpoint(
        &self,
        base_url: &url::Url,
        session_id: Option<&str>,
    ) -> Result<url::Url, url::ParseError> {
        base_url.join(&format!(
            "session/{}/goog/cdp/execute",
            session_id.unwrap_or_default()
        ))
    }

    fn method_and_body(&self, _: &url::Url) -> (http::Method, Option<String>) {
        let body = json!({ "cmd": self.cmd, "params": self.params });
        (http::Method::POST, Some(body.to_string()))
    }
}

pub fn output_dir() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(|d| root.join(d))
        .unwrap_or_else(|| root.join("target"));
    target.join("test-output").join("dashboard")
}

fn tool(var: &str, names: &[&str]) -> PathBuf {
    if let Some(p) = std::env::var_os(var).filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    for dir in std::env::split_paths(&path) {
        for name in names {
            let p = dir.join(name);
            if p.is_file() {
                return p;
            }
        }
    }
    panic!(
        "the dashboard's browser tests need {} (set {var}, or put it on the PATH; on Debian: \
         apt-get install chromium chromium-driver). SKED_BROWSER_TESTS=skip leaves them out.",
        names[0]
    );
}

struct TempDir(PathBuf);

impl TempDir {
    fn new(prefix: &str) -> TempDir {
        let dir = std::env::temp_dir().join(format!("{prefix}-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("create a temporary folder");
        TempDir(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
