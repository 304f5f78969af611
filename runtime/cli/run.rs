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
    /// The state directory (default: $XDG_STATE_HOME/colony/<script name>-<hash>; see `colony state`).
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
    let dir = args
        .state
        .clone()
        .unwrap_or_else(|| state_dir::default_for(&args.file));
    let state = StateDir::open(&dir).map_err(|e| Failure::run(format!("colony: {e}")))?;
    let host = HostSetup {
        store: Some(state.dyn_store()),
        ..HostSetup::default()
    };
    let running =
        crate::lua::start_file(core, &args.file, args.args, host).map_err(|e| Failure::run(e.0))?;
    let result = running.join().map_err(|e| Failure::run(e.0));
    drop(state);
    result
}
