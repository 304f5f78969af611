//! Embedding colony in a Rust application.
//!
//! A [`Runtime`] holds the core (configuration and providers) and the tools the application
//! writes in Rust; [`Runtime::load`] starts a Lua program on its own thread and returns a
//! [`Program`]: mail its residents, receive what they hand to `deliver_to = "host"`, stop it.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use colony::embed::Runtime;
//! use colony::residents::Mail;
//! use colony::turn::ToolDef;
//!
//! let mut runtime = Runtime::from_config(tokio::runtime::Handle::current())?;
//! runtime.register_tool(ToolDef::native(
//!     "stock.count",
//!     "How many of an item are in stock",
//!     serde_json::json!({ "item": "string" }),
//!     |args| async move { Ok(serde_json::json!({ "item": args["item"], "count": 12 })) },
//! )?);
//! let mut program = runtime.load("clerk.lua", vec![])?;   // spawns with deliver_to = "host"
//! program.opened().await;
//! program.mail(Mail::new("clerk", "shop", "How many apples?", 0))?;
//! let delivery = program.delivery().await.expect("a reply");
//! println!("{}: {}", delivery.ai, delivery.text);
//! program.stop("done");
//! program.join().await?;
//! # Ok(()) }
//! ```
//!
//! A [`Program`] is driven through its [`Lifecycle`], the same type `colony run` drives: list
//! its residents, mail, unblock, dismiss, hear its events, stop it with a reason (and a grace),
//! or [`Program::restart`] it from its file.
//!
//! A host of several programs (`colony serve` is one) lends each what it needs with
//! [`Runtime::load_with`] and a [`Lend`]: the program's own store, an [`Observer`] that hears
//! every turn, tool call, model call, breaker transition and route event, a channel of its own
//! for the deliveries (so they reach the host's task, not [`Program::delivery`]), and what the
//! program may reach ([`Permissions`]).
//!
//! The mechanism parts stay public for an application that routes on its own terms:
//! [`crate::residents::Route`] (register, mail, dismiss, stop), [`crate::residents::Resident`]
//! and its [`crate::residents::Mailbox`], [`crate::residents::Deliver`]. A route can host
//! residents without any script at all (`Route::new(core, colony::script::Detached)`).

use std::path::Path;
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::config::Config;
use crate::core::Core;
use crate::lua::{HostSetup, Running, ScriptError};
use crate::permissions::Permissions;
use crate::providers::Providers;
use crate::providers::replay::{Cassette, Recorder};
use crate::residents::{
    Delivered, Delivery, Lifecycle, Mail, MailError, Observer, ResidentInfo, Route, RouteEvent,
};
use crate::store::Store;
use crate::turn::ToolDef;

/// Why an embedded program could not be set up or ended badly.
#[derive(Debug, thiserror::Error)]
pub enum EmbedError {
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    Script(#[from] ScriptError),
    #[error("a tool named {0:?} is already registered")]
    DuplicateTool(String),
    #[error("{0}")]
    Tool(String),
}

impl From<String> for EmbedError {
    fn from(e: String) -> EmbedError {
        EmbedError::Tool(e)
    }
}

/// The core and the application's own tools, ready to load programs.
pub struct Runtime {
    core: Core,
    tools: Vec<ToolDef>,
    store: Option<Arc<dyn Store>>,
}

impl Runtime {
    /// A runtime around `core`.
    pub fn new(core: Core) -> Runtime {
        Runtime {
            core,
            tools: Vec::new(),
            store: None,
        }
    }

    /// A runtime configured as the `colony` command is (the config file, then the environment),
    /// doing its waiting on `handle` (a multi-thread runtime). As the command's, the file is
    /// read again when it changes on disk: a blocked resident tries again once it is fixed, a
    /// rotated key is taken up (it was read once, and a resident blocked on a key stayed so).
    pub fn from_config(handle: tokio::runtime::Handle) -> Result<Runtime, EmbedError> {
        Runtime::from_config_file(&crate::config::path(), handle)
    }

    /// [`Runtime::from_config`] with the config file at `path` (an application's own).
    pub fn from_config_file(
        path: &Path,
        handle: tokio::runtime::Handle,
    ) -> Result<Runtime, EmbedError> {
        let core = Core::from_config_file(path, Providers::new(None, None), handle)
            .map_err(|e| EmbedError::Config(e.to_string()))?;
        Ok(Runtime::new(core))
    }

    /// A runtime with settings built in code.
    pub fn with_config(config: Config, handle: tokio::runtime::Handle) -> Runtime {
        Runtime::new(Core::new(config, Providers::new(None, None), handle))
    }

    /// A runtime that answers every model call from a cassette (`colony run --replay`).
    pub fn replaying(
        cassette: &Path,
        handle: tokio::runtime::Handle,
    ) -> Result<Runtime, EmbedError> {
        let cassette = Cassette::load(cassette).map_err(|e| EmbedError::Config(e.to_string()))?;
        Ok(Runtime::new(Core::new(
            Config::default(),
            Providers::new(Some(Arc::new(cassette)), None),
            handle,
        )))
    }

    /// A runtime that calls models as configured and writes each exchange to a cassette.
    pub fn recording(
        config: Config,
        cassette: &Path,
        handle: tokio::runtime::Handle,
    ) -> Result<Runtime, EmbedError> {
        let recorder = Recorder::create(cassette).map_err(|e| EmbedError::Config(e.to_string()))?;
        Ok(Runtime::new(Core::new(
            config,
            Providers::new(None, Some(Arc::new(recorder))),
            handle,
        )))
    }

    pub fn core(&self) -> &Core {
        &self.core
    }

    /// Keeps the programs' state in `store` (for instance a state directory's:
    /// `StateDir::open(dir)?.dyn_store()`), so `store.*`, persisted conversations and breaker
    /// states survive a restart of the application. Without it, state lives in memory.
    pub fn set_store(&mut self, store: Arc<dyn Store>) {
        self.store = Some(store);
    }

    /// Offers `tool` to the programs this runtime loads: a `tools` list names it by string
    /// (`tools = { "stock.count", my_lua_tool }`), beside Lua tools.
    pub fn register_tool(&mut self, tool: ToolDef) -> Result<(), EmbedError> {
        if self.tools.iter().any(|t| t.spec.name == tool.spec.name) {
            return Err(EmbedError::DuplicateTool(tool.spec.name));
        }
        self.tools.push(tool);
        Ok(())
    }

    /// Whether the program at `path` reads and compiles (nothing of it runs): a host checks
    /// this before it replaces a run that works with a file just edited. `Err` is the message
    /// a run would give (`file:line: message`).
    pub fn compiles(path: impl AsRef<Path>) -> Result<(), String> {
        crate::lua::compiles(path.as_ref()).map_err(|e| e.0)
    }

    /// Starts the program at `path` (with `args` as its `arg`) on its own Lua thread.
    pub fn load(&self, path: impl AsRef<Path>, args: Vec<String>) -> Result<Program, EmbedError> {
        self.launch(path.as_ref(), args, self.store.clone())
    }

    /// [`Runtime::load`] with a store of the program's own (its state directory's, say:
    /// `StateDir::open(dir)?.dyn_store()`), for an application that hosts several programs.
    pub fn load_in(
        &self,
        path: impl AsRef<Path>,
        args: Vec<String>,
        store: Arc<dyn Store>,
    ) -> Result<Program, EmbedError> {
        self.load_with(
            path,
            args,
            Lend {
                store: Some(store),
                ..Lend::default()
            },
        )
    }

    /// [`Runtime::load`] with what `lend` lends the program: its store, an observer, a
    /// channel for its deliveries, its permissions. What `lend` leaves out is as `load` has it.
    pub fn load_with(
        &self,
        path: impl AsRef<Path>,
        args: Vec<String>,
        mut lend: Lend,
    ) -> Result<Program, EmbedError> {
        if lend.store.is_none() {
            lend.store = self.store.clone();
        }
        let launch = Launch {
            core: self.core.clone(),
            tools: self.tools.clone(),
            lend,
            path: path.as_ref().to_path_buf(),
            args,
        };
        launch.start()
    }

    fn launch(
        &self,
        path: &Path,
        args: Vec<String>,
        store: Option<Arc<dyn Store>>,
    ) -> Result<Program, EmbedError> {
        self.load_with(
            path,
            args,
            Lend {
                store,
                ..Lend::default()
            },
        )
    }
}

/// What a host lends a program it loads ([`Runtime::load_with`]). The default lends nothing
/// of its own: the runtime's store (else one in memory), no observer, deliveries read with
/// [`Program::delivery`], every permission (as `colony run FILE` grants).
#[derive(Clone, Default)]
pub struct Lend {
    /// The program's durable store (its state directory's, say).
    pub store: Option<Arc<dyn Store>>,
    /// Hears what the program's residents do (turns, tool calls as they end, model calls,
    /// breaker transitions, route events), lent before any resident is hired.
    pub observer: Option<Observer>,
    /// Where what the residents hand to `deliver_to = "host"` goes; `None`: to
    /// [`Program::delivery`].
    pub deliveries: Option<mpsc::UnboundedSender<Delivery>>,
    /// What the program may reach beyond colony's own calls; `None`: everything.
    pub permissions: Option<Arc<Permissions>>,
    /// Where the program puts what it offers as an MCP server, for a host that serves it.
    pub exports: Option<crate::mcp::server::Exports>,
    /// Keep the VM answering tool calls after the main chunk returns (a program that exports
    /// something over MCP), until the program is stopped.
    pub linger: bool,
    /// The most Lua memory the program may hold, in bytes; `None`: the default (1 GiB).
    pub max_memory: Option<usize>,
    /// Where its residents run when several nodes share it (`crate::cluster`); `None`: here.
    pub placement: Option<Arc<dyn crate::residents::Placement>>,
    /// The program hears SIGINT and SIGTERM, as `colony run`'s does: its watch returns the
    /// signal's name, and Lua code that spins is stopped. Off by default: the application's
    /// own handling keeps them (a signal a program listened for never again reached the
    /// process's default action, for the process's life).
    pub signals: bool,
}

/// What a program was started from, to start it again.
#[derive(Clone)]
struct Launch {
    core: Core,
    tools: Vec<ToolDef>,
    lend: Lend,
    path: std::path::PathBuf,
    args: Vec<String>,
}

impl Launch {
    fn start(&self) -> Result<Program, EmbedError> {
        // A file that does not read or compile is the load's error: it loaded `Ok`, and the
        // error came out of `join` alone, mail meanwhile refused as to an unknown name.
        crate::lua::compiles(&self.path).map_err(EmbedError::Script)?;
        let (deliveries, own) = match &self.lend.deliveries {
            Some(tx) => (tx.clone(), None),
            None => {
                let (tx, rx) = mpsc::unbounded_channel();
                (tx, Some(rx))
            }
        };
        let mut host = HostSetup {
            tools: self.tools.clone(),
            deliveries: Some(deliveries),
            store: self.lend.store.clone(),
            // The application mails in: the program's watch runs until it is stopped.
            mails_in: true,
            observer: self.lend.observer.clone(),
            exports: self.lend.exports.clone(),
            linger: self.lend.linger,
            placement: self.lend.placement.clone(),
            leaves_signals: !self.lend.signals,
            ..HostSetup::default()
        };
        if let Some(p) = &self.lend.permissions {
            host.permissions = p.clone();
        }
        host.max_memory = self.lend.max_memory;
        let running =
            crate::lua::start_file(self.core.clone(), &self.path, self.args.clone(), host)?;
        Ok(Program {
            running: Some(running),
            deliveries: own,
            launch: self.clone(),
        })
    }
}

/// A running program.
pub struct Program {
    running: Option<Running>,
    /// Its deliveries, unless the host lent a channel of its own.
    deliveries: Option<mpsc::UnboundedReceiver<Delivery>>,
    launch: Launch,
}

impl Program {
    /// The program's life: what `colony run` drives too.
    pub fn lifecycle(&self) -> &Lifecycle {
        &self
            .running
            .as_ref()
            .expect("the program is running")
            .lifecycle
    }

    /// The program's route.
    pub fn route(&self) -> &Route {
        self.lifecycle().route()
    }

    /// Waits until the program's `ai.watch` is up (mail before that answers `no_recipient`).
    pub async fn opened(&self) {
        self.lifecycle().opened().await
    }

    /// Posts `mail` to a resident: `Ok` once it is accepted (for a resident that keeps its
    /// conversation, once it is on disk).
    pub fn mail(&self, mail: Mail) -> Result<(), MailError> {
        self.lifecycle().mail(mail)
    }

    /// [`Program::mail`], saying whether the mail was new or a repeat of an id its recipient
    /// accepted before ([`Delivered::Repeated`]: acknowledged, and the first is the one served).
    pub fn mail_once(&self, mail: Mail) -> Result<Delivered, MailError> {
        self.lifecycle().mail_once(mail)
    }

    /// The residents and their state (those waiting for the watch as `pending`).
    pub fn residents(&self) -> Vec<ResidentInfo> {
        self.lifecycle().residents()
    }

    /// Lets the blocked resident `name` try again now (`None`: no such resident).
    pub fn unblock(&self, name: &str) -> Option<bool> {
        self.lifecycle().unblock(name)
    }

    /// Ends the resident `name`; answers whether there was one.
    pub fn dismiss(&self, name: &str) -> bool {
        self.lifecycle().dismiss(name)
    }

    /// The route's events from now on (crashes, failures, blocks, residents gone).
    pub fn events(&self) -> tokio::sync::broadcast::Receiver<RouteEvent> {
        self.lifecycle().subscribe()
    }

    /// The next reply or notice a resident handed to `deliver_to = "host"`; `None` once the
    /// program has ended and every delivery was read, and at once when the host lent a channel
    /// of its own for them ([`Lend::deliveries`]).
    pub async fn delivery(&mut self) -> Option<Delivery> {
        match &mut self.deliveries {
            Some(rx) => rx.recv().await,
            None => None,
        }
    }

    /// Asks the program to stop, as `ai.stop(reason)` does: its `ai.watch` returns `reason`.
    /// A script still running the watch's grace plus
    /// [`crate::residents::lifecycle::AFTER_STOP`] later (code after its watch that loops) is
    /// ended where it stands, so [`Program::join`] ends (it waited for ever).
    pub fn stop(&self, reason: &str) {
        self.lifecycle().stop_for_host(reason);
    }

    /// [`Program::stop`], giving turns in flight `grace` to finish.
    pub fn stop_within(&self, reason: &str, grace: std::time::Duration) {
        let lifecycle = self.lifecycle();
        lifecycle.route().set_grace(grace);
        lifecycle.stop_for_host(reason);
    }

    /// Waits for the script to end.
    pub async fn join(mut self) -> Result<(), EmbedError> {
        let running = self.running.take().expect("joined once");
        join(running).await
    }

    /// Stops the program with `reason`, waits for it to end, reads its file again and starts
    /// it anew (with the same arguments, tools and store). The old program's end, if it failed,
    /// is the error.
    pub async fn restart(mut self, reason: &str) -> Result<Program, EmbedError> {
        let running = self.running.take().expect("restarted once");
        // A script that runs on after its watch is ended in time (`AFTER_STOP`): the restart
        // does not wait for it forever.
        running.lifecycle.stop_for_host(reason);
        join(running).await?;
        self.launch.start()
    }
}

/// A program dropped while it runs is stopped, as [`Program::stop`] stops it: it ran on,
/// calling models, its threads outliving the application's use of it.
impl Drop for Program {
    fn drop(&mut self) {
        if let Some(running) = &self.running {
            running.lifecycle.stop_for_host("its Program was dropped");
        }
    }
}

async fn join(running: Running) -> Result<(), EmbedError> {
    tokio::task::spawn_blocking(move || running.join())
        .await
        .map_err(|e| EmbedError::Script(ScriptError(format!("the Lua thread panicked: {e}"))))?
        .map_err(EmbedError::Script)
}
