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
    /// Says on stderr when an argument for the program is one of colony's own options for the
    /// command (`Args`): before, `colony run x.lua --max-time 5` was colony's limit; now it is
    /// the program's argument, and a limit someone relied on would go without a word.
    pub fn warn_of_colony_options<Args: clap::Args>(&self, command: &str) {
        let ours: Vec<String> = Args::augment_args(clap::Command::new("colony"))
            .get_arguments()
            .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
            .filter(|l| l != "--help")
            .collect();
        for arg in self.program.iter().skip(1) {
            let arg = arg.to_string_lossy();
            let name = arg.split_once('=').map_or(&*arg, |(name, _)| name);
            if ours.iter().any(|o| o == name) {
                eprintln!(
                    "colony: {name} after the program's file is the program's argument, not an \
                     option of `{command}` (colony's options go before the file)"
                );
            }
        }
    }

    /// The program's file (clap makes sure there is one).
    pub fn file(&self) -> PathBuf {
        PathBuf::from(self.program.first().cloned().unwrap_or_default())
    }

    /// The program's arguments; one that is not UTF-8 is refused, as clap refused it when the
    /// arguments were a list of strings.
    pub fn args(&self) -> Result<Vec<String>, super::Failure> {
        self.program
            .iter()
            .skip(1)
            .map(|a| {
                a.to_str().map(str::to_string).ok_or_else(|| {
                    super::Failure::input(format!(
                        "colony: the argument {} is not UTF-8 text",
                        a.to_string_lossy()
                    ))
                })
            })
            .collect()
    }
}
