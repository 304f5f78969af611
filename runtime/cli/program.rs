//! `FILE [ARGS]...` of `colony run` and `colony mcp serve`: the program, and everything after
//! it for the program.

use std::ffi::OsString;
use std::path::PathBuf;

/// The program and its arguments. Everything after FILE is the program's, options included
/// (`colony run x.lua --help` hands `--help` to x.lua): one list whose first value starts
/// clap's trailing values. As two positionals, an option right after FILE was colony's
/// (`--state`, `--help`) while one after the first argument was the program's.
#[derive(clap::Args)]
pub struct Program {
    /// The program, and its arguments (everything after FILE is the program's: `colony run
    /// x.lua --help` hands `--help` to x.lua).
    #[arg(
        value_names = ["FILE", "ARGS"],
        required = true,
        num_args = 1..,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_parser = clap::value_parser!(OsString)
    )]
    program: Vec<OsString>,
}

impl Program {
    /// The program's file (clap makes sure there is one).
    pub fn file(&self) -> PathBuf {
        PathBuf::from(self.program.first().cloned().unwrap_or_default())
    }

    /// The program's arguments, as Lua's strings hold them.
    pub fn args(&self) -> Vec<String> {
        self.program
            .iter()
            .skip(1)
            .map(|a| a.to_string_lossy().into_owned())
            .collect()
    }
}
