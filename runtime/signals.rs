//! SIGINT as colony listens for it.
//!
//! A process that starts with SIGINT ignored is a background job of a non-interactive shell
//! (`colony run watcher.lua &` in a script): the shell ignored it so that the terminal's Ctrl-C
//! ends only the command in front, not the jobs behind it. A handler, once installed, ends
//! that for good, so colony listens for SIGINT only when it was not ignored as colony first
//! looked, as the shells and Python do; such a job is stopped with SIGTERM. Every listener for
//! SIGINT goes through [`sigint`], so the first look comes before any handler is installed.

use std::sync::OnceLock;

use tokio::signal::unix::{Signal, SignalKind, signal};

/// SIGINT as delivered to one listener; never, when the process started with it ignored.
pub struct Sigint(Option<Signal>);

impl Sigint {
    /// Waits for the next SIGINT (for ever, when it is ignored).
    pub async fn recv(&mut self) {
        match &mut self.0 {
            Some(signal) => {
                if signal.recv().await.is_none() {
                    std::future::pending::<()>().await;
                }
            }
            None => std::future::pending().await,
        }
    }
}

/// Listens for SIGINT from now on (in tokio's runtime, as `tokio::signal::unix::signal`).
pub fn sigint() -> std::io::Result<Sigint> {
    if ignored_at_start() {
        return Ok(Sigint(None));
    }
    signal(SignalKind::interrupt()).map(|s| Sigint(Some(s)))
}

/// Whether SIGINT was ignored when colony first looked, before any handler of its own.
pub fn ignored_at_start() -> bool {
    static IGNORED: OnceLock<bool> = OnceLock::new();
    *IGNORED.get_or_init(|| {
        // Safety: a null new action only reads the current one into `old`.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            libc::sigaction(libc::SIGINT, std::ptr::null(), &mut old) == 0
                && old.sa_sigaction == libc::SIG_IGN
        }
    })
}
