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
//! The mechanism parts stay public for an application that routes on its own terms:
//! [`crate::residents::Route`] (register, mail, dismiss, stop), [`crate::residents::Resident`]
//! and its [`crate::residents::Mailbox`], [`crate::residents::Deliver`]. A route can host
//! residents without any Lua program at all (`Route::new(core, LuaBridge::detached())`).

use std::path::Path;
use std::sync::Arc;

use tokio::sync::mpsc;

use crate::config::Config;
use crate::core::Core;
use crate::lua::{HostSetup, Running, ScriptError};
use crate::providers::Providers;
use crate::providers::replay::{Cassette, Recorder};
use crate::residents::{Delivery, Mail, MailError, Route};
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
    /// doing its waiting on `handle` (a multi-thread runtime).
    pub fn from_config(handle: tokio::runtime::Handle) -> Result<Runtime, EmbedError> {
        let config = Config::load().map_err(|e| EmbedError::Config(e.to_string()))?;
        Ok(Runtime::with_config(config, handle))
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

    /// Starts the program at `path` (with `args` as its `arg`) on its own Lua thread.
    pub fn load(&self, path: impl AsRef<Path>, args: Vec<String>) -> Result<Program, EmbedError> {
        let (tx, rx) = mpsc::unbounded_channel();
        let host = HostSetup {
            tools: self.tools.clone(),
            deliveries: Some(tx),
            store: self.store.clone(),
            // The application mails in: the program's watch runs until it is stopped.
            mails_in: true,
            observer: None,
        };
        let running = crate::lua::start_file(self.core.clone(), path.as_ref(), args, host)?;
        Ok(Program {
            running: Some(running),
            deliveries: rx,
        })
    }
}

/// A running program.
pub struct Program {
    running: Option<Running>,
    deliveries: mpsc::UnboundedReceiver<Delivery>,
}

impl Program {
    /// The program's route.
    pub fn route(&self) -> &Route {
        &self.running.as_ref().expect("the program is running").route
    }

    /// Waits until the program's `ai.watch` is up (mail before that answers `no_recipient`).
    pub async fn opened(&self) {
        self.route().opened().await
    }

    /// Posts `mail` to a resident.
    pub fn mail(&self, mail: Mail) -> Result<(), MailError> {
        self.route().mail(mail)
    }

    /// The next reply or notice a resident handed to `deliver_to = "host"`; `None` once the
    /// program has ended and every delivery was read.
    pub async fn delivery(&mut self) -> Option<Delivery> {
        self.deliveries.recv().await
    }

    /// Asks the program to stop, as `ai.stop(reason)` does: its `ai.watch` returns `reason`.
    pub fn stop(&self, reason: &str) {
        self.route().stop(reason);
    }

    /// Waits for the script to end.
    pub async fn join(mut self) -> Result<(), EmbedError> {
        let running = self.running.take().expect("joined once");
        tokio::task::spawn_blocking(move || running.join())
            .await
            .map_err(|e| EmbedError::Script(ScriptError(format!("the Lua thread panicked: {e}"))))?
            .map_err(EmbedError::Script)
    }
}
