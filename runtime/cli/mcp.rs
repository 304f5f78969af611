//! `colony mcp add|del|list|test|import` (and `login`/`logout`, `serve`/`install` elsewhere): the MCP servers configured by name (`[mcp.NAME]` in the
//! config file), which `mcp = { "NAME" }`, `mcp.connect_named` and `colony tools refresh` use.

use std::collections::BTreeMap;
use std::path::PathBuf;

use clap::Subcommand;

use super::Failure;
use crate::config::Config;
use crate::mcp::spec::{ServerConfig, import_mcp_servers};
use crate::mcp::{Connection, Transport};

/// Configure MCP servers by name, and check that they answer.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
}

#[derive(Subcommand)]
enum Action {
    /// Add (or replace) a server: `colony mcp add NAME URL` or `colony mcp add NAME -- COMMAND ARGS...`.
    Add {
        /// The server's name (letters, digits, `-` and `_`, no `__`): its tools are offered as
        /// `NAME__tool`.
        name: String,
        /// An HTTP header for every request, `Name: value` (e.g. `Authorization: Bearer ...`).
        #[arg(long = "header", value_name = "NAME: VALUE")]
        headers: Vec<String>,
        /// An environment variable for the command, `NAME=value`.
        #[arg(long = "env", value_name = "NAME=VALUE")]
        env: Vec<String>,
        /// The command's working directory.
        #[arg(long)]
        cwd: Option<String>,
        /// Offer the server's resources to turns as read-only tools.
        #[arg(long)]
        resources: bool,
        /// The use-type whose model answers the server's sampling requests (none: refused).
        #[arg(long, value_name = "USE")]
        sampling: Option<String>,
        /// The server's URL (Streamable HTTP).
        url: Option<String>,
        /// After `--`: the command that starts the server (stdio), and its arguments.
        #[arg(last = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
    /// Remove a server.
    #[command(visible_alias = "remove")]
    Del {
        /// The server's name.
        name: String,
    },
    /// Print every configured server.
    List,
    /// Connect to a server and print the revision it speaks and its tools.
    Test {
        /// The server's name.
        name: String,
    },
    /// Add the servers of a Claude Desktop config or a `.mcp.json` (its `mcpServers` object).
    Import { file: PathBuf },
    /// Serve a program's exports over MCP on stdin and stdout.
    #[command(override_usage = "colony mcp serve [OPTIONS] <FILE> [ARGS]...")]
    Serve(super::mcp_serve::ServeArgs),
    /// Print (or --write) the `mcpServers` entry that runs `colony mcp serve FILE.lua`.
    Install(super::mcp_serve::InstallArgs),
    /// Sign in to a remote server behind OAuth (opens the browser, or prints the page to open).
    Login {
        /// The server's name.
        name: String,
        /// Print the sign-in page's URL without opening a browser.
        #[arg(long)]
        no_browser: bool,
    },
    /// Remove the tokens kept for a remote server (the next connection signs in again).
    Logout {
        /// The server's name.
        name: String,
    },
}

fn load() -> Result<Config, Failure> {
    Config::load().map_err(|e| Failure::input(format!("colony mcp: {e}")))
}

/// [`load`] to change it: the file stays locked until the returned lock is dropped, after
/// [`save`]. Read without judging its values, so that `colony mcp del` can mend the very table
/// that keeps the file from loading; [`save`] judges the result.
fn load_to_change() -> Result<(Config, crate::config::EditLock), Failure> {
    let path = crate::config::path();
    let lock = crate::config::EditLock::take(&path)
        .map_err(|e| Failure::run(format!("colony mcp: {e}")))?;
    let cfg =
        Config::read_unchecked(&path).map_err(|e| Failure::input(format!("colony mcp: {e}")))?;
    Ok((cfg, lock))
}

/// Writes `cfg` if it holds no problem: one it kept (a misspelt field of another table, which
/// writing would drop) is named for the user to mend first.
fn save(cfg: &Config) -> Result<(), Failure> {
    let path = crate::config::path();
    let problems = cfg.problems();
    if !problems.is_empty() {
        return Err(Failure::input(format!(
            "colony mcp: {} is not written, as it would still hold: {} (mend it, or `colony mcp \
             del NAME` the table)",
            path.display(),
            problems.join("; ")
        )));
    }
    cfg.save_to(&path)
        .map_err(|e| Failure::run(format!("colony mcp: {e}")))
}

fn pairs(items: &[String], sep: char, what: &str) -> Result<BTreeMap<String, String>, Failure> {
    items
        .iter()
        .map(|item| match item.split_once(sep) {
            // A CR or LF would be a second header (or an error only at the first call).
            _ if item.chars().any(char::is_control) => Err(Failure::input(format!(
                "colony mcp add: {what} {item:?} holds a control character (a line break?)"
            ))),
            Some((k, v)) if !k.trim().is_empty() => {
                Ok((k.trim().to_string(), v.trim_start().to_string()))
            }
            _ => Err(Failure::input(format!(
                "colony mcp add: {what} {item:?} is not NAME{sep}VALUE"
            ))),
        })
        .collect()
}

/// `name` as a server name [`server_name`] accepts (a Claude Desktop file may name a server
/// `My files` or `files.local`): each run of other characters, and of `_`, becomes one `_`,
/// without one at either end. `None` when nothing is left.
fn usable_name(name: &str) -> Option<String> {
    let mut out = String::new();
    for c in name.chars() {
        if c.is_ascii_alphanumeric() || c == '-' {
            out.push(c);
        } else if !out.is_empty() && !out.ends_with('_') {
            out.push('_');
        }
    }
    let out = out.trim_end_matches('_').to_string();
    (!out.is_empty() && out.chars().any(|c| c.is_ascii_alphanumeric())).then_some(out)
}

/// A server's name as its tools carry it (`NAME__tool`): letters, digits, `-` and `_`, without
/// `__`. An empty name gave tools named `__echo`, a name with a line break or an escape sequence
/// was printed raw by `mcp list`, and `a b`, `a/b` and `a_b` (or `x` with a tool `y__echo` and
/// `x__y` with `echo`) named their tools alike, so one server's hid the other's.
/// A name may not end in `_` either: `a_` with a tool `echo` and `a` with `_echo` both named
/// theirs `a___echo`.
fn server_name(name: &str) -> Result<(), Failure> {
    match crate::mcp::naming::server_name_problem(name) {
        None => Ok(()),
        Some(why) => Err(Failure::input(format!(
            "colony mcp add: {name:?} is not a server name: {why}"
        ))),
    }
}

impl Args {
    /// Whether this is `colony mcp serve`, which runs until a signal ends it.
    pub fn serves(&self) -> bool {
        matches!(self.action, Action::Serve(_))
    }
}

pub async fn run(args: Args) -> Result<(), Failure> {
    match args.action {
        Action::Serve(args) => super::mcp_serve::serve(args).await,
        Action::Install(args) => super::mcp_serve::install(args),
        Action::Login { name, no_browser } => super::mcp_login::run(name, no_browser).await,
        Action::Logout { name } => super::mcp_login::logout(name),
        Action::Add {
            name,
            headers,
            env,
            cwd,
            resources,
            sampling,
            url,
            command,
        } => {
            server_name(&name)?;
            let mut config = if let Some(url) = url {
                if !command.is_empty() {
                    return Err(Failure::input(
                        "colony mcp add: give a URL or -- COMMAND ARGS..., not both",
                    ));
                }
                if !env.is_empty() || cwd.is_some() {
                    return Err(Failure::input(
                        "colony mcp add: --env and --cwd are for a command, not a URL",
                    ));
                }
                ServerConfig {
                    url: Some(url),
                    headers: pairs(&headers, ':', "header")?,
                    ..ServerConfig::default()
                }
            } else {
                if command.first().is_none_or(|c| c.trim().is_empty()) {
                    return Err(Failure::input(
                        "colony mcp add: give a URL or -- COMMAND ARGS...",
                    ));
                }
                if !headers.is_empty() {
                    return Err(Failure::input(
                        "colony mcp add: --header is for a URL, not a command",
                    ));
                }
                ServerConfig {
                    command: Some(command[0].clone()),
                    args: command[1..].to_vec(),
                    env: pairs(&env, '=', "env")?,
                    cwd,
                    ..ServerConfig::default()
                }
            };
            config.resources = resources.then_some(true);
            config.sampling = sampling;
            let spec = config
                .clone()
                .into_spec(&name)
                .map_err(|e| Failure::input(format!("colony mcp add: {e}")))?;
            let (mut cfg, _lock) = load_to_change()?;
            // Replacing a remote server: how it signs in (`[mcp.NAME.auth]`, which no flag
            // sets) stays.
            let kept_auth = match cfg.mcp.get(&name) {
                Some(old) if config.url.is_some() && old.auth.is_some() => {
                    config.auth = old.auth.clone();
                    format!(" (its [mcp.{name}.auth] is kept)")
                }
                _ => String::new(),
            };
            // A server of that name is replaced, and that is said with what it was: it was
            // replaced without a word.
            let was = cfg
                .mcp
                .insert(name.clone(), config)
                .and_then(|old| old.into_spec(&name).ok())
                .map(|old| format!(" (replaces {})", old.describe()))
                .unwrap_or_default();
            save(&cfg)?;
            println!("{name}: {}{kept_auth}{was}", spec.describe());
            Ok(())
        }
        Action::Del { name } => {
            let (mut cfg, _lock) = load_to_change()?;
            if cfg.mcp.remove(&name).is_none() {
                return Err(Failure::input(format!(
                    "colony mcp del: no server named {name:?}"
                )));
            }
            save(&cfg)?;
            println!("removed {name}");
            Ok(())
        }
        Action::List => {
            let cfg = load()?;
            if cfg.mcp.is_empty() {
                println!(
                    "no MCP servers configured (colony mcp add NAME URL | colony mcp add NAME -- COMMAND ARGS...)"
                );
            }
            for (name, config) in &cfg.mcp {
                match config.clone().into_spec(name) {
                    Ok(spec) => {
                        let kind = match spec.transport {
                            Transport::Http { .. } => "http",
                            Transport::Stdio { .. } => "stdio",
                            Transport::Unavailable { .. } => "unavailable",
                        };
                        println!("{name}\t{kind}\t{}", spec.describe());
                    }
                    Err(e) => println!("{name}\tinvalid\t{e}"),
                }
            }
            Ok(())
        }
        Action::Test { name } => {
            let cfg = load()?;
            let config = cfg.mcp.get(&name).ok_or_else(|| {
                Failure::input(format!("colony mcp test: no server named {name:?}"))
            })?;
            let spec = config
                .clone()
                .into_spec(&name)
                .map_err(|e| Failure::input(format!("colony mcp test: {e}")))?;
            let conn = Connection::open(spec)
                .await
                .map_err(|e| Failure::run(format!("colony mcp test: {e}")))?;
            let tools = conn.list_tools().await;
            let version = conn.version().await.unwrap_or_default();
            let server = conn
                .server_info()
                .await
                .map(|(n, v)| format!(" ({n} {v})").replace(" )", ")"))
                .unwrap_or_default();
            conn.close().await;
            let tools = tools.map_err(|e| Failure::run(format!("colony mcp test: {e}")))?;
            println!("{name}: MCP {version}{server}, {} tools", tools.len());
            for t in tools {
                let first = t.description.lines().next().unwrap_or("");
                println!("  {}\t{first}", t.name);
            }
            Ok(())
        }
        Action::Import { file } => {
            let text = std::fs::read_to_string(&file).map_err(|e| {
                Failure::input(format!("colony mcp import: {}: {e}", file.display()))
            })?;
            let servers = import_mcp_servers(&text).map_err(|e| {
                Failure::input(format!("colony mcp import: {}: {e}", file.display()))
            })?;
            let (mut cfg, _lock) = load_to_change()?;
            let mut said = Vec::new();
            let mut taken = std::collections::BTreeSet::new();
            for (name, config) in servers {
                let Some(usable) = usable_name(&name) else {
                    said.push(format!(
                        "skipped {name:?}: no letter or digit to name it by"
                    ));
                    continue;
                };
                if !taken.insert(usable.clone()) {
                    said.push(format!(
                        "skipped {name:?}: it would be named {usable}, as another server in the file is"
                    ));
                    continue;
                }
                let placeholders = crate::mcp::spec::placeholders(&config);
                let mut line = if usable == name {
                    format!("imported {name}")
                } else {
                    format!("imported {name:?} as {usable} (its tools: {usable}__TOOL)")
                };
                // One of that name is replaced, and said with what it was (import replaced it,
                // its env and all, without a word).
                if let Some(old) = cfg
                    .mcp
                    .insert(usable.clone(), config)
                    .and_then(|old| old.into_spec(&usable).ok())
                {
                    line.push_str(&format!(" (replaces {})", old.describe()));
                }
                if !placeholders.is_empty() {
                    line.push_str(&format!(
                        "; it holds {}, which colony passes on as written, not filled in from \
                         the environment: put the values in with `colony mcp add`",
                        placeholders.join(", ")
                    ));
                }
                said.push(line);
            }
            save(&cfg)?;
            for line in said {
                println!("{line}");
            }
            Ok(())
        }
    }
}
