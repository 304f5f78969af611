//! One program served over stdin and stdout (what a `claude_desktop_config.json` or `.mcp.json`
//! entry runs): stdout carries only protocol messages, logs go to stderr. It ends when stdin
//! closes, on SIGINT or SIGTERM, or when the program stops.

use std::sync::Arc;

use rmcp::ServiceExt;
use tokio::signal::unix::{SignalKind, signal};

use super::call::Caller;
use super::handler::{Offer, One, Server};

/// Why serving ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ended {
    /// The client closed stdin (or the transport failed).
    Closed,
    /// SIGINT or SIGTERM.
    Signal(&'static str),
    /// The program stopped: its reason.
    Stopped(String),
}

/// Serves `offer` on this process's stdin and stdout until one of [`Ended`] happens.
pub async fn serve(offer: Offer, name: &str) -> Result<Ended, String> {
    let route = offer.route.clone();
    // What the client lists first is what the program exports once it has started.
    offer.ready().await;
    let server = Server::new(Arc::new(One(offer)), Caller("stdio".into()), name);
    let mut int = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    let mut term = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let serving = async {
        match server.serve(rmcp::transport::io::stdio_pipes()).await {
            Ok(running) => {
                let token = running.cancellation_token();
                let ended = tokio::select! {
                    _ = running.waiting() => Ended::Closed,
                    _ = int.recv() => Ended::Signal("SIGINT"),
                    _ = term.recv() => Ended::Signal("SIGTERM"),
                    reason = route.stopped() => Ended::Stopped(reason),
                };
                token.cancel();
                Ok(ended)
            }
            // The client went away before (or while) it said hello.
            Err(e) => {
                tracing::info!("the MCP session did not start: {e}");
                Ok(Ended::Closed)
            }
        }
    };
    serving.await
}
