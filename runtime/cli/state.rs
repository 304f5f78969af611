//! `colony state FILE.lua`: where a program's state lives. Also the opening of that state for
//! the commands that read it (`conversations`, `store`, `audit`).

use std::path::{Path, PathBuf};

use super::Failure;
use crate::store::select::{self, ProgramStore};
use crate::store::state_dir::{self, STORE_FILE, StateDir};

/// Print the state directory a script's program uses by default.
#[derive(clap::Args)]
#[command(
    long_about = "Print the state directory a script's program uses by default: \
        $XDG_STATE_HOME/colony/<script name>-<hash of the script's absolute path> \
        (~/.local/state/colony/... when XDG_STATE_HOME is not set). It holds the program's \
        store (store.sqlite3) and its lock. Prints the path whether or not the program has \
        stored anything yet."
)]
pub struct Args {
    /// The program's script.
    #[arg(value_name = "FILE.lua")]
    script: PathBuf,
}

pub fn run(args: Args) -> Result<(), Failure> {
    existing_script("state", &args.script)?;
    println!("{}", state_dir::default_for(&args.script).display());
    Ok(())
}

fn existing_script(command: &str, script: &Path) -> Result<(), Failure> {
    let Some(why) = super::not_a_file(script) else {
        return Ok(());
    };
    Err(Failure::input(format!(
        "colony {command}: {}: {why} (the state directory is named after the script's \
         path; pass --state DIR for a directory of your choosing)",
        script.display()
    )))
}

/// The program whose state a command reads: its script, or a state directory given outright.
#[derive(clap::Args)]
pub struct Target {
    /// The program's script: its default state directory is read (see `colony state`).
    #[arg(value_name = "FILE.lua")]
    script: PathBuf,
    /// Read this state directory instead of the script's default one (even when the config
    /// names a `[store] url`).
    #[arg(long, value_name = "DIR", global = true)]
    state: Option<PathBuf>,
    /// Read the program's state from this PostgreSQL database (`postgres://USER@HOST/DB`)
    /// instead of its state directory, which is then not read (default: `[store] url` in the
    /// config, unless --state is given).
    #[arg(long, value_name = "URL", global = true)]
    store: Option<String>,
}

impl Target {
    /// Opens the state directory the way a program does: locked, so this fails with the holder's
    /// pid and command line while the program runs. A directory without a store is an error
    /// (reading commands create nothing).
    pub fn open(&self, command: &str) -> Result<ProgramStore, Failure> {
        let url = match (&self.store, &self.state) {
            (Some(url), _) => Some(url.clone()),
            // A state directory named outright is read, whatever the config's `[store] url`.
            (None, Some(_)) => None,
            (None, None) => select::url(None, &store_config(command)?),
        };
        if let Some(url) = url {
            if !crate::store::postgres::is_postgres(&url) {
                return Err(Failure::input(format!(
                    "colony {command}: {}",
                    crate::store::postgres::not_postgres(&url)
                )));
            }
            // A shared database: no lock to take, and it may be read while the program runs.
            return ProgramStore::open_existing(&url, &self.script)
                .map_err(|e| Failure::run(format!("colony {command}: {e}")));
        }
        let dir = match &self.state {
            Some(dir) => dir.clone(),
            None => {
                existing_script(command, &self.script)?;
                state_dir::default_for(&self.script)
            }
        };
        if !dir.join(STORE_FILE).exists() {
            let why = match &self.state {
                Some(_) if dir.is_file() => "it is a file, not a state directory".to_string(),
                Some(_) => format!("no {STORE_FILE} there"),
                None => format!("{} has stored nothing yet", self.script.display()),
            };
            let message = format!("colony {command}: no state in {} ({why})", dir.display());
            // A file given as the directory is bad input (status 2), as on `colony run`.
            return Err(if dir.is_file() {
                Failure::input(message)
            } else {
                Failure::run(message)
            });
        }
        StateDir::open(&dir)
            .map(ProgramStore::Dir)
            .map_err(|e| Failure::run(format!("colony {command}: {e}")))
    }
}

/// "3 messages" / "1 message".
pub fn count(n: usize, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

/// The config as far as reading a store needs it. A value that keeps the file from loading but
/// has nothing to do with the store (a use-type's unknown provider, a bad price) is said on
/// stderr and passed over, so a person can read what a program stored while mending the config;
/// it refused every reading command. A file that does not read as the config's TOML is still
/// refused.
fn store_config(command: &str) -> Result<crate::config::Config, Failure> {
    let path = crate::config::path();
    match crate::config::Config::load_from(&path) {
        Ok(config) => Ok(config),
        Err(e) => match crate::config::Config::read_unchecked(&path) {
            Ok(config) => {
                config.register_secrets();
                eprintln!("colony {command}: note: {e} (only [store] is read here)");
                Ok(config)
            }
            Err(_) => Err(Failure::input(format!("colony {command}: {e}"))),
        },
    }
}
