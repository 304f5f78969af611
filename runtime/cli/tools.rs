//! `colony tools refresh|list|clear`: the cache of every configured MCP server's tools. While it
//! exists, `colony ask` (and the chat client) offer those tools (`mcp.cached_tools()`).

use clap::Subcommand;

use super::Failure;
use crate::config::Config;
use crate::mcp::{cache, naming};

/// Keep a cache of the configured MCP servers' tools, offered by `colony ask` and `colony chat`.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
}

#[derive(Subcommand)]
enum Action {
    /// List every configured server's tools now and keep them in the cache.
    Refresh,
    /// Print the cached tools, as the model will see them.
    List,
    /// Delete the cache (no MCP tools are offered automatically any more).
    Clear,
}

fn failed(e: impl std::fmt::Display) -> Failure {
    Failure::run(format!("colony tools: {e}"))
}

pub async fn run(args: Args) -> Result<(), Failure> {
    match args.action {
        Action::Refresh => {
            let cfg = Config::load().map_err(|e| Failure::input(format!("colony tools: {e}")))?;
            if cfg.mcp.is_empty() {
                return Err(Failure::input(
                    "colony tools refresh: no MCP servers configured (colony mcp add)",
                ));
            }
            // An unreadable cache is replaced: a refresh is how it is made good.
            let previous = cache::load().ok().flatten();
            let fresh = cache::refresh(&cfg.mcp).await;
            let none_listed = fresh.servers.values().all(|s| s.error.is_some());
            let (fresh, kept) = cache::keeping_listed(previous.as_ref(), fresh);
            // Saved before anything is printed: a closed stdout (`| head -1`) ends the command
            // at its first line, and the cache must not be lost with the rest of the output.
            let saved = (!none_listed).then(|| cache::save(&fresh));
            for (name, server) in &fresh.servers {
                match &server.error {
                    Some(e) if kept.contains(name) => println!(
                        "{name}: error: {e} (its {} tools listed before are kept)",
                        server.tools.len()
                    ),
                    Some(e) => println!("{name}: error: {e}"),
                    None => println!("{name}: {} tools", server.tools.len()),
                }
            }
            if none_listed {
                let unchanged = if previous.is_some() {
                    "the cache is unchanged"
                } else {
                    "no cache was made"
                };
                return Err(Failure::run(format!(
                    "colony tools refresh: no server could be listed; {unchanged}"
                )));
            }
            if let Some(saved) = saved {
                saved.map_err(failed)?;
            }
            println!("cached in {}", cache::path().display());
            Ok(())
        }
        Action::List => {
            let Some(c) = cache::load().map_err(failed)? else {
                println!("no tool cache (colony tools refresh)");
                return Ok(());
            };
            let cfg = Config::load().map_err(|e| Failure::input(format!("colony tools: {e}")))?;
            for name in c.servers.keys() {
                if cache::current(&c, &cfg.mcp).all(|(n, _, _)| n != name) {
                    println!(
                        "{name}: deleted or changed since the cache was made (colony tools refresh)"
                    );
                }
            }
            for (name, server, _) in cache::current(&c, &cfg.mcp) {
                match &server.error {
                    Some(e) if server.tools.is_empty() => println!("{name}: error: {e}"),
                    Some(e) => println!(
                        "{name}: error at the last refresh: {e} (offering the tools listed before)"
                    ),
                    None => {}
                }
                for t in &server.tools {
                    let first = t.description.lines().next().unwrap_or("");
                    println!("{}\t{first}", naming::namespaced(name, &t.name));
                }
            }
            Ok(())
        }
        Action::Clear => {
            if cache::clear().map_err(failed)? {
                println!("tool cache cleared");
            } else {
                println!("no tool cache");
            }
            Ok(())
        }
    }
}
