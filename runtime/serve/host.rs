//! The one place the service touches how a program is started and driven: its Lua thread
//! ([`crate::lua::start_file`] with a [`HostSetup`]), its [`Route`] and its state directory's
//! lock. Everything else in `serve` speaks of a [`Hosted`] program and the plain values it
//! answers, so pointing the service at another lifecycle type changes this file alone.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;

use crate::core::Core;
use crate::lua::{HostSetup, Running};
use crate::residents::{Delivery, Mail, MailError, Observer, ResidentInfo, Route};
use crate::store::state_dir::StateDir;
use crate::vocab::{FileRef, Message};

/// What the service needs to start a program.
#[derive(Debug, Clone)]
pub struct Launch {
    pub file: PathBuf,
    pub args: Vec<String>,
    /// Its state directory (locked while it runs).
    pub state: PathBuf,
}

/// A program running on its own Lua thread, with its state directory held.
pub struct Hosted {
    route: Route,
    /// What it offers over MCP (`/mcp`).
    exports: crate::mcp::server::Exports,
    running: Mutex<Option<Running>>,
    state: Mutex<Option<StateDir>>,
}

/// Starts `launch` with `core`: what it observes goes to `observer`, what its residents hand to
/// `deliver_to = "host"` to `deliveries`. Its watch runs until it is stopped (the service mails
/// in). `Err`: the state directory is locked or damaged, or the file cannot be read.
pub fn start(
    core: Core,
    launch: &Launch,
    observer: Observer,
    deliveries: mpsc::UnboundedSender<Delivery>,
) -> Result<Hosted, String> {
    let state = StateDir::open(&launch.state).map_err(|e| e.to_string())?;
    let exports = crate::mcp::server::Exports::default();
    let host = HostSetup {
        store: Some(state.dyn_store()),
        deliveries: Some(deliveries),
        mails_in: true,
        observer: Some(observer),
        exports: Some(exports.clone()),
        linger: true,
        ..HostSetup::default()
    };
    let running =
        crate::lua::start_file(core, &launch.file, launch.args.clone(), host).map_err(|e| e.0)?;
    Ok(Hosted {
        route: running.route().clone(),
        exports,
        running: Mutex::new(Some(running)),
        state: Mutex::new(Some(state)),
    })
}

impl Hosted {
    /// What it offers over MCP, and the route its calls run on.
    pub fn offer(&self) -> crate::mcp::server::Offer {
        crate::mcp::server::Offer {
            exports: self.exports.clone(),
            route: self.route.clone(),
        }
    }

    /// Waits until the program's watch is up (or it stops before).
    pub async fn opened(&self) {
        self.route.opened().await
    }

    pub fn is_open(&self) -> bool {
        self.route.is_open() && !self.route.stopping()
    }

    /// The reason it was stopped, once it was.
    pub fn stop_reason(&self) -> Option<String> {
        self.route.stop_reason()
    }

    /// Its residents, in name order.
    pub fn residents(&self) -> Vec<ResidentInfo> {
        self.route.residents()
    }

    pub fn resident(&self, name: &str) -> Option<ResidentInfo> {
        self.route.resident(name).map(|r| r.info())
    }

    /// Whether `name` keeps its conversation in the state directory (mail to it is durable
    /// once accepted).
    pub fn persists(&self, name: &str) -> Option<bool> {
        self.route.resident(name).map(|r| r.spec.persist)
    }

    /// `name`'s mailbox capacity.
    pub fn capacity(&self, name: &str) -> Option<usize> {
        self.route.resident(name).map(|r| r.mailbox.capacity())
    }

    /// A copy of `name`'s committed conversation.
    pub fn conversation(&self, name: &str) -> Option<Vec<Message>> {
        self.route.resident(name).map(|r| r.conversation())
    }

    /// Records an attached file in the program's library (so `view_file` finds it).
    pub fn record_file(&self, name: &str, content_type: Option<&str>, bytes: Vec<u8>) -> FileRef {
        self.route.core().files().record(name, content_type, bytes)
    }

    /// Posts `mail`; for a resident that keeps its conversation, `Ok` once it is saved.
    pub fn mail(&self, mail: Mail) -> Result<(), MailError> {
        self.route.mail(mail)
    }

    /// `None`: no such resident; `Some(false)`: it was not blocked.
    pub fn unblock(&self, name: &str) -> Option<bool> {
        self.route.unblock(name)
    }

    /// Lets every blocked resident try again (the settings may have changed); answers how many.
    pub fn unblock_all(&self) -> usize {
        self.route
            .residents()
            .iter()
            .filter(|r| r.error.is_some())
            .filter(|r| self.route.unblock(&r.name) == Some(true))
            .count()
    }

    pub fn dismiss(&self, name: &str) -> bool {
        self.route.dismiss(name)
    }

    /// Asks the program to stop: its watch returns `reason`, turns in flight get its grace.
    pub fn stop(&self, reason: &str) {
        self.route.stop(reason)
    }

    /// The grace its watch gives turns in flight after a stop.
    pub fn grace(&self) -> Duration {
        self.route.grace()
    }

    /// Waits for the script to end, then releases the state directory. `Err`: what it raised.
    pub async fn ended(self: Arc<Self>) -> Result<(), String> {
        let running = self
            .running
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let result = match running {
            Some(running) => tokio::task::spawn_blocking(move || running.join())
                .await
                .map_err(|e| format!("the Lua thread panicked: {e}"))
                .and_then(|r| r.map_err(|e| e.0)),
            None => Ok(()),
        };
        self.state.lock().unwrap_or_else(|e| e.into_inner()).take();
        result
    }
}
