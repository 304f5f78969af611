//! The `colony` command: one file per subcommand, each with its clap arguments and its `run`.

mod ask;
mod audit;
mod chat;
mod config;
mod conversations;
mod mcp;
mod mcp_login;
mod mcp_serve;
mod models;
mod panic;
pub mod permissions;
mod program;
mod providers;
mod run;
mod scripts;
mod serve;
mod state;
mod stdout_gone;
mod store;
mod table;
mod terminal;
mod tools;
mod usage;
mod wizard;

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};

use crate::core::{Core, CoreParts};
use crate::providers::{Providers, replay};

pub use panic::{CLOSED_STDOUT_STATUS, PANIC_ON_PURPOSE};

#[derive(Parser)]
#[command(
    name = "colony",
    version,
    about = "A runtime in which Lua programs host AIs",
    long_about = "A runtime in which Lua programs host AIs.\n\n\
        Settings come from the config file (see `colony config list`; COLONY_CONFIG overrides its \
        path) and the environment (ANTHROPIC_API_KEY, OPENAI_API_KEY, GEMINI_API_KEY, ...). \
        RUST_LOG controls logging to stderr."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    #[command(override_usage = "colony run [OPTIONS] <FILE> [ARGS]...")]
    Run(run::Args),
    Ask(ask::Args),
    Chat(chat::Args),
    Scripts(scripts::Args),
    Providers(providers::Args),
    Models(models::Args),
    Config(config::Args),
    State(state::Args),
    Conversations(conversations::Args),
    Store(store::Args),
    Audit(audit::Args),
    Usage(usage::Args),
    Mcp(mcp::Args),
    Tools(tools::Args),
    Serve(serve::Args),
}

/// Where model calls go: `--replay` answers from a cassette, `--record` writes one.
#[derive(clap::Args, Clone, Default)]
pub struct Cassettes {
    /// Answer every model call from this cassette (JSONL) instead of the network.
    #[arg(long, value_name = "FILE", conflicts_with = "record")]
    pub replay: Option<PathBuf>,
    /// Call the models for real and write every exchange to this cassette (keys are never written).
    #[arg(long, value_name = "FILE")]
    record: Option<PathBuf>,
}

/// A failure to report: the message, and the exit code (1 for a failed run, 2 for bad input).
pub struct Failure {
    pub message: String,
    pub code: u8,
}

impl Failure {
    pub fn input(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            code: 2,
        }
    }

    pub fn run(message: impl Into<String>) -> Failure {
        Failure {
            message: message.into(),
            code: 1,
        }
    }
}

/// What clap's own `exit` does for `--help`, `--version` and bad arguments, except that a help
/// text that could not be written is not a success: clap ignores the write's error, so
/// `colony --help > /dev/full` exited 0 with nothing written. A closed reader is quiet: `--help`
/// is 0, bad arguments still 2.
fn parse_failed(e: &clap::Error) -> ExitCode {
    let status = ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(2));
    match e.print() {
        Ok(()) => status,
        Err(w) if w.kind() == std::io::ErrorKind::BrokenPipe => status,
        Err(w) => {
            let stream = if e.use_stderr() { "stderr" } else { "stdout" };
            eprintln!("colony: cannot write to {stream}: {w}");
            ExitCode::from(panic::WRITE_FAILED_STATUS as u8)
        }
    }
}

pub fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return parse_failed(&e),
    };
    crate::shipped::set_commands(commands());
    let json_logs =
        matches!(&cli.command, Command::Serve(a) if a.log_format == serve::LogFormat::Json);
    init_logging(json_logs);
    terminal::remember();
    panic::install();
    if std::env::var_os(PANIC_ON_PURPOSE).is_some() {
        panic!("{PANIC_ON_PURPOSE} is set: colony panics on purpose");
    }
    // `colony run` reads its config and starts opening the program's store before the runtime
    // is built: on 2 cores the two overlap, and a one-turn run starts about 1.3 ms sooner.
    let prepared_run = match &cli.command {
        Command::Run(args) => Some(run::prepare(args)),
        _ => None,
    };
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("colony-core")
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("colony: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::Run(args) => prepared_run
            .unwrap_or_else(|| run::prepare(&args))
            .and_then(|prepared| run::run(args, prepared, rt.handle())),
        Command::Ask(args) => ask::run(args, rt.handle()),
        Command::Chat(args) => chat::run(args, rt.handle()),
        Command::Scripts(args) => scripts::run(args),
        Command::Providers(args) => providers::run(args),
        Command::Models(args) => rt.block_on(models::run(args, rt.handle())),
        Command::Config(args) => {
            let _signals = rt.spawn(terminal::give_back_on_signals());
            rt.block_on(config::run(args, rt.handle()))
        }
        Command::State(args) => state::run(args),
        Command::Conversations(args) => conversations::run(args),
        Command::Store(args) => store::run(args),
        Command::Audit(args) => audit::run(args),
        Command::Usage(args) => usage::run(args),
        // `mcp serve` hears its own signals.
        Command::Mcp(args) if args.serves() => rt.block_on(mcp::run(args)),
        Command::Mcp(args) => rt.block_on(interruptible(mcp::run(args))),
        Command::Tools(args) => rt.block_on(interruptible(tools::run(args))),
        Command::Serve(args) => serve::run(args, rt.handle()),
    };
    // Stdio MCP servers a program or command left running end with colony.
    crate::mcp::server_group::end_all();
    // Before the error is said: said on a raw terminal, it began on the prompt's line.
    terminal::restore();
    let code = match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            say_failure(f.message.trim_end());
            ExitCode::from(f.code)
        }
    };
    // A blocking task still running (a read nobody will answer) does not hold the exit: a
    // runtime dropped waits for its blocking tasks for ever. After the error is said, which
    // does not wait on it.
    rt.shutdown_timeout(RUNTIME_PATIENCE);
    code
}

/// How long the end of a command waits for the runtime's blocking tasks (a store's writes
/// finish in milliseconds; a read of a pipe nobody writes never does).
const RUNTIME_PATIENCE: std::time::Duration = std::time::Duration::from_secs(5);

/// `command`, or exit status 130 when Ctrl-C (or SIGTERM) ends it first: `main` goes on to end
/// the stdio MCP servers it started, which the signal's default action would have left running.
async fn interruptible(
    command: impl std::future::Future<Output = Result<(), Failure>>,
) -> Result<(), Failure> {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut int), Ok(mut term)) = (crate::signals::sigint(), signal(SignalKind::terminate()))
    else {
        return command.await;
    };
    tokio::select! {
        done = command => done,
        _ = int.recv() => Err(Failure { message: "colony: interrupted (SIGINT)".into(), code: 130 }),
        _ = term.recv() => Err(Failure { message: "colony: interrupted (SIGTERM)".into(), code: 143 }),
    }
}

/// Each subcommand's name and one-line description, as `colony --help` lists them.
pub fn commands() -> Vec<(String, String)> {
    use clap::CommandFactory;
    Cli::command()
        .get_subcommands()
        .map(|c| {
            (
                c.get_name().to_string(),
                c.get_about().map(|a| a.to_string()).unwrap_or_default(),
            )
        })
        .collect()
}

/// `--provider NAME` of a command is one colony knows: bad input (status 2), named before
/// anything runs (it was a `config_error` of the call, status 1).
fn known_provider(who: &str, name: &str) -> Result<(), Failure> {
    if crate::providers::catalogue::find(name).is_some() {
        return Ok(());
    }
    Err(Failure::input(format!(
        "{who}: --provider {name:?} is not a provider colony knows (known: {})",
        crate::providers::catalogue::ids().join(", ")
    )))
}

/// Whether the log is JSON lines (`colony serve --log-format json`).
static JSON_LOGS: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Says why a command failed on stderr: as the log's JSON object when the log is JSON lines (a
/// line of plain text among them broke a parser reading journald or Loki), else as it is.
pub fn say_failure(message: &str) {
    if JSON_LOGS.load(std::sync::atomic::Ordering::Relaxed) {
        // Written here in the log's own shape, not through the log: a filter (`RUST_LOG=off`)
        // must not silence why the process ends.
        let line = serde_json::json!({
            "timestamp": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            "level": "ERROR",
            "fields": { "message": message },
            "target": "colony",
        });
        let _ = writeln!(std::io::stderr(), "{line}");
    } else {
        // Not `eprintln!`: on a closed stderr (`2>&1 | head -1`) it panicked, and the panic of
        // a closed reader is a quiet exit 0, so a failed command reported success.
        let _ = writeln!(std::io::stderr(), "{message}");
    }
}

/// stderr for the log. A line that cannot be written (its reader gone: `2>&1 | head -1`) is
/// dropped here: tracing reports a failed write with `eprintln!`, which panics on the same
/// closed stderr, and that panic is the quiet exit 0 of a closed reader, whatever the command
/// was ending with (a run past `--max-time` exited 0, not 124).
struct LogSink;

impl std::io::Write for LogSink {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

/// Logging to stderr; `json`: one JSON object a line (`colony serve --log-format json`).
fn init_logging(json: bool) {
    JSON_LOGS.store(json, std::sync::atomic::Ordering::Relaxed);
    use tracing_subscriber::EnvFilter;
    // rmcp logs the failures it returns to us as errors of its own: colony reports them once.
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("warn,rmcp=off"));
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| LogSink);
    let _ = if json {
        fmt.json().try_init()
    } else {
        // Colour on a terminal only, and not when plain text was asked for (`NO_COLOR`,
        // `TERM=dumb`): each log line came in colour escapes, inside `colony chat` too.
        fmt.with_ansi(
            std::io::IsTerminal::is_terminal(&std::io::stderr())
                && !crate::lua::term::plain_asked(),
        )
        .try_init()
    };
}

/// The long option of subcommand `command` closest to `given` (`--hlep`: `--help`), if one is
/// close enough to be what was meant.
fn similar_option(given: &str, command: &[&str]) -> Option<String> {
    use clap::CommandFactory;
    let given = given.split('=').next().unwrap_or(given);
    let mut cmd = Cli::command();
    for name in command {
        cmd = cmd.find_subcommand(name)?.clone();
    }
    let names = cmd
        .get_arguments()
        .filter_map(|a| a.get_long())
        .chain(["help"])
        .map(|long| format!("--{long}"));
    names
        .map(|o| (strsim::jaro(given, &o), o))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, o)| o)
}

/// The core for one command: the config file, and the cassette options.
/// Why `path`, given as a file to read, is not one (`no such file`, `a folder, not a file`), as
/// the end of a message; `None` for something to read (a file, or a pipe: `colony run <(...)`).
/// A folder was reported as missing, or failed later with the OS's "Is a directory".
pub fn not_a_file(path: &std::path::Path) -> Option<&'static str> {
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => Some("a folder, not a file"),
        Ok(_) => None,
        Err(_) => Some("no such file"),
    }
}

/// `Ok` when `file`, a program to run, can be read; else the input failure naming it and why not
/// (`colony run`, `colony serve`, `colony mcp serve` and `install` say it alike). `command` is
/// the subcommand's path (`["run"]`, `["mcp", "serve"]`), whose options a mistyped one is
/// compared with.
pub fn program_file(file: &std::path::Path, command: &[&str]) -> Result<(), Failure> {
    match not_a_file(file) {
        None => Ok(()),
        // `colony run --stat x.lua`: an option mistyped before the file is taken for the file.
        Some(_) if file.as_os_str().as_encoded_bytes().starts_with(b"-") => {
            // As clap suggests for every other command (`colony run` takes what follows the
            // file as the script's, so clap never sees the option as one).
            let tip = similar_option(&file.to_string_lossy(), command)
                .map(|o| format!("\n\n  tip: a similar option exists: '{o}'"))
                .unwrap_or_default();
            Err(Failure::input(format!(
                "colony: {} is neither an option of this command (see --help) nor a file{tip}",
                file.display()
            )))
        }
        Some(why) => Err(Failure::input(format!(
            "colony: cannot read {}: {why}",
            file.display()
        ))),
    }
}

pub fn build_core(cassettes: &Cassettes, handle: &tokio::runtime::Handle) -> Result<Core, Failure> {
    Ok(core_parts(cassettes)?.start(handle.clone()))
}

/// What [`build_core`] builds a core of, read before there is a runtime: the cassettes and the
/// config file.
pub fn core_parts(cassettes: &Cassettes) -> Result<CoreParts, Failure> {
    let replay = match &cassettes.replay {
        Some(path) => Some(Arc::new(
            replay::Cassette::load(path).map_err(|e| Failure::input(format!("colony: {e}")))?,
        )),
        None => None,
    };
    let record = match &cassettes.record {
        Some(path) => Some(Arc::new(
            replay::Recorder::create(path).map_err(|e| Failure::input(format!("colony: {e}")))?,
        )),
        None => None,
    };
    // The file is read again when it changes on disk: a program blocked on a bad setting is
    // served once it is fixed.
    CoreParts::from_config_file(&crate::config::path(), Providers::new(replay, record))
        .map_err(|e| Failure::input(format!("colony: {e}")))
}

/// A flag's value that says something: `--model ""` was sent to the provider as the empty model.
pub(crate) fn not_blank(text: &str) -> Result<String, String> {
    if text.trim().is_empty() {
        Err("must not be empty".into())
    } else {
        Ok(text.to_string())
    }
}
