//! `colony run prog.lua | head -1`: when the reader of a piped stdout goes away, the run ends,
//! quietly and with status 0, as `yes | head -1` does. Colony ignores SIGPIPE (a write to the
//! closed pipe is an error `print` drops), so a watcher whose output nobody reads would
//! otherwise call its models forever.
//!
//! Only a pipe is watched: a terminal, a file and a socket (systemd's journal) never end a run.
//! The write end of a pipe reports `POLLERR` once its read end is closed, without writing, so a
//! thread waits for that in `poll(2)` and then stops the program as SIGTERM would: the watch
//! ends, turns in flight get its grace, and Lua code that is running is interrupted.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::residents::WeakLifecycle;

/// The reason the program is stopped with, as the watch reports it (and the reason it is ended
/// where it waits, if it must be).
pub(super) const REASON: &str = "stdout closed";

/// Whether stdout is a pipe (the only kind of stdout whose closing ends a run).
fn is_pipe() -> bool {
    // Safety: fstat writes only into the zeroed struct it is given.
    unsafe {
        let mut st: libc::stat = std::mem::zeroed();
        libc::fstat(libc::STDOUT_FILENO, &mut st) == 0
            && (st.st_mode & libc::S_IFMT) == libc::S_IFIFO
    }
}

/// Watches a piped stdout from a thread of its own; once its reader is gone, sets `gone` and
/// ends the program on `runtime` as a host that will not wait for ever does
/// ([`WeakLifecycle::end`]: stopped as by SIGTERM, turns in flight given the grace, then ended
/// where it waits; `colony run`'s last resort ends the process if even that does not end it).
/// Does nothing when stdout is not a pipe.
///
/// The thread waits for as long as the process lives, so it holds the program weakly: held
/// strongly, the program's store was never closed when stdout was a pipe (`colony run p.lua |
/// tee log`), and the run left its log beside it, with what was written without a sync
/// (audit lines) never synced.
pub fn watch(program: WeakLifecycle, gone: Arc<AtomicBool>, runtime: tokio::runtime::Handle) {
    if !is_pipe() {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("colony-stdout".into())
        .spawn(move || {
            if !wait_for_reader_gone() {
                return;
            }
            gone.store(true, Ordering::Release);
            tracing::info!("stdout's reader is gone: stopping");
            runtime.spawn(async move { program.end(REASON, REASON).await });
        });
    if let Err(e) = spawned {
        tracing::warn!("cannot watch stdout: {e}");
    }
}

/// Blocks until the pipe on stdout has no reader (`true`), or polling fails (`false`).
fn wait_for_reader_gone() -> bool {
    let mut fd = libc::pollfd {
        fd: libc::STDOUT_FILENO,
        // No event asked for: POLLERR and POLLHUP are reported whatever is asked.
        events: 0,
        revents: 0,
    };
    loop {
        // Safety: one valid pollfd, for the length given.
        let n = unsafe { libc::poll(&mut fd, 1, -1) };
        if n > 0 {
            return fd.revents & (libc::POLLERR | libc::POLLHUP) != 0;
        }
        if n < 0 && std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return false;
        }
    }
}
