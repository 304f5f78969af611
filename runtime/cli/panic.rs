//! What the `colony` binary does when it panics, where it differs from std's own report:
//! - a write to a closed stdout (or stderr) ends the command quietly ([`CLOSED_STDOUT_STATUS`]);
//! - with `RUST_BACKTRACE=1`, colony prints the short backtrace itself. std finds where a short
//!   backtrace starts and ends by the names of two functions (`__rust_end_short_backtrace`,
//!   `__rust_begin_short_backtrace`). The installed binary keeps no local symbols (build.rs), so
//!   only the split debug info (the `.dwo` file under `target/`) names them; without that file
//!   std would print no frame at all. colony's report prints every frame with its file:line,
//!   named where the debug info names it, and trims at those two frames where it finds them.
//!
//! `RUST_BACKTRACE` unset, `0` or `full` gets std's report unchanged.

use std::io::Write;

/// Set in the environment, colony panics as it starts: the way to check that a binary's panic
/// backtrace names file:line (`RUST_BACKTRACE=1`), an installed one included (README, "When
/// things go wrong").
pub const PANIC_ON_PURPOSE: &str = "COLONY_PANIC_ON_PURPOSE";

/// What a command exits with when its stdout is closed under it (`colony config list | head
/// -0`): 0, quietly, as the reader wanted no more. Rust ignores SIGPIPE, so a write to a closed
/// pipe is an `EPIPE` error, and `println!` panics on it; the hook turns that panic, wherever it
/// happens, into the quiet exit. SIGPIPE itself stays ignored: restoring its default would also
/// kill colony when an MCP server's stdin closes under a write.
pub const CLOSED_STDOUT_STATUS: i32 = 0;

/// What a command exits with when a write to its stdout fails for another reason than a closed
/// reader (a full disk): the output is incomplete, so the command failed.
pub const WRITE_FAILED_STATUS: i32 = 1;

/// Replaces std's panic hook with colony's (std's stays in charge of what colony does not
/// change).
pub(super) fn install() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        // `PanicHookInfo::payload_as_str` would do this from Rust 1.91; colony builds on 1.89.
        let message = info
            .payload()
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| info.payload().downcast_ref::<&str>().copied());
        let text = message.unwrap_or("");
        // EPIPE is 32 on Linux and the BSDs; std prints the number whatever the locale.
        // stderr closed too (`2>&1 | head -1`): the reader wanted no more of either.
        let printing = text.starts_with("failed printing to stdout")
            || text.starts_with("failed printing to stderr");
        if printing && text.ends_with("(os error 32)") {
            crate::store::state_dir::remove_scratch();
            std::process::exit(CLOSED_STDOUT_STATUS);
        }
        // Any other failed write (a full disk under `> answer.txt`, an I/O error): said in one
        // line, status 1. What was asked for was not all written, and a backtrace says nothing
        // a user can act on.
        if printing {
            let (what, why) = text
                .strip_prefix("failed printing to ")
                .and_then(|rest| rest.split_once(": "))
                .unwrap_or(("stdout", text));
            let _ = writeln!(std::io::stderr(), "colony: cannot write to {what}: {why}");
            crate::store::state_dir::remove_scratch();
            std::process::exit(WRITE_FAILED_STATUS);
        }
        if !wants_short_backtrace(std::env::var_os("RUST_BACKTRACE").as_deref()) {
            return default(info);
        }
        let thread = std::thread::current();
        let location = info.location().map(|l| l.to_string()).unwrap_or_default();
        let trace = std::backtrace::Backtrace::force_capture().to_string();
        let report = format!(
            "\nthread '{}'{} panicked at {location}:\n{}\nstack backtrace:\n{}\
             note: Some details are omitted, run with `RUST_BACKTRACE=full` for a verbose \
             backtrace.\n",
            thread.name().unwrap_or("<unnamed>"),
            os_thread_id()
                .map(|id| format!(" ({id})"))
                .unwrap_or_default(),
            message.unwrap_or("Box<dyn Any>"),
            short(&trace),
        );
        // Nothing to do if stderr is gone too.
        let _ = std::io::stderr().lock().write_all(report.as_bytes());
    }));
}

/// The calling thread's id as the OS knows it, which std's report prints after the thread's name
/// (`thread 'main' (4711) panicked at`) and offers no stable way to read.
fn os_thread_id() -> Option<i64> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: gettid takes no argument, cannot fail and only reads the calling thread's id.
        Some(i64::from(unsafe { libc::gettid() }))
    }
    #[cfg(not(target_os = "linux"))]
    {
        None
    }
}

/// Whether `RUST_BACKTRACE` asks for the short backtrace, as std reads it: unset or `0` asks for
/// none, `full` for every frame, anything else for the short one.
fn wants_short_backtrace(value: Option<&std::ffi::OsStr>) -> bool {
    value.is_some_and(|v| v != "0" && v != "full")
}

/// A captured backtrace as std prints it (`Backtrace`'s `Display`: a numbered line per frame, an
/// indented one per frame inlined into it, each followed by its `at file:line:col`), cut to
/// what std's short report shows: after the last `__rust_end_short_backtrace` frame and before
/// the first `__rust_begin_short_backtrace` after it, each where it is found, and numbered again
/// from 0.
fn short(trace: &str) -> String {
    // An entry: a frame's line (numbered, or indented for an inlined call) and the lines after it.
    let mut entries: Vec<Vec<&str>> = Vec::new();
    for line in trace.lines() {
        match entries.last_mut() {
            Some(entry) if line.trim_start().starts_with("at ") => entry.push(line),
            _ => entries.push(vec![line]),
        }
    }
    let named = |entry: &Vec<&str>, marker: &str| entry[0].contains(marker);
    let start = entries
        .iter()
        .rposition(|e| named(e, "__rust_end_short_backtrace"))
        .map_or(0, |i| i + 1);
    let end = entries[start..]
        .iter()
        .position(|e| named(e, "__rust_begin_short_backtrace"))
        .map_or(entries.len(), |i| start + i);
    let mut out = String::new();
    let mut number = 0;
    for entry in &entries[start..end] {
        let head = entry[0];
        match numbered(head) {
            Some(rest) => {
                out.push_str(&format!("{number:4}: {rest}\n"));
                number += 1;
            }
            None => {
                out.push_str(head);
                out.push('\n');
            }
        }
        for line in &entry[1..] {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// What follows `N: ` on a frame's numbered line, or `None` for any other line.
fn numbered(line: &str) -> Option<&str> {
    let (index, rest) = line.trim_start().split_once(": ")?;
    (!index.is_empty() && index.bytes().all(|b| b.is_ascii_digit())).then_some(rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TRACE: &str = "   0: <unknown>
             at ./runtime/cli/panic.rs:50:21
   1: std::panicking::panic_with_hook
             at /rustc/x/library/std/src/panicking.rs:833:13
   2: std::sys::backtrace::__rust_end_short_backtrace
             at /rustc/x/library/std/src/sys/backtrace.rs:182:18
   3: core::panicking::panic_fmt
             at /rustc/x/library/core/src/panicking.rs:80:14
   4: colony::cli::main
             at ./runtime/cli/mod.rs:108:9
      call_once<fn() -> std::process::ExitCode, ()>
             at /rustc/x/library/core/src/ops/function.rs:250:5
   5: std::sys::backtrace::__rust_begin_short_backtrace
             at /rustc/x/library/std/src/sys/backtrace.rs:166:18
   6: main
";

    #[test]
    fn a_short_backtrace_is_cut_at_std_s_markers_and_numbered_again() {
        assert_eq!(
            short(TRACE),
            "   0: core::panicking::panic_fmt
             at /rustc/x/library/core/src/panicking.rs:80:14
   1: colony::cli::main
             at ./runtime/cli/mod.rs:108:9
      call_once<fn() -> std::process::ExitCode, ()>
             at /rustc/x/library/core/src/ops/function.rs:250:5
"
        );
    }

    #[test]
    fn without_names_every_frame_is_kept_with_its_file_and_line() {
        let unnamed = "   0: <unknown>
             at ./runtime/cli/panic.rs:50:21
   1: <unknown>
             at ./runtime/cli/mod.rs:108:9
   2: <unknown>
";
        assert_eq!(short(unnamed), unnamed);
    }

    #[test]
    fn rust_backtrace_is_read_as_std_reads_it() {
        use std::ffi::OsStr;
        assert!(!wants_short_backtrace(None));
        assert!(!wants_short_backtrace(Some(OsStr::new("0"))));
        assert!(!wants_short_backtrace(Some(OsStr::new("full"))));
        assert!(wants_short_backtrace(Some(OsStr::new("1"))));
        assert!(wants_short_backtrace(Some(OsStr::new("short"))));
    }
}
