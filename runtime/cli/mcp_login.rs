//! `colony mcp login NAME`: signs in to a configured remote server behind OAuth, once; the
//! tokens are kept in the state directory and every program that names the server uses them.
//! `colony mcp logout NAME` removes them.
//!
//! The authorization page opens in the browser (or its URL is printed, for a machine without
//! one); the authorization server sends the browser back to a listener on 127.0.0.1 at a port
//! chosen now, which takes the code and answers a page saying the sign-in is done.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use super::Failure;
use crate::config::Config;
use crate::mcp::oauth::{self, Auth, Authorizer, AuthorizerHook};
use crate::mcp::{Connection, Transport};

/// How long the browser has to come back.
const WAIT: Duration = Duration::from_secs(300);

/// The loopback redirect listener, and whether to open the browser.
struct Loopback {
    listener: Arc<tokio::sync::Mutex<TcpListener>>,
    port: u16,
    browser: bool,
}

impl Authorizer for Loopback {
    fn redirect_uri(&self) -> String {
        format!("http://127.0.0.1:{}/callback", self.port)
    }

    fn authorize(&self, url: String) -> BoxFuture<'static, Result<String, String>> {
        let listener = self.listener.clone();
        let (port, browser) = (self.port, self.browser);
        Box::pin(async move {
            eprintln!("Open this page to sign in:\n\n  {url}\n");
            if browser {
                open_browser(&url);
            }
            eprintln!("Waiting for the browser to come back to 127.0.0.1:{port} ...");
            let listener = listener.lock().await;
            tokio::time::timeout(WAIT, callback(&listener, port))
                .await
                .map_err(|_| format!("no answer from the browser within {} s", WAIT.as_secs()))?
        })
    }
}

/// Waits for the browser's `GET /callback?...` and answers it; other requests (a favicon) get a
/// 404 and the wait goes on.
async fn callback(listener: &TcpListener, port: u16) -> Result<String, String> {
    loop {
        let (mut sock, _) = listener.accept().await.map_err(|e| e.to_string())?;
        let mut buf = vec![0u8; 8192];
        let mut n = 0;
        while n < buf.len() {
            match sock.read(&mut buf[n..]).await {
                Ok(0) | Err(_) => break,
                Ok(k) => n += k,
            }
            if buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
        let head = String::from_utf8_lossy(&buf[..n]);
        let target = head
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("GET "))
            .and_then(|l| l.split_whitespace().next())
            .unwrap_or("");
        if !target.starts_with("/callback") {
            let _ = sock
                .write_all(
                    b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\nconnection: close\r\n\r\n",
                )
                .await;
            continue;
        }
        let page = "<!doctype html><title>colony</title><p>Signed in. You can close this tab.</p>";
        let answer = format!(
            "HTTP/1.1 200 OK\r\ncontent-type: text/html; charset=utf-8\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{page}",
            page.len()
        );
        let _ = sock.write_all(answer.as_bytes()).await;
        return Ok(format!("http://127.0.0.1:{port}{target}"));
    }
}

/// Opens `url` in the desktop's browser, if there is one; the URL is printed either way.
fn open_browser(url: &str) {
    let opener = if cfg!(target_os = "macos") {
        "open"
    } else {
        "xdg-open"
    };
    let _ = std::process::Command::new(opener)
        .arg(url)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
}

pub async fn run(name: String, no_browser: bool) -> Result<(), Failure> {
    let who = "colony mcp login";
    let cfg = Config::load().map_err(|e| Failure::input(format!("{who}: {e}")))?;
    let config = cfg.mcp.get(&name).ok_or_else(|| {
        Failure::input(format!(
            "{who}: no server named {name:?} (colony mcp add {name} URL)"
        ))
    })?;
    let mut spec = config
        .clone()
        .into_spec(&name)
        .map_err(|e| Failure::input(format!("{who}: {e}")))?;
    let Transport::Http { url, .. } = &spec.transport else {
        return Err(Failure::input(format!(
            "{who}: {name} is a local command; only remote (URL) servers sign in"
        )));
    };
    // A fresh sign-in: the old tokens go first.
    let old = oauth::token_path(&name, url);
    if old.exists() {
        std::fs::remove_file(&old)
            .map_err(|e| Failure::run(format!("{who}: {}: {e}", old.display())))?;
    }
    let listener = TcpListener::bind(("127.0.0.1", 0))
        .await
        .map_err(|e| Failure::run(format!("{who}: cannot listen on 127.0.0.1: {e}")))?;
    let port = listener.local_addr().map(|a| a.port()).unwrap_or_default();
    let loopback = Loopback {
        listener: Arc::new(tokio::sync::Mutex::new(listener)),
        port,
        browser: !no_browser,
    };
    let auth = spec.auth.get_or_insert_with(Auth::default);
    auth.authorizer = Some(AuthorizerHook(Arc::new(loopback)));
    let conn = Connection::open(spec)
        .await
        .map_err(|e| Failure::run(format!("{who}: {e}")))?;
    let tools = conn.list_tools().await;
    conn.close().await;
    let tools = tools.map_err(|e| Failure::run(format!("{who}: {e}")))?;
    let stored = oauth::token_path(&name, config.url.as_deref().unwrap_or_default());
    if stored.exists() {
        println!("{name}: signed in, {} tools", tools.len());
    } else {
        println!(
            "{name}: the server did not ask for a sign-in ({} tools)",
            tools.len()
        );
    }
    Ok(())
}

/// `colony mcp logout NAME`: the server's kept tokens removed (the next connection signs in
/// again, or is told to).
pub fn logout(name: String) -> Result<(), Failure> {
    let who = "colony mcp logout";
    let cfg = Config::load().map_err(|e| Failure::input(format!("{who}: {e}")))?;
    let config = cfg
        .mcp
        .get(&name)
        .ok_or_else(|| Failure::input(format!("{who}: no server named {name:?}")))?;
    let Some(url) = &config.url else {
        return Err(Failure::input(format!(
            "{who}: {name} is a local command; only remote (URL) servers sign in"
        )));
    };
    let kept = oauth::token_path(&name, url);
    match std::fs::remove_file(&kept) {
        Ok(()) => println!("{name}: signed out (its tokens are removed)"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            println!("{name}: no tokens were kept")
        }
        Err(e) => {
            return Err(Failure::run(format!("{who}: {}: {e}", kept.display())));
        }
    }
    Ok(())
}
