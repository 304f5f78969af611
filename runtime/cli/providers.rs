//! `colony providers`: the catalogue, whether a key for each is in the environment, and the base
//! URL each is reached at (its `*_BASE_URL` variable's when set).

use super::Failure;
use crate::config::default_base_url;
use crate::providers::catalogue::CATALOGUE;

/// List the providers colony knows.
#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> Result<(), Failure> {
    println!(
        "{:<10} {:<18} {:<10} {:<26} {:<18} {:<7} {:<10} BASE URL",
        "ID", "NAME", "STYLE", "DEFAULT MODEL", "KEY VARIABLE", "TOOLS", "KEY"
    );
    for e in CATALOGUE {
        let key = if e.key_env.is_empty() {
            "not needed"
        } else if std::env::var_os(e.key_env).is_some() {
            "set"
        } else {
            "not set"
        };
        let tools = serde_json::to_value(e.tools)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default();
        println!(
            "{:<10} {:<18} {:<10} {:<26} {:<18} {:<7} {key:<10} {}",
            e.id,
            e.name,
            e.style.as_str(),
            e.default_model,
            if e.key_env.is_empty() { "-" } else { e.key_env },
            tools,
            Some(default_base_url(e))
                .filter(|u| !u.is_empty())
                .unwrap_or_else(|| "-".into())
        );
    }
    Ok(())
}
