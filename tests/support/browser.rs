//! Headless Chromium for the dashboard's test, driven through the DevTools protocol
//! (`chromiumoxide`). Debian's `chromium` is installed on first use (`apt-get update` once,
//! then `apt-get install -y chromium`, under a lock shared by the test binaries); a browser that
//! cannot be installed or started fails the test, it never skips it.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use chromiumoxide::browser::{Browser, BrowserConfig};
use chromiumoxide::page::{Page, ScreenshotParams};
use futures::StreamExt;
use serde::de::DeserializeOwned;

use super::serve::PATIENCE;

const CHROMIUM: &str = "/usr/bin/chromium";

/// The Chromium binary, installed if missing.
pub fn chromium() -> PathBuf {
    let path = PathBuf::from(CHROMIUM);
    if path.exists() {
        return path;
    }
    let dir = super::script::project_root().join("target/tmp");
    std::fs::create_dir_all(&dir).expect("target/tmp");
    let lock = std::fs::File::create(dir.join("chromium-install.lock")).expect("the install lock");
    lock.lock().expect("take the install lock");
    if !path.exists() {
        run(Command::new("apt-get").arg("update"), "apt-get update");
        run(
            Command::new("apt-get")
                .args(["install", "-y", "chromium"])
                .env("DEBIAN_FRONTEND", "noninteractive"),
            "apt-get install -y chromium",
        );
    }
    assert!(
        path.exists(),
        "apt-get installed chromium but {CHROMIUM} is missing"
    );
    path
}

fn run(cmd: &mut Command, what: &str) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run it: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}): the dashboard test needs Debian's chromium\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A headless browser with one page, on a runtime of its own (the test itself is synchronous).
pub struct Headless {
    rt: tokio::runtime::Runtime,
    browser: Option<Browser>,
    pub page: Page,
    _profile: tempfile::TempDir,
}

impl Headless {
    /// Chromium, headless, with a fresh profile, showing `url`.
    pub fn open(url: &str) -> Headless {
        let executable = chromium();
        let profile = tempfile::tempdir().expect("a profile dir");
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime");
        let (browser, page) = rt.block_on(async {
            let config = BrowserConfig::builder()
                .chrome_executable(&executable)
                .disable_default_args()
                .no_sandbox()
                .args([
                    "disable-gpu",
                    "disable-background-networking",
                    "disable-component-update",
                    "disable-sync",
                    "no-first-run",
                ])
                .user_data_dir(profile.path())
                .window_size(1400, 900)
                .launch_timeout(PATIENCE)
                .request_timeout(PATIENCE)
                .build()
                .expect("a browser config");
            let (browser, mut handler) = Browser::launch(config)
                .await
                .unwrap_or_else(|e| panic!("chromium does not start: {e}"));
            tokio::spawn(async move { while handler.next().await.is_some() {} });
            let page = browser.new_page(url).await.expect("a page");
            (browser, page)
        });
        Headless {
            rt,
            browser: Some(browser),
            page,
            _profile: profile,
        }
    }

    /// The value of a JavaScript expression.
    pub fn eval<T: DeserializeOwned>(&self, js: &str) -> T {
        self.rt.block_on(async {
            self.page
                .evaluate(js)
                .await
                .unwrap_or_else(|e| panic!("{js}: {e}"))
                .into_value()
                .unwrap_or_else(|e| panic!("{js}: {e}"))
        })
    }

    /// Waits until the expression is true (a guard against hanging, not a timing assertion).
    #[track_caller]
    pub fn until(&self, what: &str, js: &str) {
        let deadline = Instant::now() + PATIENCE;
        loop {
            if self.eval::<bool>(&format!("!!({js})")) {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the page never showed {what} ({js})"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Clicks the element `selector` finds.
    pub fn click(&self, selector: &str) {
        self.rt.block_on(async {
            self.page
                .find_element(selector)
                .await
                .unwrap_or_else(|e| panic!("{selector}: {e}"))
                .click()
                .await
                .unwrap_or_else(|e| panic!("click {selector}: {e}"));
        });
    }

    /// Types `text` into `selector`, then presses Enter.
    pub fn type_and_enter(&self, selector: &str, text: &str) {
        self.rt.block_on(async {
            let input = self
                .page
                .find_element(selector)
                .await
                .unwrap_or_else(|e| panic!("{selector}: {e}"));
            input.click().await.expect("focus");
            input.type_str(text).await.expect("type");
            input.press_key("Enter").await.expect("enter");
        });
    }

    /// Saves a screenshot of the whole page at `path`.
    pub fn screenshot(&self, path: &Path) {
        self.rt.block_on(async {
            self.page
                .save_screenshot(ScreenshotParams::builder().full_page(true).build(), path)
                .await
                .unwrap_or_else(|e| panic!("screenshot {}: {e}", path.display()));
        });
    }
}

impl Drop for Headless {
    fn drop(&mut self) {
        if let Some(mut browser) = self.browser.take() {
            self.rt.block_on(async {
                let _ = browser.close().await;
                let _ = browser.wait().await;
            });
        }
    }
}
