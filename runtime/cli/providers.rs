//! `colony providers`: the catalogue, whether a key for each is set (in the environment, or in a
//! use-type of the config that names the provider), and the base URL each is reached at (its
//! `*_BASE_URL` variable's when set), with the use-types that reach it at one of their own.

use super::Failure;
use crate::config::default_base_url;
use crate::providers::catalogue::CATALOGUE;

/// List the providers colony knows.
#[derive(clap::Args)]
pub struct Args {}

pub fn run(_args: Args) -> Result<(), Failure> {
    // Read as every command reads it: a config that does not load is said (status 2), and the
    // keys and base URLs stored in it are shown. It was not read at all: a key set with
    // `colony config set` showed "not set".
    let config =
        crate::config::Config::load().map_err(|e| Failure::input(format!("colony: {e}")))?;
    let of = |id: &'static str| {
        config
            .uses
            .iter()
            .filter(move |(_, u)| u.provider.as_deref() == Some(id))
    };
    println!(
        "{:<10} {:<18} {:<10} {:<26} {:<18} {:<7} {:<10} BASE URL",
        "ID", "NAME", "STYLE", "DEFAULT MODEL", "KEY VARIABLE", "TOOLS", "KEY"
    );
    for e in CATALOGUE {
        let in_config = of(e.id).any(|(_, u)| {
            u.key.is_some()
                || u.key_env
                    .as_deref()
                    .is_some_and(|v| std::env::var_os(v).is_some())
        });
        let key = if e.key_env.is_empty() {
            "not needed"
        } else if std::env::var_os(e.key_env).is_some() {
            "set"
        } else if in_config {
            "in config"
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
    let own: Vec<String> = CATALOGUE
        .iter()
        .flat_map(|e| {
            of(e.id).filter_map(|(name, u)| {
                u.base_url
                    .as_ref()
                    .map(|url| format!("  [use.{name}] reaches {} at {url}", e.id))
            })
        })
        .collect();
    if !own.is_empty() {
        println!("\nUse-types with a base URL of their own:");
        for line in own {
            println!("{line}");
        }
    }
    Ok(())
}
