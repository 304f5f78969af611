//! `colony scripts [cat NAME]`: the Lua front ends compiled into the binary, to read, copy and
//! change (`colony scripts cat chat > my-chat.lua; colony run my-chat.lua`).

use clap::Subcommand;

use super::Failure;
use crate::shipped::{self, SCRIPTS};

/// List the Lua scripts behind colony's own commands, or print one.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    action: Option<Action>,
}

#[derive(Subcommand)]
enum Action {
    /// Print a script's source (e.g. `colony scripts cat chat`).
    Cat { name: String },
}

pub fn run(args: Args) -> Result<(), Failure> {
    match args.action {
        None => {
            let width = SCRIPTS.iter().map(|s| s.name().len()).max().unwrap_or(0);
            for s in SCRIPTS {
                println!("{:width$}  {}", s.name(), s.summary());
            }
            Ok(())
        }
        Some(Action::Cat { name }) => match shipped::script(&name) {
            Some(s) => {
                print!("{}", s.source);
                Ok(())
            }
            None => Err(Failure::input(format!(
                "colony scripts: no script {name:?} (scripts: {})",
                SCRIPTS
                    .iter()
                    .map(|s| s.name())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        },
    }
}
