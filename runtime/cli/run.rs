//! `colony run FILE.lua [ARGS...]`: run a program.

use std::path::PathBuf;

use super::{Cassettes, Failure, build_core};

/// Run a Lua program. Its arguments reach it as `arg` (and `...`).
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    cassettes: Cassettes,
    /// The program to run.
    file: PathBuf,
    /// Arguments for the program.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    args: Vec<String>,
}

pub fn run(args: Args, handle: &tokio::runtime::Handle) -> Result<(), Failure> {
    let core = build_core(&args.cassettes, handle)?;
    crate::lua::run_file(core, &args.file, args.args).map_err(|e| Failure::run(e.0))
}
