//! `colony serve FILE.lua [FILE.lua ...]`: run programs as a service, on one HTTP listener
//! (the control API, events, metrics and the dashboard; see `crate::serve`).
//!
//! The address it listens on is printed on stdout once it does (`colony serve: listening on
//! http://ADDR`). SIGTERM or Ctrl-C drains (no new mail, turns in flight get their grace, exit
//! 0); SIGHUP reads the config again (blocked residents try again) and restarts programs whose
//! file changed.

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::signal::unix::{SignalKind, signal};

use super::{Cassettes, Failure, build_core};
use crate::serve::auth::read_tokens;
use crate::serve::{self, Guard, Launch, Programs, Service};
use crate::store::state_dir;

/// Run programs as a service with an HTTP control API, metrics and a dashboard.
///
/// With no FILE, the programs are the config's `[[serve.programs]]` (each with `file`, `args`,
/// `state` and what it may reach: `allow_net`, `allow_read`, `allow_write`, `allow_run`,
/// `allow_env`, `allow_all`); SIGHUP starts those added and stops those removed. A program
/// reaches nothing beyond model providers and configured MCP servers unless allowed (the
/// --allow-* flags below, for the FILEs given). The token (`--token-file`, else COLONY_SERVE_TOKEN, else `[serve] token_file`)
/// is asked of every request but /healthz, /readyz and the dashboard page at / (which asks for it); it is required off loopback. A token file
/// may name several tokens, one a line as `NAME: TOKEN`; a caller is known by its token's name
/// (`token` for a single unnamed one) in the audit log and in `[rate.callers]`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    cassettes: Cassettes,
    /// The address to listen on (default `[serve] listen`, else 127.0.0.1:7878; port 0 picks one).
    #[arg(long, value_name = "ADDR")]
    listen: Option<String>,
    /// A file holding the bearer token (its first line), or several, one a line as `NAME: TOKEN`:
    /// NAME is the caller in the audit log (`mcp:NAME`) and in `[rate.callers]`.
    #[arg(long, value_name = "FILE")]
    token_file: Option<PathBuf>,
    /// How log lines on stderr are written: `text`, or `json` (one object a line, for journald
    /// or Loki).
    #[arg(long, value_enum, default_value = "text")]
    pub log_format: LogFormat,
    /// What the FILEs given may reach (`colony serve` grants nothing else), and the most Lua
    /// memory each may hold.
    #[command(flatten)]
    sandbox: super::permissions::SandboxArgs,
    /// Keep the programs' state in this PostgreSQL database (`postgres://USER@HOST/DB`, each
    /// program in a schema of its own) instead of their state directories (default: `[store]
    /// url` in the config).
    #[arg(long, value_name = "URL")]
    store: Option<String>,
    /// Join a cluster of nodes that share the programs (the same files on every node): each
    /// resident that keeps its conversation runs on one node at a time, placed by leases in the
    /// `--store` PostgreSQL database, and mail reaches it over this NATS server
    /// (`nats://HOST:4222`, JetStream enabled: `nats-server -js`).
    #[arg(long, value_name = "URL")]
    cluster: Option<String>,
    /// This node's name in the cluster, unique in it (default: the host's name and the
    /// process id). A node started with a running node's name is refused, its start tried
    /// again later; one restarted after it died starts once the old heartbeat has expired.
    #[arg(long, value_name = "NAME", requires = "cluster")]
    node: Option<String>,
    /// How long a node's leases last unless renewed: a node that dies is taken over this long
    /// after its last heartbeat (e.g. `10s`, the default; from 300ms to 10m).
    #[arg(long, value_name = "DURATION", requires = "cluster")]
    lease: Option<String>,
    /// The programs to run (each with its own Lua VM and state directory).
    files: Vec<PathBuf>,
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

pub fn run(args: Args, handle: &tokio::runtime::Handle) -> Result<(), Failure> {
    let core = build_core(&args.cassettes, handle)?;
    let config = core.config();
    let settings = config.serve.clone().unwrap_or_default();
    let listen = args
        .listen
        .clone()
        .or(settings.listen.clone())
        .unwrap_or_else(|| serve::DEFAULT_LISTEN.to_string());
    let addr: SocketAddr = listen.parse().map_err(|_| {
        Failure::input(format!(
            "colony serve: --listen {listen:?} is not an address (IP:PORT, e.g. 127.0.0.1:7878)"
        ))
    })?;
    serve::protected_resource::check(&settings).map_err(|e| {
        Failure::input(format!(
            "colony serve: {}: {e}",
            crate::config::path().display()
        ))
    })?;
    let tokens = tokens(args.token_file.as_deref(), settings.token_file.as_deref())?;
    if tokens.is_empty() && !addr.ip().is_loopback() {
        return Err(Failure::input(format!(
            "colony serve: {addr} is not a loopback address: set a token (--token-file FILE or \
             COLONY_SERVE_TOKEN) before listening on it"
        )));
    }
    // A store URL of another kind is refused here, as a --cluster URL is: it was found only as
    // the program started, which then failed while the process served on.
    if let Some(url) = args.store.as_deref().filter(|u| !u.trim().is_empty())
        && !crate::store::postgres::is_postgres(url)
    {
        return Err(Failure::input(format!(
            "colony serve: --store {}",
            crate::store::postgres::not_postgres(url)
        )));
    }
    let cluster = cluster(&args)?;
    if cluster.is_some() && crate::store::select::url(args.store.as_deref(), &config).is_none() {
        return Err(Failure::input(
            "colony serve: --cluster needs a store every node shares: --store postgres://... \
             (or [store] url in the config)",
        ));
    }
    let programs = programs(&args, &settings, &config, cluster.as_ref())?;
    let service = Service::new(core, programs, args.store.clone(), cluster).map_err(|e| {
        Failure::input(format!(
            "colony serve: {}: {e}",
            crate::config::path().display()
        ))
    })?;
    let guard = Guard::named(tokens);
    let tokens = Reread {
        guard: guard.clone(),
        flag: args.token_file.clone(),
        listen: args.listen.is_none().then(|| settings.listen.clone()),
    };
    handle.block_on(serve_until_drained(service, tokens, addr))
}

/// The tokens, if any are set (one, or several with names: [`read_tokens`]); an unreadable or
/// empty token file is an error, not "no token".
fn tokens(
    flag: Option<&Path>,
    configured: Option<&Path>,
) -> Result<Vec<(String, String)>, Failure> {
    // A configured file is relative to the config file's folder, as the programs are (under
    // systemd the working directory is `/`), and named as the config's when it fails.
    let config_file = crate::config::path();
    let configured = configured.map(|p| {
        let base = config_file.parent().unwrap_or(Path::new(""));
        (
            base.join(p),
            format!(" ([serve] token_file in {})", config_file.display()),
        )
    });
    let file = match flag {
        Some(p) => Some((p.to_path_buf(), String::new())),
        None if std::env::var_os("COLONY_SERVE_TOKEN").is_some() => None,
        None => configured,
    };
    let (text, from) = match file {
        Some((path, whence)) => (
            std::fs::read_to_string(&path).map_err(|e| {
                Failure::input(format!(
                    "colony serve: cannot read the token file {}{whence}: {e}",
                    path.display()
                ))
            })?,
            format!("the token file {}{whence}", path.display()),
        ),
        None => match std::env::var("COLONY_SERVE_TOKEN") {
            Ok(t) => (t, "COLONY_SERVE_TOKEN".to_string()),
            Err(_) => return Ok(Vec::new()),
        },
    };
    read_tokens(&text).map_err(|e| Failure::input(format!("colony serve: {from}: {e}")))
}

/// How this node joins a cluster (`--cluster`), if it does.
fn cluster(args: &Args) -> Result<Option<crate::cluster::ClusterOptions>, Failure> {
    let Some(nats) = &args.cluster else {
        return Ok(None);
    };
    if !nats.starts_with("nats://") && !nats.starts_with("tls://") {
        return Err(Failure::input(format!(
            "colony serve: --cluster {:?} is not a NATS server's URL (say nats://HOST:4222)",
            crate::cluster::bus::shown(nats)
        )));
    }
    // Refused here, as every other mistake on the line is: it was found only as the program
    // started, which then failed while the process served on.
    if let Some(node) = &args.node
        && (node.trim().is_empty() || node.contains('\0'))
    {
        return Err(Failure::input(format!(
            "colony serve: --node {node:?} is not a node name (say --node a)"
        )));
    }
    // At most ten minutes ([`crate::cluster::MAX_LEASE`]): `--lease 300d` held a dead node's
    // name, and its residents' placement, for 300 days.
    let lease = match &args.lease {
        None => crate::cluster::DEFAULT_LEASE,
        Some(text) => crate::duration::parse(text)
            .ok()
            .filter(|d| (crate::cluster::MIN_LEASE..=crate::cluster::MAX_LEASE).contains(d))
            .ok_or_else(|| {
                Failure::input(format!(
                    "colony serve: --lease {text:?} is not a duration from 300ms to 10m (say \
                     10s): a node that dies leaves its residents unserved that long"
                ))
            })?,
    };
    Ok(Some(crate::cluster::ClusterOptions {
        nats: nats.clone(),
        node: args
            .node
            .clone()
            .unwrap_or_else(crate::cluster::ClusterOptions::default_node),
        lease,
    }))
}

/// The programs: the files given, else the config's.
fn programs(
    args: &Args,
    settings: &crate::config::ServeConfig,
    config: &crate::config::Config,
    cluster: Option<&crate::cluster::ClusterOptions>,
) -> Result<Programs, Failure> {
    let config_file = crate::config::path();
    let (programs, launches) = if args.files.is_empty() {
        if args.sandbox.given() || args.sandbox.max_memory().is_some() {
            // They were ignored, and a refusal then named the very flag given.
            return Err(Failure::input(format!(
                "colony serve: --allow-*, --sandbox and --max-memory apply to the FILEs named on \
                 the command line; the programs of {} take theirs from their [[serve.programs]] \
                 entry (allow_read = true, allow_net = [\"api.example.com\"], ...) and run \
                 with the default memory limit",
                config_file.display()
            )));
        }
        // Relative to the config file's folder, where they were written.
        let base = config_file
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        let launches = serve::programs::from_config(settings, &base)
            .map_err(|e| Failure::input(format!("colony serve: {}: {e}", config_file.display())))?;
        (Programs::Config(base), launches)
    } else {
        let cwd = std::env::current_dir().unwrap_or_default();
        let permissions = Arc::new(args.sandbox.granted(&cwd));
        let launches: Vec<Launch> = args
            .files
            .iter()
            .map(|file| Launch {
                file: file.clone(),
                args: Vec::new(),
                state: state_dir::default_for(file),
                permissions: permissions.clone(),
                store: crate::store::select::url(args.store.as_deref(), config),
                max_memory: args.sandbox.max_memory(),
                cluster: cluster.cloned(),
            })
            .collect();
        if let Some((_, second)) = serve::programs::sharing_a_state(&launches) {
            return Err(Failure::input(format!(
                "colony serve: {} is named twice (each run of a program keeps a state directory \
                 of its own: list it in [[serve.programs]] with a `state` for each)",
                launches[second].file.display()
            )));
        }
        (Programs::Files(launches.clone()), launches)
    };
    if launches.is_empty() {
        return Err(Failure::input(
            "colony serve: no programs: name FILE.lua, or list [[serve.programs]] in the config",
        ));
    }
    // Files named on the command line are checked before anything starts (a mistyped name ends
    // it at once). A config's entry whose file is missing fails that program alone, shown as
    // failed, as it does when a reload adds it: it kept every other program from starting
    // (under systemd's Restart=on-failure, a loop with nothing served).
    if let Programs::Files(_) = &programs {
        for l in &launches {
            super::program_file(&l.file, &["serve"])?;
        }
    }
    Ok(programs)
}

/// Where the tokens were read from, to read them again at SIGHUP: a revoked token stops
/// working without a restart, as `systemctl reload` promises.
struct Reread {
    guard: Guard,
    flag: Option<PathBuf>,
    /// `[serve] listen` as it was at the start, when `--listen` did not override it.
    listen: Option<Option<String>>,
}

impl Reread {
    /// Reads the tokens again (the config already read again: its `[serve] token_file` may
    /// have changed). A file that cannot be read or used leaves the tokens as they were, and
    /// says so.
    fn tokens(&self, config: &crate::config::Config) -> Result<(), Failure> {
        let settings = config.serve.clone().unwrap_or_default();
        let new = tokens(self.flag.as_deref(), settings.token_file.as_deref())?;
        let names = self.guard.replace(new).map_err(Failure::input)?;
        if !names.is_empty() {
            tracing::info!("tokens read again: {} admitted", names.join(", "));
        }
        Ok(())
    }

    /// Says when `[serve] listen` changed: the listener is bound once, and an edit that SIGHUP
    /// seemed to take went unapplied without a word.
    fn listen(&self, config: &crate::config::Config, listening: SocketAddr) {
        let Some(was) = &self.listen else { return };
        let now = config.serve.as_ref().and_then(|s| s.listen.clone());
        if &now != was {
            tracing::warn!(
                "[serve] listen is now {}: the service still listens on {listening} until \
                 colony serve is restarted",
                now.as_deref().unwrap_or("unset")
            );
        }
    }
}

async fn serve_until_drained(
    service: Arc<Service>,
    tokens: Reread,
    addr: SocketAddr,
) -> Result<(), Failure> {
    let signals = (|| {
        Ok::<_, std::io::Error>((
            signal(SignalKind::terminate())?,
            crate::signals::sigint()?,
            signal(SignalKind::hangup())?,
        ))
    })()
    .map_err(|e| Failure::run(format!("colony serve: cannot listen for signals: {e}")))?;
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| Failure::run(format!("colony serve: cannot listen on {addr}: {e}")))?;
    let local = listener
        .local_addr()
        .map_err(|e| Failure::run(format!("colony serve: {e}")))?;
    {
        let s = service.clone();
        let _ = tokio::task::spawn_blocking(move || s.start_all()).await;
    }
    {
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "colony serve: listening on http://{local}");
        let _ = out.flush();
    }
    tracing::info!(%local, "listening");
    // Drained: with the signal that ended the programs where they waited, if one did.
    let (drained_tx, drained_rx) = tokio::sync::oneshot::channel::<Option<&'static str>>();
    let app = serve::router(service.clone(), tokens.guard.clone());
    tokio::spawn(on_signals(service, tokens, local, signals, drained_tx));
    let (closing_tx, closing) = tokio::sync::watch::channel(None);
    let server = serve::conn::serve(listener, app, async move {
        let _ = closing_tx.send(Some(drained_rx.await.ok().flatten()));
    });
    // Once drained, requests in flight get a moment to be answered; a client that holds its
    // connection open past it does not keep the process up.
    let mut drained = closing.clone();
    let cut_off = async move {
        let _ = drained.wait_for(Option::is_some).await;
        tokio::time::sleep(CLOSE_GRACE).await;
    };
    tokio::select! {
        () = server => {}
        _ = cut_off => tracing::warn!("connections still open after the drain were closed"),
    }
    // Programs ended where they waited (turns cut, not finished) are not a clean drain: the
    // status says so, as the signal's own action would (it exited 0).
    let forced: Option<&'static str> = closing.borrow().flatten();
    match forced {
        Some(signal) => Err(Failure {
            message: format!(
                "colony serve: the programs were ended at {signal}, where they waited"
            ),
            code: super::run::signal_status(signal),
        }),
        None => Ok(()),
    }
}

/// How long open connections may take to finish once the programs have drained.
const CLOSE_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

type Signals = (
    tokio::signal::unix::Signal,
    crate::signals::Sigint,
    tokio::signal::unix::Signal,
);

/// SIGHUP reloads; SIGTERM or SIGINT drains, and then the listener closes. Another signal
/// during the drain ends every program now, where it waits; a third, or a drain that outlasts
/// what a stop allows (a script blocked outside Lua, in `io.read()` say, which nothing
/// reaches), ends the process.
async fn on_signals(
    service: Arc<Service>,
    tokens: Reread,
    listening: SocketAddr,
    (mut term, mut int, mut hup): Signals,
    drained: tokio::sync::oneshot::Sender<Option<&'static str>>,
) {
    let reason = loop {
        tokio::select! {
            _ = term.recv() => break "SIGTERM",
            _ = int.recv() => break "SIGINT",
            _ = hup.recv() => {
                service.core().reload_config();
                // Before the programs, whose restarts may wait out a grace: a revoked token
                // stops working at once.
                let config = service.core().config();
                if let Err(e) = tokens.tokens(&config) {
                    let why = e.message.trim_start_matches("colony serve: ");
                    tracing::error!("the tokens stay as they were: {why}");
                }
                tokens.listen(&config, listening);
                let done = service.reload_programs().await;
                // Beside "listening on": stdout is the service's own account of itself.
                let mut out = std::io::stdout().lock();
                let _ = writeln!(out, "colony serve: SIGHUP: reloaded: {done}");
                let _ = out.flush();
            }
        }
    };
    let patience = service.drain_patience() + LAST_RESORT;
    tracing::warn!("{reason}: draining");
    tracing::warn!(
        "programs get their grace to finish (all ended within {:.0} s); SIGINT or SIGTERM \
         again ends them now",
        patience.as_secs_f64()
    );
    let drain = service.drain(reason);
    tokio::pin!(drain);
    let deadline = tokio::time::sleep(patience);
    tokio::pin!(deadline);
    let mut ended_now: Option<&'static str> = None;
    loop {
        let again = tokio::select! {
            () = &mut drain => break,
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
            () = &mut deadline => {
                // A program whose script has ended is closing its store: it gets the time.
                if service.scripts_running().is_empty() {
                    deadline.as_mut().reset(tokio::time::Instant::now() + LAST_RESORT);
                    continue;
                }
                end_process(&service, &match ended_now {
                    Some(signal) => format!("programs ended at {signal} did not end"),
                    None => "the drain outlasted its grace".to_string(),
                })
            }
        };
        if ended_now.is_some() {
            end_process(&service, &format!("{again} a third time"));
        }
        tracing::warn!("{again} again: ending every program now, where it waits");
        service.end_now(again);
        ended_now = Some(again);
        deadline
            .as_mut()
            .reset(tokio::time::Instant::now() + LAST_RESORT);
    }
    tracing::info!("drained");
    let _ = drained.send(ended_now);
}

/// How long a program ended where it waits may take to end before the process is ended.
const LAST_RESORT: std::time::Duration = std::time::Duration::from_secs(2);

/// Ends the process while programs still run (blocked outside Lua, where nothing reaches
/// them): their stores are left as after a crash and recovered at the next start.
fn end_process(service: &Service, why: &str) -> ! {
    let running = service.scripts_running();
    super::say_failure(&format!(
        "colony serve: {why}; still running: {} (blocked outside Lua?): ending the process",
        running.join(", ")
    ));
    crate::lua::proc::end_children();
    std::process::exit(1);
}
