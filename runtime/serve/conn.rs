//! The service's connections, served as `axum::serve` serves them, with what it leaves out: a
//! deadline for each request's head. `axum::serve` gives hyper no timer, so its
//! `header_read_timeout` never applied: a client that sent half its headers, or held a
//! keep-alive connection idle, kept its socket for ever (three hundred such held three hundred
//! file descriptors). With the timer, a head that has not come whole [`HEAD_PATIENCE`] after
//! the connection began waiting for it ends the connection; a request's body has its own
//! deadline ([`super::BODY_PATIENCE`], in the router).

use std::future::Future;
use std::pin::pin;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto::Builder;
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;

/// How long a request's head (or the next one on an idle keep-alive connection) may take.
pub const HEAD_PATIENCE: Duration = Duration::from_secs(30);

/// Serves `app` on `listener` until `shutdown` resolves; then stops accepting, asks each
/// connection to finish the request it is in, and returns once every one has ended.
pub async fn serve(listener: TcpListener, app: Router, shutdown: impl Future<Output = ()>) {
    let (closing_tx, closing) = tokio::sync::watch::channel(false);
    // Each connection holds a sender: the receiver ends once every one has.
    let (open_tx, mut open) = tokio::sync::mpsc::channel::<()>(1);
    let mut shutdown = pin!(shutdown);
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                // Out of file descriptors and the like: wait, as axum::serve does, rather
                // than spin.
                Err(e) => {
                    tracing::debug!("cannot accept a connection: {e}");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        // Small answers go out at once: without TCP_NODELAY an MCP client's next request
        // waits out the peer's delayed ACK (40 ms a call on Linux).
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::debug!("cannot set TCP_NODELAY: {e}");
        }
        let service = TowerToHyperService::new(app.clone());
        let mut closing = closing.clone();
        let open = open_tx.clone();
        tokio::spawn(async move {
            let mut builder = Builder::new(TokioExecutor::new());
            builder
                .http1()
                .timer(TokioTimer::new())
                .header_read_timeout(HEAD_PATIENCE);
            let mut conn = pin!(builder.serve_connection_with_upgrades(TokioIo::new(tcp), service));
            let mut asked = false;
            loop {
                tokio::select! {
                    served = conn.as_mut() => {
                        if let Err(e) = served {
                            tracing::trace!("a connection ended: {e}");
                        }
                        break;
                    }
                    _ = closing.wait_for(|c| *c), if !asked => {
                        asked = true;
                        conn.as_mut().graceful_shutdown();
                    }
                }
            }
            drop(open);
        });
    }
    drop(listener);
    let _ = closing_tx.send(true);
    drop(open_tx);
    let _ = open.recv().await;
}
