//! `colony run FILE.lua [ARGS...]`: run a program.

use std::path::PathBuf;

use super::{Cassettes, Failure, build_core};
use crate::lua::HostSetup;
use crate::store::state_dir::{self, StateDir};

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
    /// `colony state`; with --replay, a fresh temporary one, since a cassette replays a fresh start).
    #[arg(long, value_name = "DIR")]
    state: Option<PathBuf>,
    /// The program to run.
    file: PathBuf,
    /// Arguments for the program.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

pub fn run(args: Args, handle: &tokio::runtime::Handle) -> Result<(), Failure> {
    let core = build_core(&args.cassettes, handle)?;
    if !args.file.exists() {
        return Err(Failure::input(format!(
            "colony: cannot read {}: no such file",
            args.file.display()
        )));
    }
    // A cassette holds a run from a fresh start: replaying on a state that carried on would ask
    // the model things the cassette never saw.
    let scratch = (args.state.is_none() && args.cassettes.replay.is_some())
        .then(|| std::env::temp_dir().join(format!("colony-replay-{}", std::process::id())));
    let dir = match (&args.state, &scratch) {
        (Some(dir), _) => dir.clone(),
        (None, Some(tmp)) => tmp.clone(),
        (None, None) => state_dir::default_for(&args.file),
    };
    let state = StateDir::open(&dir).map_err(|e| Failure::run(format!("colony: {e}")))?;
    let host = HostSetup {
        store: Some(state.dyn_store()),
        ..HostSetup::default()
    };
    let running =
        crate::lua::start_file(core, &args.file, args.args, host).map_err(|e| Failure::run(e.0))?;
    let result = running.join().map_err(|e| Failure::run(e.0));
    drop(state);
    if let Some(tmp) = scratch {
        let _ = std::fs::remove_dir_all(tmp);
    }
    result
}
