//! A stdio server's processes, ended whole whichever way colony stops.
//!
//! A server runs in a process group of its own, so that Ctrl-C at colony's terminal (which
//! cancels a chat's turn) does not reach it. That also means nothing ends it but colony, and a
//! server is often more than one process (`sh -c`, `npx` and `uvx` wrappers, a browser a server
//! drives). So:
//!
//! - rmcp's shutdown (stdin closed, then SIGTERM, then SIGKILL) signals the whole group, not
//!   only the process colony started ([`process_wrap`]'s `ProcessGroup`);
//! - when a session ends, what is left of its group is sent SIGTERM, and SIGKILL after
//!   [`GRACE`] ([`ServerGroup`]'s `Drop`);
//! - [`end_all`], as colony exits, does the same for every group still running, and waits for
//!   them (at most [`GRACE`]): a `std::process::exit` or a runtime torn down never runs the
//!   tasks that would have ended them;
//! - on Linux the first process is sent SIGTERM when colony dies without any of that (a signal
//!   before the program's watch, SIGKILL, a crash): `PR_SET_PDEATHSIG`. It fires when the
//!   *thread* that started the server ends, so it is set only for a server started from a
//!   thread that lives as long as the program: the main thread, or the program's Lua thread. A
//!   worker of the core's runtime may end while the server is still in use (`block_in_place`
//!   hands its work to another thread, and it idles out): its servers rely on their stdin
//!   closing when colony dies.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use process_wrap::tokio::{CommandWrap, ProcessGroup};

/// How long a group's processes get between SIGTERM and SIGKILL.
pub const GRACE: Duration = Duration::from_secs(2);

/// How often an ending group is looked at.
const POLL: Duration = Duration::from_millis(50);

/// The groups started and not yet seen gone.
static RUNNING: Mutex<BTreeSet<i32>> = Mutex::new(BTreeSet::new());

/// `command` made to start in a group of its own, whose whole group rmcp's kill and signals
/// reach, and (Linux) ended when colony dies.
pub fn wrap(mut command: tokio::process::Command) -> CommandWrap {
    #[cfg(target_os = "linux")]
    if matches!(std::thread::current().name(), Some("main" | "colony-lua")) {
        let parent = std::process::id();
        // SAFETY: between fork and exec the closure calls only `prctl` and `getppid`, which
        // are async-signal-safe, and allocates nothing.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) == -1 {
                    return Err(std::io::Error::last_os_error());
                }
                // colony died between the fork and the prctl: nobody will send it, so the
                // server is not started (a raised SIGTERM would reach tokio's inherited handler).
                if libc::getppid() as u32 != parent {
                    return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
                }
                Ok(())
            });
        }
    }
    let mut wrapped = CommandWrap::from(command);
    wrapped.wrap(ProcessGroup::leader());
    wrapped
}

/// A started server's process group; dropping it ends what is left of the group.
#[derive(Debug)]
pub struct ServerGroup(i32);

impl ServerGroup {
    /// The group led by process `pid`, just started by [`wrap`]'s command.
    pub fn started(pid: u32) -> Option<ServerGroup> {
        let pgid = i32::try_from(pid).ok().filter(|p| *p > 0)?;
        lock().insert(pgid);
        Some(ServerGroup(pgid))
    }
}

impl Drop for ServerGroup {
    fn drop(&mut self) {
        let pgid = self.0;
        if !signal(pgid, libc::SIGTERM) {
            lock().remove(&pgid);
            return;
        }
        // Off the caller's thread, which may be an async worker: the wait is up to GRACE.
        let ended = std::thread::Builder::new()
            .name("colony-mcp-end".into())
            .spawn(move || {
                end(&[pgid], Instant::now() + GRACE, |_| {});
            });
        if ended.is_err() {
            signal(pgid, libc::SIGKILL);
            lock().remove(&pgid);
        }
    }
}

/// Ends every server group still running: SIGTERM, then SIGKILL to what is left after
/// [`GRACE`]. Returns once each is gone (or was sent SIGKILL). For colony's exit.
pub fn end_all() {
    let groups: Vec<i32> = lock().iter().copied().collect();
    if groups.is_empty() {
        return;
    }
    for pgid in &groups {
        signal(*pgid, libc::SIGTERM);
    }
    // colony is exiting: its own children in these groups are reaped here, as nothing else
    // will wait for them now and a zombie would look like a process still running.
    end(&groups, Instant::now() + GRACE, reap);
}

/// Waits until each of `groups` is gone, calling `tidy` on each while it is not, and sends
/// SIGKILL to those left at `deadline`.
fn end(groups: &[i32], deadline: Instant, tidy: impl Fn(i32)) {
    let mut left: Vec<i32> = groups.to_vec();
    loop {
        left.retain(|pgid| {
            tidy(*pgid);
            let running = running(*pgid);
            if !running {
                lock().remove(pgid);
            }
            running
        });
        if left.is_empty() {
            return;
        }
        if Instant::now() >= deadline {
            for pgid in &left {
                // A group a session's end and colony's exit both wait for is killed, and said,
                // by the first to get here (it was said twice).
                if !lock().remove(pgid) {
                    continue;
                }
                tracing::warn!(target: "colony::mcp", group = pgid,
                    "a stdio server's processes did not end within {:.0} s of SIGTERM: killed", GRACE.as_secs_f64());
                signal(*pgid, libc::SIGKILL);
                tidy(*pgid);
            }
            return;
        }
        std::thread::sleep(POLL);
    }
}

/// Whether any process of group `pgid` still runs. A zombie does not: a process whose parent
/// died (the wrapper's children) waits for init to reap it, which in a container may never
/// happen, and `kill(-pgid, 0)` counts it.
fn running(pgid: i32) -> bool {
    #[cfg(target_os = "linux")]
    if let Ok(entries) = std::fs::read_dir("/proc") {
        return entries.flatten().any(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
                && std::fs::read_to_string(e.path().join("stat"))
                    .is_ok_and(|stat| runs_in(&stat, pgid))
        });
    }
    signal(pgid, 0)
}

/// Whether a `/proc/PID/stat` line is of a live (not zombie) process in group `pgid`: after the
/// name in parentheses come the state, the parent's pid and the group.
fn runs_in(stat: &str, pgid: i32) -> bool {
    let Some((_, rest)) = stat.rsplit_once(") ") else {
        return false;
    };
    let mut fields = rest.split(' ');
    let state = fields.next().unwrap_or("Z");
    let group = fields.nth(1).and_then(|g| g.parse::<i32>().ok());
    group == Some(pgid) && state != "Z" && state != "X"
}

/// Sends `sig` to group `pgid` (0 asks only whether any of it is left); whether it reached one.
fn signal(pgid: i32, sig: i32) -> bool {
    // SAFETY: killpg takes plain integers and touches no memory of ours.
    unsafe { libc::killpg(pgid, sig) == 0 }
}

/// Collects colony's own children in group `pgid` that have exited.
fn reap(pgid: i32) {
    let mut status = 0;
    // SAFETY: waitpid writes only to `status`, which outlives the call.
    while unsafe { libc::waitpid(-pgid, &mut status, libc::WNOHANG) } > 0 {}
}

fn lock() -> std::sync::MutexGuard<'static, BTreeSet<i32>> {
    RUNNING.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::runs_in;

    #[test]
    fn a_stat_line_names_its_group_and_whether_it_is_a_zombie() {
        assert!(runs_in("838 (sh) S 835 838 831 0 -1", 838));
        assert!(runs_in("839 (a (b) c) R 1 838 831 0 -1", 838));
        assert!(!runs_in("839 (sleep) Z 1 838 831 0 -1", 838));
        assert!(!runs_in("839 (sleep) S 1 839 831 0 -1", 838));
        assert!(!runs_in("garbage", 838));
    }
}
