//! `colony run FILE.lua [ARGS...]`: run a program.
//!
//! Exit status: 0 when the program ends (its watch stopped, or it settled with every resident
//! idle), 1 when the script raised, 2 for bad input, 3 when its watch ended because residents
//! are blocked (each named on stderr with its error), 124 when `--max-time` ended it, 130, 143
//! and 129 when SIGINT, SIGTERM or SIGHUP ended it where it waited (before its watch, after it,
//! or a third one).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::{Cassettes, Failure, core_parts};
use crate::core::CoreParts;
use crate::lua::HostSetup;
use crate::residents::{ScriptEnd, Settled, WeakLifecycle};
use crate::store::opening::Opening;
use crate::store::select;
use crate::store::state_dir;
use crate::turn::TurnError;

/// Run a Lua program. Its arguments reach it as `arg` (and `...`).
///
/// The program's durable state (the `store` module, persisted conversations, breaker states,
/// the audit log) lives in a state directory: `--state DIR`, else
/// `$XDG_STATE_HOME/colony/<script name>-<hash of its path>` (`~/.local/state/colony/...`;
/// `colony state FILE.lua` prints it). One process at a time may use a state directory.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    cassettes: Cassettes,
    /// The state directory (default: $XDG_STATE_HOME/colony/<script name>-<hash>, see
    /// `colony state`; with --replay, a fresh temporary one, since a cassette replays a fresh
    /// start). Given, it is used even when the config names a `[store] url`.
    #[arg(long, value_name = "DIR")]
    state: Option<PathBuf>,
    /// Keep the program's state in this PostgreSQL database (`postgres://USER@HOST/DB`)
    /// instead of SQLite in the state directory, which is then not used (default: `[store] url`
    /// in the config, unless --state or --replay is given).
    #[arg(long, value_name = "URL")]
    store: Option<String>,
    /// End the run after this long (`90`, `90s`, `5m`, `1h30m`): the watch stops as on
    /// `ai.stop`, turns in flight get its grace period, and colony exits with status 124.
    #[arg(long, value_name = "DURATION", value_parser = parse_max_time)]
    max_time: Option<Duration>,
    #[command(flatten)]
    sandbox: super::permissions::SandboxArgs,
    #[command(flatten)]
    program: super::program::Program,
}

/// What `colony run` does before there is a runtime: the config and cassettes read, the program
/// file found, and its store opening on a thread of its own.
pub struct Prepared {
    parts: CoreParts,
    opening: Opening,
    /// The state directory of a replay without `--state`, removed at the end.
    scratch: Option<PathBuf>,
}

/// Reads what the run needs and starts opening its store. A bad config or cassette and a
/// missing program are reported before any store is touched, as before.
pub fn prepare(args: &Args) -> Result<Prepared, Failure> {
    // A closed terminal stops the run as SIGTERM does (its default action ended the process
    // where it stood); before any listener starts, which reads it.
    crate::signals::hangup_stops();
    let parts = core_parts(&args.cassettes)?;
    let file = args.program.file();
    super::program_file(&file, &["run"])?;
    args.program.args()?;
    args.program.warn_of_colony_options::<Args>("colony run");
    // A cassette holds a run from a fresh start: replaying on a state that carried on would ask
    // the model things the cassette never saw.
    let scratch =
        (args.state.is_none() && args.cassettes.replay.is_some()).then(state_dir::scratch);
    let dir = match (&args.state, &scratch) {
        (Some(dir), _) => dir.clone(),
        (None, Some(tmp)) => tmp.clone(),
        (None, None) => state_dir::default_for(&file),
    };
    // Bad input, named before anything starts (status 2, as the README's table gives; both
    // were found as the store opened, status 1).
    if let Some(url) = &args.store
        && !crate::store::postgres::is_postgres(url)
    {
        return Err(Failure::input(format!(
            "colony: --store {}",
            crate::store::postgres::not_postgres(url)
        )));
    }
    if let Some(dir) = &args.state
        && dir.is_file()
    {
        return Err(Failure::input(format!(
            "colony: --state {}: the state directory is a file, not a folder: give the \
             program's state a folder",
            dir.display()
        )));
    }
    // A state directory named outright (or the scratch one of a replay) is the store: the
    // config's `[store] url` took its place without a word, and the run read and wrote a
    // shared database instead.
    let url = if args.state.is_some() || scratch.is_some() {
        args.store.clone()
    } else {
        select::url(args.store.as_deref(), &parts.config())
    };
    // The store opens on a thread of its own while the runtime and the VM are built; the script
    // starts once it is open.
    let opening = Opening::start(dir, url, file)
        .map_err(|e| Failure::run(format!("colony: cannot start opening the store: {e}")))?;
    Ok(Prepared {
        parts,
        opening,
        scratch,
    })
}

pub fn run(args: Args, prepared: Prepared, handle: &tokio::runtime::Handle) -> Result<(), Failure> {
    let Prepared {
        parts,
        opening,
        scratch,
    } = prepared;
    // A replay's scratch state goes however `run` returns (a store that cannot be opened, a
    // script that does not load); the ways the process ends at once remove it themselves.
    let _scratch = ScratchRemoved;
    let script_args = args.program.args()?;
    let core = parts.start(handle.clone());
    let base = std::env::current_dir().unwrap_or_default();
    let interrupt = crate::lua::watchdog::Interrupt::default();
    let host = HostSetup {
        store_opening: Some(opening.store()),
        permissions: Arc::new(args.sandbox.permissions(&base)),
        max_memory: args.sandbox.max_memory(),
        interrupt: interrupt.clone(),
        signals_from_start: true,
        ..HostSetup::default()
    };
    let started = crate::lua::start_file(core, &args.program.file(), script_args, host);
    // A store that cannot be opened is what the run reports, before anything of the script.
    let state = opening
        .finish()
        .map_err(|e| Failure::run(format!("colony: {e}")))?;
    let running = started.map_err(|e| Failure::run(e.0))?;
    let lifecycle = running.lifecycle.clone();
    let last_resort = handle.spawn(last_resort(
        interrupt.clone(),
        lifecycle.script_end(),
        args.max_time,
    ));
    let stdout_gone = Arc::new(AtomicBool::new(false));
    super::stdout_gone::watch(lifecycle.downgrade(), stdout_gone.clone(), handle.clone());
    let timed_out = Arc::new(AtomicBool::new(false));
    let timer = args
        .max_time
        .map(|limit| handle.spawn(end_after(limit, lifecycle.downgrade(), timed_out.clone())));
    let result = running.join().map_err(|e| Failure::run(e.0));
    if let Some(timer) = timer {
        timer.abort();
    }
    last_resort.abort();
    let blocked = match lifecycle.settled() {
        Some(Settled::Blocked(blocked)) => blocked,
        _ => Vec::new(),
    };
    // The conversations the store keeps (and so the held mail), for the way past a mail the
    // provider refuses: read before the store closes.
    let kept = if blocked.is_empty() {
        Vec::new()
    } else {
        state.dyn_store().conversations().unwrap_or_default()
    };
    drop(state);
    if stdout_gone.load(Ordering::Acquire) {
        // Nobody reads on: a program the closing ended (an interrupted loop raises, naming
        // why) ends quietly, as every command whose stdout closes under it. An error of the
        // script's own is still said, with its status, whatever the closing did meanwhile:
        // `colony run bad.lua | true` exited 0, the error unsaid, whenever the reader went
        // first (or 130, "ended by stdout closed", when the end came as the script raised).
        return match result {
            Err(e) if !e.message.contains(super::stdout_gone::REASON) => Err(e),
            _ => Ok(()),
        };
    }
    // A signal no watch heard (before the watch, after it, or a third during it) ended the
    // program where it waited: as the signal's own action would have, 128 + its number.
    if let Some(why) = interrupt.abandoned_by() {
        if why == MAX_TIME {
            return Err(timed_out_failure(args.max_time.unwrap_or_default()));
        }
        return Err(Failure {
            message: format!("colony: the program was ended by {why}"),
            code: signal_status(&why),
        });
    }
    result?;
    if !blocked.is_empty() {
        let command = scratch.is_none().then(|| conversations_command(&args));
        return Err(blocked_failure(&blocked, command.as_deref(), &kept));
    }
    let failed = lifecycle.unhandled_failures();
    if !failed.is_empty() && !timed_out.load(Ordering::Acquire) {
        let mut message = String::new();
        for (id, why) in &failed {
            message.push_str(&format!(
                "colony: [{id}] failed and was not started again: {why}\n"
            ));
        }
        message.push_str(
            "colony: the program ran on without it, so the run failed (give ai.watch an on_fail \
             to decide what such a failure means)",
        );
        return Err(Failure::run(message));
    }
    if timed_out.load(Ordering::Acquire) {
        return Err(timed_out_failure(args.max_time.unwrap_or_default()));
    }
    Ok(())
}

/// How a run `--max-time` ended is reported.
fn timed_out_failure(limit: Duration) -> Failure {
    Failure {
        message: format!(
            "colony: the run was ended by --max-time ({})",
            humane(limit)
        ),
        code: TIMED_OUT,
    }
}

/// The exit status of a run whose watch ended because residents are blocked.
const BLOCKED: u8 = 3;
/// The exit status of a run `--max-time` ended (as timeout(1)'s).
const TIMED_OUT: u8 = 124;

/// Removes a replay's scratch state directory when dropped ([`state_dir::remove_scratch`]).
struct ScratchRemoved;

impl Drop for ScratchRemoved {
    fn drop(&mut self) {
        state_dir::remove_scratch();
    }
}

/// `colony conversations [--state DIR] FILE.lua`, as this run was given its state.
fn conversations_command(args: &Args) -> String {
    let mut command = String::from("colony conversations ");
    if let Some(dir) = &args.state {
        command.push_str(&format!("--state {} ", dir.display()));
    }
    if args.store.is_some() {
        // Not the URL itself: it may hold a password.
        command.push_str("--store URL ");
    }
    command.push_str(&args.program.file().display().to_string());
    command
}

/// Each blocked resident and its error, and what to do about it. `conversations` is how the
/// user reaches the program's store (`None`: a replay's scratch store, gone already) and `kept`
/// the conversations it keeps, for the way past a held mail the provider refuses (only a
/// resident that keeps its conversation has one).
fn blocked_failure(
    blocked: &[(String, TurnError)],
    conversations: Option<&str>,
    kept: &[String],
) -> Failure {
    let mut message = String::new();
    for (name, e) in blocked {
        message.push_str(&format!(
            "colony: blocked: {name}: {}: {}\n",
            e.kind, e.message
        ));
    }
    message.push_str(
        "colony: nothing else could run, so the program ended. A blocked resident that keeps \
         its conversation (persist_conversation) keeps its mail in the state directory for the \
         next run; the others' is dropped.",
    );
    let fix = if blocked.iter().all(|(_, e)| e.kind == "cassette_miss") {
        " The cassette holds another run: record it again with --record."
    } else if blocked
        .iter()
        .all(|(_, e)| e.kind == "budget" && e.message.contains("; it resets at "))
    {
        // No setting is wrong: the run was told to fix one, and ran again into the same wall.
        // (A budget that cannot be counted, a model without a price, is a setting to fix.)
        " A budget is spent: run again after it resets (the time named above), or raise it in \
         the script."
    } else {
        " Fix the setting named above and run again (a program that runs on reads the config \
         file again when it changes)."
    };
    message.push_str(fix);
    // A request the provider refuses may be one mail's doing (too large for the model, a file
    // it cannot read), and that mail is held and sent again at every start.
    if let Some(command) = conversations
        && let Some((name, _)) = blocked.iter().find(|(name, e)| {
            e.kind == "api_error"
                && matches!(e.status, Some(400 | 413 | 422))
                && kept.contains(name)
        })
    {
        message.push_str(&format!(
            "\ncolony: if what the provider refuses is a held mail (too large, say), `{command} \
             show {name}` numbers the held mail and `{command} drop {name} N` removes one."
        ));
    }
    Failure {
        message,
        code: BLOCKED,
    }
}

/// `--max-time`: ends the program after `limit` ([`WeakLifecycle::end`]: stopped as by
/// SIGTERM, turns in flight given the watch's grace, then ended where it waits), so that the run
/// ends as any other (`run` reports the limit) and closes its store.
async fn end_after(limit: Duration, program: WeakLifecycle, timed_out: Arc<AtomicBool>) {
    tokio::time::sleep(limit).await;
    timed_out.store(true, Ordering::Release);
    tracing::info!("--max-time: {} elapsed, stopping", humane(limit));
    if let Some(waited) = program.end("max-time", MAX_TIME).await
        && !waited.is_zero()
    {
        // Said without `eprintln!`, whose panic on a closed stderr is the quiet exit 0.
        super::say_failure(&format!(
            "colony: --max-time: the program did not end within {} of being stopped",
            humane(waited)
        ));
    }
}

/// How long a program ended where it waits ([`crate::residents::Route::abandon`]) may take
/// to end before the process is ended under it.
const ABANDON_PATIENCE: Duration = Duration::from_secs(1);

/// The last resort of every way a run is ended where it waits (SIGINT or SIGTERM, `--max-time`,
/// stdout's reader gone): a script that still runs [`ABANDON_PATIENCE`] later is blocked
/// outside Lua (an `io.read`, a C call) where nothing can reach it, and the process is ended
/// with the status its run would have ended with. Its store is then left as after a crash
/// (recovered at the next open); every program that waits in colony's own calls, or runs Lua
/// code, ends before this and closes it.
async fn last_resort(
    interrupt: crate::lua::watchdog::Interrupt,
    mut script: ScriptEnd,
    limit: Option<Duration>,
) {
    let why = interrupt.abandoned().await;
    if tokio::time::timeout(ABANDON_PATIENCE, script.ended())
        .await
        .is_ok()
    {
        return;
    }
    tracing::warn!(
        "the program did not end within {} of being ended where it waits ({why}): ending the \
         process",
        humane(ABANDON_PATIENCE)
    );
    super::terminal::restore();
    let code = match why.as_str() {
        super::stdout_gone::REASON => 0,
        MAX_TIME => {
            super::say_failure(&timed_out_failure(limit.unwrap_or_default()).message);
            i32::from(TIMED_OUT)
        }
        signal => {
            super::say_failure(&format!("colony: the program was ended by {signal}"));
            signal_status(signal).into()
        }
    };
    crate::lua::proc::end_children();
    state_dir::remove_scratch();
    std::process::exit(code);
}

/// The exit status of a run a signal ended (128 + its number, as its default action's).
pub(super) fn signal_status(signal: &str) -> u8 {
    match signal {
        "SIGHUP" => 129,
        "SIGTERM" => 143,
        _ => 130,
    }
}

/// Why a run `--max-time` ended where it waited ([`end_after`]).
const MAX_TIME: &str = "--max-time";

fn humane(d: Duration) -> String {
    // `--max-time 1ms` read "(0.0 s)".
    if d < Duration::from_millis(100) {
        format!("{} ms", d.as_millis())
    } else {
        format!("{:.1} s", d.as_secs_f64())
    }
}

/// `90` (seconds), or a number with units: `90s`, `500ms`, `5m`, `1h30m`.
fn parse_max_time(text: &str) -> Result<Duration, String> {
    match crate::duration::parse(text) {
        Ok(d) if d.is_zero() => Err("--max-time must be more than 0".to_string()),
        Ok(d) => Ok(d),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_limit_is_said_in_milliseconds() {
        assert_eq!(humane(Duration::from_millis(1)), "1 ms");
        assert_eq!(humane(Duration::from_millis(1500)), "1.5 s");
    }
}
