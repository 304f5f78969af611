//! The one place the service touches how a program is started and driven: the program itself
//! ([`crate::embed::Runtime::load_with`], the same [`Lifecycle`] `colony run` and an embedding
//! application drive) and its state directory's lock. Everything else in `serve` speaks of a
//! [`Hosted`] program and the plain values it answers.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::embed::{Lend, Program, Runtime};
use crate::infer::breaker::BreakerState;
use crate::permissions::Permissions;
use crate::residents::{Delivery, Lifecycle, Mail, MailError, Observer, ResidentInfo};
use crate::store::select::ProgramStore;
use crate::vocab::{FileRef, Message};

/// What the service needs to start a program.
#[derive(Debug, Clone)]
pub struct Launch {
    pub file: PathBuf,
    pub args: Vec<String>,
    /// Its state directory (locked while it runs).
    pub state: PathBuf,
    /// What it may reach beyond colony's own calls (`colony serve` grants nothing unless told).
    pub permissions: Arc<Permissions>,
    /// A PostgreSQL store's URL, used instead of the state directory (`--store`, `[store] url`).
    pub store: Option<String>,
    /// The most Lua memory it may hold (`--max-memory`); `None`: the default.
    pub max_memory: Option<usize>,
    /// The cluster it joins (`--cluster`); needs a PostgreSQL store.
    pub cluster: Option<crate::cluster::ClusterOptions>,
}

/// Why a program did not start, and whether starting it again later may work: its store or
/// its cluster could not be reached or was held (a machine booted before its database, a node
/// by its name still stopping), as opposed to its file, which a new attempt reads the same.
#[derive(Debug, Clone)]
pub struct Unstarted {
    pub message: String,
    pub again: bool,
}

impl std::fmt::Display for Unstarted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// A program running on its own Lua thread, with its state directory held.
pub struct Hosted {
    lifecycle: Lifecycle,
    /// What it offers over MCP (`/mcp`).
    exports: crate::mcp::server::Exports,
    program: Mutex<Option<Program>>,
    state: Mutex<Option<ProgramStore>>,
}

/// Starts `launch` on `runtime`: what it observes goes to `observer`, what its residents hand
/// to `deliver_to = "host"` to `deliveries`. Its watch runs until it is stopped (the service
/// mails in). `Err`: the state directory is locked or damaged, or the file cannot be read.
pub fn start(
    runtime: &Runtime,
    launch: &Launch,
    observer: Observer,
    deliveries: mpsc::UnboundedSender<Delivery>,
) -> Result<Hosted, Unstarted> {
    let state =
        ProgramStore::open(&launch.state, launch.store.as_deref(), &launch.file).map_err(|e| {
            Unstarted {
                again: matches!(
                    e,
                    crate::store::StoreError::Io(_) | crate::store::StoreError::Locked(_)
                ),
                message: e.to_string(),
            }
        })?;
    let cluster = match (&launch.cluster, &state) {
        (None, _) => None,
        (Some(options), ProgramStore::Postgres(pg)) => Some(
            crate::cluster::Cluster::join(
                options,
                pg.clone(),
                &crate::store::postgres::schema_for(&launch.file),
                runtime.core().handle(),
            )
            .map_err(|e| Unstarted {
                again: e.again,
                message: e.message,
            })?,
        ),
        (Some(_), ProgramStore::Dir(_)) => {
            return Err(Unstarted {
                message: "--cluster needs a store every node shares: --store postgres://... (or \
                          [store] url in the config)"
                    .into(),
                again: false,
            });
        }
    };
    let exports = crate::mcp::server::Exports::default();
    let lend = Lend {
        store: Some(match &cluster {
            Some(c) => c.store(),
            None => state.dyn_store(),
        }),
        placement: cluster.as_ref().map(|c| c.placement()),
        observer: Some(observer),
        deliveries: Some(deliveries),
        permissions: Some(launch.permissions.clone()),
        exports: Some(exports.clone()),
        linger: true,
        max_memory: launch.max_memory,
        // A second SIGINT or SIGTERM ends every program where it waits.
        signals: true,
    };
    let program = runtime
        .load_with(&launch.file, launch.args.clone(), lend)
        .map_err(|e| Unstarted {
            message: e.to_string(),
            again: false,
        })?;
    Ok(Hosted {
        lifecycle: program.lifecycle().clone(),
        exports,
        program: Mutex::new(Some(program)),
        state: Mutex::new(Some(state)),
    })
}

impl Hosted {
    /// What it offers over MCP as `program`, and the route its calls run on.
    pub fn offer(&self, program: &str) -> crate::mcp::server::Offer {
        crate::mcp::server::Offer {
            program: program.to_string(),
            exports: self.exports.clone(),
            route: self.lifecycle.route().clone(),
        }
    }

    /// Waits until the program's watch is up (or it stops before).
    pub async fn opened(&self) {
        self.lifecycle.opened().await
    }

    pub fn is_open(&self) -> bool {
        self.lifecycle.route().is_open() && !self.lifecycle.stopping()
    }

    /// The reason it was stopped, once it was.
    pub fn stop_reason(&self) -> Option<String> {
        self.lifecycle.stop_reason()
    }

    /// Its residents, in name order (then those waiting for the watch).
    pub fn residents(&self) -> Vec<ResidentInfo> {
        self.lifecycle.residents()
    }

    /// The breaker `name`'s model calls go through, where it stands (`None`: it has none, or
    /// it has not been used yet).
    pub fn breaker(&self, name: &str) -> Option<BreakerState> {
        self.lifecycle.route().breaker_of(name)
    }

    pub fn resident(&self, name: &str) -> Option<ResidentInfo> {
        self.lifecycle.resident(name)
    }

    /// Whether mail to `name` can be posted (it runs here, or on another node of the cluster).
    pub fn knows(&self, name: &str) -> bool {
        self.lifecycle.knows(name)
    }

    /// Whether `name` keeps its conversation in the state directory (mail to it is durable
    /// once accepted). A resident placed on another node keeps it.
    pub fn persists(&self, name: &str) -> Option<bool> {
        match self.lifecycle.route().resident(name) {
            Some(r) => Some(r.spec.persist),
            None => self.lifecycle.knows(name).then_some(true),
        }
    }

    /// `name`'s mailbox capacity.
    pub fn capacity(&self, name: &str) -> Option<usize> {
        self.lifecycle
            .route()
            .resident(name)
            .map(|r| r.mailbox.capacity())
    }

    /// A copy of `name`'s committed conversation.
    pub fn conversation(&self, name: &str) -> Option<Vec<Message>> {
        self.lifecycle
            .route()
            .resident(name)
            .map(|r| r.conversation())
    }

    /// Records an attached file in the program's library (so `view_file` finds it).
    pub fn record_file(&self, name: &str, content_type: Option<&str>, bytes: Vec<u8>) -> FileRef {
        self.lifecycle
            .route()
            .core()
            .files()
            .record(name, content_type, bytes)
    }

    /// Posts `mail`; for a resident that keeps its conversation, `Ok` once it is saved.
    /// [`crate::residents::Route::mail_once`].
    pub fn mail_once(&self, mail: Mail) -> Result<crate::residents::Delivered, MailError> {
        self.lifecycle.mail_once(mail)
    }

    /// Names the program in the lines its stop logs (a host of several).
    pub fn name_in_logs(&self, name: &str) {
        self.lifecycle.route().set_label(name);
    }

    /// Whether the program is stopping (a restart, a reload, a stop): its residents take no
    /// new mail until it runs again.
    pub fn stopping(&self) -> bool {
        self.lifecycle.stopping()
    }

    /// [`Hosted::stopping`], asked later without holding the program (one gone is stopping).
    pub fn stopping_probe(&self) -> impl Fn() -> bool + Send + Sync + 'static {
        let program = self.lifecycle.downgrade();
        move || program.upgrade().is_none_or(|l| l.stopping())
    }

    /// `None`: no such resident; `Some(false)`: it was not blocked.
    pub fn unblock(&self, name: &str) -> Option<bool> {
        self.lifecycle.unblock(name)
    }

    /// Lets every blocked resident try again (the settings may have changed); answers how many.
    pub fn unblock_all(&self) -> usize {
        self.lifecycle
            .residents()
            .iter()
            .filter(|r| r.error.is_some())
            .filter(|r| self.lifecycle.unblock(&r.name) == Some(true))
            .count()
    }

    pub fn dismiss(&self, name: &str) -> bool {
        self.lifecycle.dismiss(name)
    }

    /// Asks the program to stop: its watch returns `reason`, turns in flight get its grace, and
    /// a script still running [`AFTER_STOP`](crate::residents::lifecycle::AFTER_STOP) after
    /// that is ended where it stands ([`Lifecycle::stop_for_host`]).
    pub fn stop(&self, reason: &str) {
        self.lifecycle.stop_for_host(reason)
    }

    /// Ends the program now, where it waits (the operator's second signal): turns in flight
    /// are cut short and the script is ended where it stands.
    pub fn end_now(&self, reason: &str) {
        let route = self.lifecycle.route();
        route.cut_short();
        route.abandon(reason);
    }

    /// Whether its script still runs.
    pub fn script_running(&self) -> bool {
        !self.lifecycle.script_end().has_ended()
    }

    /// The grace its watch gives turns in flight after a stop.
    pub fn grace(&self) -> Duration {
        self.lifecycle.grace()
    }

    /// Waits for the script to end, then releases the state directory. `Err`: what it raised.
    pub async fn ended(self: Arc<Self>) -> Result<(), String> {
        let program = self
            .program
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let result = match program {
            Some(program) => program.join().await.map_err(|e| e.to_string()),
            None => Ok(()),
        };
        self.state.lock().unwrap_or_else(|e| e.into_inner()).take();
        result
    }
}
