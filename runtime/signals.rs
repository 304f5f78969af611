//! The signals that stop a program, as colony listens for them.
//!
//! A process that starts with SIGINT ignored is a background job of a non-interactive shell
//! (`colony run watcher.lua &` in a script): the shell ignored it so that the terminal's Ctrl-C
//! ends only the command in front, not the jobs behind it. A handler, once installed, ends
//! that for good, so colony listens for SIGINT only when it was not ignored as colony first
//! looked, as the shells and Python do; such a job is stopped with SIGTERM. Every listener for
//! SIGINT goes through [`sigint`], so the first look comes before any handler is installed.
//!
//! SIGHUP (the terminal closed: an ssh session dropped, a window shut) stops a program as
//! SIGTERM does where the host says so ([`hangup_stops`], `colony run`): its default action
//! ended the process where it stood, turns cut off and the store left as after a crash.
//! `colony serve` keeps it for reloading. Started with it ignored (`nohup`), it stays ignored.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

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
    *IGNORED.get_or_init(|| ignored(libc::SIGINT))
}

/// Whether `signal`'s disposition is "ignore" now.
fn ignored(signal: libc::c_int) -> bool {
    // Safety: a null new action only reads the current one into `old`.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(signal, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_IGN
    }
}

/// Whether SIGHUP stops programs in this process: set once, by [`hangup_stops`].
static HANGUP_STOPS: AtomicBool = AtomicBool::new(false);

/// From now on, SIGHUP stops a program as SIGTERM does, unless it was ignored when this was
/// called (`nohup`). Called by `colony run` before any listener starts.
pub fn hangup_stops() {
    if !ignored(libc::SIGHUP) {
        HANGUP_STOPS.store(true, Ordering::Release);
    }
}

/// The names of the signals that stop a program, as [`Stops::recv`] gives them.
pub fn is_stop_signal(name: &str) -> bool {
    matches!(name, "SIGINT" | "SIGTERM" | "SIGHUP")
}

/// The signals that stop a program, heard by one listener: SIGINT (see [`sigint`]), SIGTERM,
/// and SIGHUP where [`hangup_stops`] made it one.
pub struct Stops {
    int: Sigint,
    term: Signal,
    hup: Option<Signal>,
}

impl Stops {
    /// Waits for the next of them: its name.
    pub async fn recv(&mut self) -> &'static str {
        let Stops { int, term, hup } = self;
        let hup = async {
            if let Some(hup) = hup
                && hup.recv().await.is_some()
            {
                return;
            }
            std::future::pending().await
        };
        tokio::select! {
            () = int.recv() => "SIGINT",
            Some(()) = term.recv() => "SIGTERM",
            () = hup => "SIGHUP",
        }
    }
}

/// Listens for the signals that stop a program from now on (in tokio's runtime).
pub fn stops() -> std::io::Result<Stops> {
    let hup = if HANGUP_STOPS.load(Ordering::Acquire) {
        Some(signal(SignalKind::hangup())?)
    } else {
        None
    };
    Ok(Stops {
        int: sigint()?,
        term: signal(SignalKind::terminate())?,
        hup,
    })
}

/// Waits for SIGTERM or SIGHUP and answers which (`None` when they cannot be listened for): for
/// a command that ends on either where it waits, but keeps SIGINT for itself (`colony chat`,
/// whose Ctrl-C cancels a reply; the config walk, whose line editor reads it as a key).
pub async fn term_or_hangup() -> Option<&'static str> {
    let (Ok(mut term), Ok(mut hup)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
    ) else {
        return None;
    };
    Some(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = hup.recv() => "SIGHUP",
    })
}

/// The status the process ends with, once a command ending on a signal said so ([`end_with`]).
static ENDING_WITH: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// The process is ending on a signal, with `status` (130, 143): from now on no model call is
/// sent ([`crate::providers::Providers::call`]), and a script's `os.exit` ends it with this
/// status. `colony ask` ends its MCP servers before it exits; the call a turn waited on failed at
/// once, and the turn sent its next (paid) model call, printed its answer, and the script's
/// `os.exit(1)` beat the signal's status.
pub fn end_with(status: i32) {
    ENDING_WITH.store(status, std::sync::atomic::Ordering::Release);
}

/// The status [`end_with`] set, if the process is ending so.
pub fn ending_with() -> Option<i32> {
    match ENDING_WITH.load(std::sync::atomic::Ordering::Acquire) {
        0 => None,
        status => Some(status),
    }
}
