//! `colony mcp serve FILE.lua` (a program's exports served over stdio, for Claude Desktop,
//! Claude Code, VS Code or any MCP client) and `colony mcp install FILE.lua --name N` (the
//! `mcpServers` entry that runs it).

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::permissions::SandboxArgs;
use super::{Cassettes, Failure, build_core};
use crate::lua::HostSetup;
use crate::mcp::server::stdio::{self, Ended};
use crate::mcp::server::{Exports, Offer};
use crate::permissions::Permissions;
use crate::residents::lifecycle::SCRIPT_ENDED;
use crate::store::state_dir::{self, StateDir};

/// Serve a program's exportable tools, exported residents, resources and prompts over MCP on
/// stdin and stdout (logs go to stderr). Ends with 0 when stdin closes, on SIGINT or SIGTERM,
/// or when the program stops.
///
/// The program reaches nothing beyond colony's own calls (model providers, configured MCP
/// servers) but what the --allow-* flags grant; without any, what the config's
/// `[[serve.programs]]` entry for the same file allows, as `colony serve` would give it.
#[derive(clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    cassettes: Cassettes,
    #[command(flatten)]
    sandbox: SandboxArgs,
    /// The program's state directory (default: beside the file, as `colony run` uses).
    #[arg(long, value_name = "DIR")]
    state: Option<PathBuf>,
    #[command(flatten)]
    program: super::program::Program,
}

/// Print (or write into a file) the `mcpServers` entry that runs `colony mcp serve FILE.lua`,
/// for `claude_desktop_config.json`, `.mcp.json` and the like.
#[derive(clap::Args)]
pub struct InstallArgs {
    /// The program to serve.
    file: PathBuf,
    /// The server's name in the client.
    #[arg(long)]
    name: String,
    /// Add the entry to this JSON file (created if missing; other entries are kept).
    #[arg(long, value_name = "PATH")]
    write: Option<PathBuf>,
    /// The permissions the served program gets (written into the entry's arguments, relative paths
    /// made absolute against the current folder).
    #[command(flatten)]
    sandbox: SandboxArgs,
}

pub async fn serve(args: ServeArgs) -> Result<(), Failure> {
    let file = args.program.file();
    super::program_file(&file, &["mcp", "serve"])?;
    args.program
        .warn_of_colony_options::<ServeArgs>("colony mcp serve");
    // First: whatever the program prints from its first line on goes to stderr.
    let streams = stdio::protocol_streams().map_err(|e| {
        Failure::run(format!(
            "colony mcp serve: cannot take stdin and stdout: {e}"
        ))
    })?;
    let core = build_core(&args.cassettes, &tokio::runtime::Handle::current())?;
    let dir = args
        .state
        .clone()
        .unwrap_or_else(|| state_dir::default_for(&file));
    let state = StateDir::open(&dir).map_err(|e| Failure::run(format!("colony mcp serve: {e}")))?;
    let permissions = permissions(&args, &core.config())?;
    let exports = Exports::default();
    let interrupt = crate::lua::watchdog::Interrupt::default();
    let host = HostSetup {
        interrupt: interrupt.clone(),
        store: Some(state.dyn_store()),
        mails_in: true,
        permissions: std::sync::Arc::new(permissions),
        max_memory: args.sandbox.max_memory(),
        exports: Some(exports.clone()),
        linger: true,
        ..HostSetup::default()
    };
    let running = crate::lua::start_file(core, &file, args.program.args()?, host)
        .map_err(|e| Failure::run(e.0))?;
    let lifecycle = running.lifecycle.clone();
    let script = lifecycle.script_end();
    let offered = exports.clone();
    let offer = Offer {
        program: file
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_default(),
        exports,
        route: lifecycle.route().clone(),
    };
    let ended = stdio::serve(offer, "colony", streams)
        .await
        .map_err(|e| Failure::run(format!("colony mcp serve: {e}")))?;
    tracing::info!("colony mcp serve: {ended:?}");
    let reason = match &ended {
        Ended::Closed => "the MCP client closed stdin".to_string(),
        Ended::Unwritable => {
            "stdout could not be written (the MCP client closed its end)".to_string()
        }
        Ended::Signal(s) => s.to_string(),
        Ended::Stopped(r) => r.clone(),
    };
    // A signal ends the program at once unless turns are in flight, which get the watch's
    // grace first (as its log line says). Decided by the watch's state, it raced the watch's
    // own listener, which ends the watch on the same signal within a millisecond: turns in
    // flight were cut about one run in two under "get up to 10.0 s to finish", and a script
    // running on after its watch (a loop of its own) sometimes waited 20 s and ended 1. Nothing
    // in flight is lost by ending now; a main chunk still starting, or running on after its
    // watch, may never return. That end is the one asked for: status 0.
    let cut = matches!(ended, Ended::Signal(_)) && lifecycle.route().busy() == 0;
    if cut {
        lifecycle.route().abandon(reason);
    } else {
        lifecycle.stop_for_host(reason);
    }
    let joined = tokio::task::spawn_blocking(move || running.join())
        .await
        .map_err(|e| Failure::run(format!("colony mcp serve: the Lua thread panicked: {e}")))?;
    drop(state);
    // Nothing to serve and nothing running: the client was served empty lists until the
    // program ended, and now finds the server gone. Said as a failure, not as a quiet end.
    // Its script ended by itself, or its watch did (`"there are no residents"`: a program of
    // tools it did not mark exportable ended 0, the client's next request unanswered): a
    // signal its watch heard, before the program exported anything, is no such failure.
    let ended_by_itself = matches!(&ended,
        Ended::Stopped(why) if why == SCRIPT_ENDED || !crate::signals::is_stop_signal(why));
    if ended_by_itself && script.has_ended() && offered.is_empty() {
        joined.map_err(|e| Failure::run(e.0))?;
        return Err(Failure::run(format!(
            "colony mcp serve: {} exports nothing and its script has ended, so there is \
             nothing to serve: mark a tool `exportable = true`, a resident `export = true`, or \
             offer `mcp.resource` / `mcp.prompt`",
            file.display()
        )));
    }
    // The signal that ended the session may also end the program where it waits (heard by the
    // program's own listener as its watch ended): the end asked for all the same, status 0.
    // Under load that was exit 1, "the program was ended by SIGTERM".
    let asked = match &ended {
        Ended::Signal(s) => interrupt.abandoned_by().as_deref() == Some(*s),
        _ => false,
    };
    match joined {
        Err(e) if cut || asked => {
            tracing::info!("colony mcp serve: {}", e.0);
            Ok(())
        }
        joined => joined.map_err(|e| Failure::run(e.0)),
    }
}

/// What the served program may reach: what the flags grant, else what the config's
/// `[[serve.programs]]` entry for the same file allows, else nothing.
fn permissions(args: &ServeArgs, config: &crate::config::Config) -> Result<Permissions, Failure> {
    if args.sandbox.given() {
        return Ok(args
            .sandbox
            .granted(&std::env::current_dir().unwrap_or_default()));
    }
    let Some(settings) = &config.serve else {
        return Ok(Permissions::none());
    };
    let config_file = crate::config::path();
    let base = config_file
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let file = args.program.file();
    match crate::serve::programs::entry_for(settings, &base, &file) {
        Some(entry) => crate::serve::programs::permissions(entry, &base).map_err(|e| {
            Failure::input(format!(
                "colony mcp serve: {}: the [[serve.programs]] entry for {}: {e}",
                config_file.display(),
                file.display()
            ))
        }),
        None => Ok(Permissions::none()),
    }
}

/// The entry: the absolute path of this binary, `mcp serve`, the permission flags and the
/// program's absolute path.
pub fn entry(file: &Path, flags: &[String]) -> Result<Value, Failure> {
    let program = std::path::absolute(file)
        .map_err(|e| Failure::input(format!("colony mcp install: {}: {e}", file.display())))?;
    let colony = std::env::current_exe()
        .map_err(|e| Failure::run(format!("colony mcp install: where is colony? {e}")))?;
    let args: Vec<String> = ["mcp", "serve"]
        .into_iter()
        .map(String::from)
        .chain(flags.iter().cloned())
        .chain([program.display().to_string()])
        .collect();
    Ok(json!({
        "command": colony.display().to_string(),
        "args": args,
    }))
}

pub fn install(args: InstallArgs) -> Result<(), Failure> {
    super::program_file(&args.file, &["mcp", "install"])?;
    if args.name.trim().is_empty() {
        return Err(Failure::input(
            "colony mcp install: --name must not be empty",
        ));
    }
    let here = std::env::current_dir()
        .map_err(|e| Failure::input(format!("colony mcp install: the current folder: {e}")))?;
    let entry = entry(&args.file, &args.sandbox.flags(&here))?;
    let Some(path) = args.write else {
        let doc = json!({ "mcpServers": { args.name: entry } });
        println!("{}", serde_json::to_string_pretty(&doc).unwrap_or_default());
        return Ok(());
    };
    let mut doc = match std::fs::read_to_string(&path) {
        Ok(text) if text.trim().is_empty() => json!({}),
        Ok(text) => serde_json::from_str::<Value>(&text).map_err(|e| {
            Failure::input(format!(
                "colony mcp install: {} is not JSON ({e}); it was left as it is",
                path.display()
            ))
        })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => json!({}),
        Err(e) => {
            return Err(Failure::input(format!(
                "colony mcp install: cannot read {}: {e}",
                path.display()
            )));
        }
    };
    let Some(root) = doc.as_object_mut() else {
        return Err(Failure::input(format!(
            "colony mcp install: {} holds no JSON object; it was left as it is",
            path.display()
        )));
    };
    let servers = root.entry("mcpServers").or_insert_with(|| json!({}));
    let Some(servers) = servers.as_object_mut() else {
        return Err(Failure::input(format!(
            "colony mcp install: {}: mcpServers is not an object; it was left as it is",
            path.display()
        )));
    };
    servers.insert(args.name.clone(), entry);
    let text = serde_json::to_string_pretty(&doc).unwrap_or_default() + "\n";
    std::fs::write(&path, text).map_err(|e| {
        Failure::run(format!(
            "colony mcp install: cannot write {}: {e}",
            path.display()
        ))
    })?;
    println!("{}: added {} to mcpServers", path.display(), args.name);
    Ok(())
}
