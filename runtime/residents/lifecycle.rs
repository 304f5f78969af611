//! A running program's life, as the core keeps it: the one type `colony run`, an embedding
//! application ([`crate::embed`]) and a service hosting several programs all drive.
//!
//! A program's residents are hired before its watch runs ([`Lifecycle::spawn`]: they wait in a
//! list, and mail to them answers `no_recipient`); the watch ([`Lifecycle::watch`]) registers
//! them in order, opens the route, starts their sources, and runs until the program stops: on
//! [`Lifecycle::stop`] (the first reason given is the one kept), when every resident is gone,
//! when the program has settled (idle or blocked, [`Settled`]), or on SIGINT/SIGTERM. Then its
//! sources end, turns in flight get the grace, and the route's events still waiting are handed
//! on. The MCP servers the program opened for its whole life are shut down in order at its end
//! ([`Lifecycle::close_servers`]).
//!
//! A script's `ai.spawn`, `ai.watch`, `ai.stop`, `ai.mail`, `ai.dismiss` and `ai.residents` are
//! translations into this type; so is what a host does from outside (`Runtime::load` and its
//! [`crate::embed::Program`]). Sources are the script's functions, run through its
//! [`Script`] under their own restart policy, each named `<ai>/source/<n>`.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::broadcast;
use tokio::task::AbortHandle;

use super::mail::{Mail, MailError};
use super::resident::{ResidentInfo, ResidentSpec, State};
use super::route::{
    DEFAULT_GRACE, Listener, Route, RouteEvent, Settled, SpawnError, supervise_exit,
};
use super::supervision::{Decision, Exit, RestartPolicy, Supervisor};
use crate::mcp::Connection;
use crate::script::{FnId, Script};

/// How long a script may run on after a host's stop, beyond its watch's grace, before
/// [`Lifecycle::stop_for_host`] ends it where it stands.
pub const AFTER_STOP: Duration = Duration::from_secs(10);

/// The life of one program. `Send + Sync` and cheap to clone.
#[derive(Clone)]
pub struct Lifecycle {
    inner: Arc<Life>,
}

/// A program's life that does not keep it alive ([`Lifecycle::downgrade`]): for what may
/// outlive the run and wait on something else meanwhile, such as a thread watching stdout. A
/// `Lifecycle` holds the program's route and with it its store, which closes (copying its log
/// into the file, syncing what was written without waiting) only once nothing holds it.
#[derive(Clone)]
pub struct WeakLifecycle {
    inner: Weak<Life>,
}

impl WeakLifecycle {
    /// The program's life, while something else keeps the program alive.
    pub fn upgrade(&self) -> Option<Lifecycle> {
        self.inner.upgrade().map(|inner| Lifecycle { inner })
    }

    /// Ends the program for a host that will wait only so long (`--max-time`, a piped
    /// stdout's reader gone): stops it as a signal does ([`Lifecycle::interrupt`], the watch
    /// returning `stop`); while its watch runs, turns in flight get the grace and
    /// [`AFTER_INTERRUPT`] more; then, if its script still runs (code that waits, which the
    /// interrupt does not reach; a script before or after its watch, which nothing stopping
    /// reaches), ends it where it waits ([`Route::abandon`], told as ended by `end`), and
    /// answers how long it had waited for it to end after the stop. Holds the program only while
    /// it acts: one that ends meanwhile closes its store as it ends.
    pub async fn end(&self, stop: &str, end: &str) -> Option<Duration> {
        let live = self.upgrade()?;
        live.interrupt(stop);
        let patience = match live.watch_state() {
            Watch::Running => live.grace() + AFTER_INTERRUPT,
            Watch::NotYet | Watch::Ended => Duration::ZERO,
        };
        let busy = live.route().busy();
        if busy > 0 && !patience.is_zero() {
            tracing::warn!(
                "{}{stop}: stopping; {busy} turn(s) in flight get up to {:.1} s to finish \
                 (Ctrl-C or SIGTERM stops them now)",
                live.route().label(),
                live.grace().as_secs_f64()
            );
        }
        let ended = live.script_end();
        drop(live);
        self.abandon_unless_ended(ended, patience, || end.to_string())
            .await
            .then_some(patience)
    }

    /// Ends the program where it waits ([`Route::abandon`], told as ended by `why()`) unless
    /// its script ends within `patience`; answers whether it did. Holds the program only to
    /// end it.
    async fn abandon_unless_ended(
        &self,
        mut ended: ScriptEnd,
        patience: Duration,
        why: impl FnOnce() -> String,
    ) -> bool {
        if tokio::time::timeout(patience, ended.ended()).await.is_ok() {
            return false;
        }
        let Some(live) = self.upgrade() else {
            return false;
        };
        live.route().abandon(why());
        true
    }
}

/// The stop's reason when the script ended before anything else stopped the program.
pub const SCRIPT_ENDED: &str = "the program ended";

/// How long [`WeakLifecycle::end`] waits after the watch's grace before it ends a script where
/// it waits: the watch's own end (its sources, its hooks) takes a moment after the grace.
pub const AFTER_INTERRUPT: Duration = Duration::from_secs(1);

/// Whether a program's script has ended ([`Lifecycle::script_end`]); holds nothing of the
/// program, so waiting on it keeps no store open.
pub struct ScriptEnd(tokio::sync::watch::Receiver<bool>);

impl ScriptEnd {
    /// Whether the script has ended by now.
    pub fn has_ended(&self) -> bool {
        *self.0.borrow()
    }

    /// Waits until the script has ended (at once if it has).
    pub async fn ended(&mut self) {
        // An error is the program gone, which only its script's end lets happen.
        let _ = self.0.wait_for(|ended| *ended).await;
    }
}

struct Life {
    route: Route,
    state: Mutex<LifeState>,
    /// The route's events as the watch hands them on, for whoever subscribed.
    events: broadcast::Sender<RouteEvent>,
    /// The MCP servers opened for the program's life, held weakly: those still alive at its end
    /// are shut down in order (answers in flight awaited, stdin closed, then SIGTERM, then
    /// SIGKILL) instead of killed.
    servers: Mutex<Vec<Weak<Connection>>>,
    /// Held while an application mails in from outside: the program does not settle.
    _mails_in: Option<Listener>,
    /// Set once the script has ended ([`Lifecycle::script_ended`]).
    script_ended: tokio::sync::watch::Sender<bool>,
    /// What the program offers its host over MCP ([`Lifecycle::serve_exports`]), if it does.
    exports: std::sync::OnceLock<crate::mcp::server::Exports>,
    /// The audit lines past `[store] keep_audit` removed for as long as the program lives, a
    /// script without a watch's too ([`super::retention`]).
    pruning: Option<super::retention::Pruning>,
}

struct LifeState {
    watch: Watch,
    pending: Vec<Pending>,
    /// The names in `pending`, so a spawn checks for a taken name at once: a scan of the list
    /// made spawning n residents before the watch take time in n².
    pending_names: HashSet<String>,
    /// The running sources of each resident.
    sources: HashMap<String, Vec<AbortHandle>>,
    /// In a cluster, the residents placed (on one node at a time, [`super::placement`]), and
    /// whether each runs here now.
    placed: HashMap<String, Placed>,
    /// Children that failed for good (`<ai>` or `<ai>/source/<n>`, and why) when the watch had
    /// no `on_fail` of its own to tell: [`Lifecycle::unhandled_failures`].
    unhandled: Vec<(String, String)>,
}

/// A placed resident: what it is hired with, to hire it again each time it is claimed here.
struct Placed {
    pending: Pending,
    here: bool,
}

/// Where a program's watch is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Watch {
    /// Not up yet: residents hired now wait for it.
    NotYet,
    /// Up: residents hired now register at once.
    Running,
    /// Over: nobody more is hired.
    Ended,
}

/// A source: a function of the script run beside its resident (`self` is the resident's name),
/// restarted by its policy; while it runs, the program has not settled.
#[derive(Debug, Clone)]
pub struct Source {
    pub func: FnId,
    pub policy: RestartPolicy,
}

#[derive(Clone)]
struct Pending {
    spec: ResidentSpec,
    sources: Vec<Source>,
}

/// Why a resident could not be hired.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HireError {
    #[error("the watch has ended")]
    WatchEnded,
    #[error("an AI named {0:?} is already spawned")]
    Taken(String),
    #[error("{0}")]
    Spawn(#[from] SpawnError),
}

/// Why the watch could not run.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("the watch runs once per program")]
    Twice,
    #[error(
        "the route's events were taken by the host application: only one watcher can have them"
    )]
    EventsTaken,
    /// A resident hired before the watch could not be registered.
    #[error("{0}")]
    Hire(String, SpawnError),
    #[error("cannot listen for signals: {0}")]
    Signals(std::io::Error),
}

/// How the watch runs.
#[derive(Debug, Clone)]
pub struct WatchOptions {
    /// How long turns in flight may finish after the stop.
    pub grace: Duration,
    /// End the program when it has settled (every resident idle or blocked, nothing that could
    /// bring mail).
    pub until_idle: bool,
    /// Stop on SIGINT and SIGTERM.
    pub signals: bool,
    /// The watcher handles a child's failure itself (a script's `on_fail`): failures are not
    /// kept for [`Lifecycle::unhandled_failures`].
    pub handles_failures: bool,
}

impl Default for WatchOptions {
    fn default() -> WatchOptions {
        WatchOptions {
            grace: DEFAULT_GRACE,
            until_idle: true,
            signals: true,
            handles_failures: false,
        }
    }
}

/// The state of a resident placed on no node here: `elsewhere` on the node that runs it, or
/// `unplaced` while none does (it was `elsewhere` with no node, which said neither where nor
/// whether it ran).
fn placed_state(node: Option<&str>) -> State {
    match node {
        Some(_) => State::Elsewhere,
        None => State::Unplaced,
    }
}

impl Lifecycle {
    /// This life, held without keeping the program alive.
    pub fn downgrade(&self) -> WeakLifecycle {
        WeakLifecycle {
            inner: Arc::downgrade(&self.inner),
        }
    }

    /// The life of the program whose residents live on `route`. With `mails_in`, something
    /// outside (an application, a service) mails the residents: the program does not end when
    /// they are all idle.
    pub fn new(route: Route, mails_in: bool) -> Lifecycle {
        Lifecycle {
            inner: Arc::new(Life {
                pruning: super::retention::keep(&route),
                _mails_in: mails_in.then(|| route.listen()),
                route,
                state: Mutex::new(LifeState {
                    watch: Watch::NotYet,
                    pending: Vec::new(),
                    pending_names: HashSet::new(),
                    sources: HashMap::new(),
                    placed: HashMap::new(),
                    unhandled: Vec::new(),
                }),
                events: broadcast::channel(256).0,
                servers: Mutex::new(Vec::new()),
                script_ended: tokio::sync::watch::Sender::new(false),
                exports: std::sync::OnceLock::new(),
            }),
        }
    }

    /// Waits (a while at most) for the first removal of audit lines past their keep, begun
    /// with the program: a short program, or a short watch, has its log pruned all the same.
    /// At once when no keep is set.
    pub async fn first_prune(&self) {
        if let Some(pruning) = &self.inner.pruning {
            pruning.first_look(self.inner.route.core()).await;
        }
    }

    /// The route the residents live on (the mechanism under this type).
    pub fn route(&self) -> &Route {
        &self.inner.route
    }

    /// Where the watch is.
    pub fn watch_state(&self) -> Watch {
        self.state().watch
    }

    /// Hires a resident with its sources: at once while the watch runs, else on the list the
    /// watch registers.
    pub fn spawn(&self, spec: ResidentSpec, sources: Vec<Source>) -> Result<(), HireError> {
        let mut st = self.state();
        match st.watch {
            Watch::Running => {
                drop(st);
                self.admit(Pending { spec, sources })
            }
            Watch::Ended => Err(HireError::WatchEnded),
            Watch::NotYet => {
                if !st.pending_names.insert(spec.name.clone()) {
                    return Err(HireError::Taken(spec.name));
                }
                st.pending.push(Pending { spec, sources });
                Ok(())
            }
        }
    }

    /// The residents hired that wait for a watch that has not started, in name order.
    pub fn awaiting_watch(&self) -> Vec<String> {
        let st = self.state();
        if st.watch != Watch::NotYet {
            return Vec::new();
        }
        let mut names: Vec<String> = st.pending_names.iter().cloned().collect();
        names.sort();
        names
    }

    /// Whether any resident was hired (registered, waiting for the watch, or placed).
    pub fn has_residents(&self) -> bool {
        let st = self.state();
        !st.pending.is_empty() || !st.placed.is_empty() || !self.inner.route.is_empty()
    }

    /// The placed residents' names, each with whether it runs here now, in name order.
    pub fn placed(&self) -> Vec<(String, bool)> {
        let mut list: Vec<(String, bool)> = self
            .state()
            .placed
            .iter()
            .map(|(name, p)| (name.clone(), p.here))
            .collect();
        list.sort();
        list
    }

    /// Starts the placed resident `name` here (its lease is held): it resumes from its saved
    /// cell. `Ok(false)`: it is not placed, or already here.
    pub fn claim(&self, name: &str) -> Result<bool, SpawnError> {
        let pending = {
            let mut st = self.state();
            match st.placed.get_mut(name) {
                Some(p) if !p.here => {
                    p.here = true;
                    p.pending.clone()
                }
                _ => return Ok(false),
            }
        };
        match self.hire(pending.spec, pending.sources) {
            Ok(()) => Ok(true),
            Err(e) => {
                if let Some(p) = self.state().placed.get_mut(name) {
                    p.here = false;
                }
                Err(e)
            }
        }
    }

    /// Ends the placed resident `name` here, its saved cell kept for the node that claims it
    /// next (its lease was handed over or lost). Whether it ran here.
    pub fn retire(&self, name: &str) -> bool {
        {
            let mut st = self.state();
            match st.placed.get_mut(name) {
                Some(p) if p.here => p.here = false,
                _ => return false,
            }
        }
        self.inner.route.retire(name);
        self.end_sources(name);
        true
    }

    /// The hop limit of the placed resident `name` (mail past it is refused before it leaves
    /// this node); `None`: no such placed resident.
    pub fn placed_max_hop(&self, name: &str) -> Option<u32> {
        self.state()
            .placed
            .get(name)
            .map(|p| p.pending.spec.max_hop)
    }

    /// Whether the resident `name` runs here with nothing to do (no turn in flight, no mail
    /// waiting): a placed one may then be handed over without cutting a turn.
    pub fn at_rest(&self, name: &str) -> bool {
        self.inner.route.resident(name).is_some_and(|r| r.at_rest())
    }

    /// Posts `mail` to its recipient ([`Route::mail`]): `Ok` once it is accepted (for a resident
    /// that keeps its conversation, once it is on disk).
    pub fn mail(&self, mail: Mail) -> Result<(), MailError> {
        self.inner.route.mail(mail)
    }

    /// [`Route::mail_once`].
    pub fn mail_once(&self, mail: Mail) -> Result<super::Delivered, MailError> {
        self.inner.route.mail_once(mail)
    }

    /// A refusal as a script reads it ([`Route::refusal`]). Mail to a resident spawned but
    /// waiting for the watch said `no_recipient`, as if nobody had that name.
    pub fn refusal(&self, e: MailError, to: &str, hop: u32) -> String {
        let spawned = || {
            let st = self.state();
            st.watch == Watch::NotYet && st.pending_names.contains(to)
        };
        if e == MailError::NoRecipient && spawned() {
            return format!(
                "no_recipient: {to:?} is spawned but not started: the watch starts it \
                 (mail it from one of its sources, or once ai.watch runs)"
            );
        }
        self.inner.route.refusal(e, to, hop)
    }

    /// Lets the blocked resident `name` try again now. `None`: no such resident; `Some(false)`:
    /// it was not blocked.
    pub fn unblock(&self, name: &str) -> Option<bool> {
        self.inner.route.unblock(name)
    }

    /// Ends the resident `name` (registered or waiting for the watch) and its sources; its saved
    /// conversation is cleared. Answers whether there was one.
    pub fn dismiss(&self, name: &str) -> bool {
        let route = &self.inner.route;
        let removed_pending = {
            let mut st = self.state();
            // A placed resident running on another node is dismissed there.
            match st.placed.get(name) {
                Some(p) if !p.here => return false,
                Some(_) => {
                    st.placed.remove(name);
                }
                None => {}
            }
            let before = st.pending.len();
            let persisted = st
                .pending
                .iter()
                .any(|q| q.spec.name == name && q.spec.persist);
            st.pending.retain(|q| q.spec.name != name);
            st.pending_names.remove(name);
            if persisted
                && let Some(store) = route.store()
                && let Err(e) = store.clear_cell(name)
            {
                tracing::error!(ai = %name, "cannot clear its saved conversation: {e}");
            }
            st.pending.len() != before
        };
        let dismissed = route.dismiss(name);
        self.end_sources(name);
        dismissed || removed_pending
    }

    /// The residents: those registered in name order, then those waiting for the watch (state
    /// [`State::Pending`]) in the order hired.
    pub fn residents(&self) -> Vec<ResidentInfo> {
        let mut list = self.inner.route.residents();
        let placement = self.inner.route.placement();
        if let Some(p) = placement {
            for r in &mut list {
                r.node = Some(p.node().to_string());
            }
        }
        let mut elsewhere: Vec<String> = self
            .state()
            .placed
            .iter()
            .filter(|(_, p)| !p.here)
            .map(|(name, _)| name.clone())
            .collect();
        elsewhere.sort();
        list.extend(elsewhere.iter().filter_map(|name| self.resident(name)));
        let st = self.state();
        list.extend(
            st.pending
                .iter()
                .map(|q| ResidentInfo::absent(&q.spec.name, State::Pending, None)),
        );
        list
    }

    /// The resident `name` as [`Lifecycle::residents`] shows it (registered here, or placed on
    /// another node); `None`: no such resident, or one still waiting for the watch.
    pub fn resident(&self, name: &str) -> Option<ResidentInfo> {
        let placement = self.inner.route.placement();
        if let Some(r) = self.inner.route.resident(name) {
            let mut info = r.info();
            info.node = placement.map(|p| p.node().to_string());
            return Some(info);
        }
        let st = self.state();
        let placed = st.placed.get(name).filter(|p| !p.here)?;
        let node = placement.and_then(|p| p.node_of(name));
        Some(ResidentInfo::absent(
            &placed.pending.spec.name,
            placed_state(node.as_deref()),
            node,
        ))
    }

    /// Whether mail to `name` can be posted: it is registered here or placed in the cluster.
    pub fn knows(&self, name: &str) -> bool {
        self.inner.route.resident(name).is_some() || self.state().placed.contains_key(name)
    }

    /// Waits until the watch is up and mail is delivered; returns at once if it is, and also
    /// once the program is stopping (it will not open then).
    pub async fn opened(&self) {
        self.inner.route.opened().await
    }

    /// Asks the program to stop: no new turns start, mail is refused, its watch returns
    /// `reason`. The first reason given is the one kept.
    pub fn stop(&self, reason: impl Into<String>) {
        self.inner.route.stop(reason)
    }

    /// [`Lifecycle::stop`], and code that does not wait is stopped too, as on SIGTERM
    /// ([`Route::interrupt`]).
    pub fn interrupt(&self, reason: impl Into<String>) {
        self.inner.route.interrupt(reason)
    }

    /// [`Lifecycle::stop`] for a host that then waits for the program to end (a service's stop,
    /// restart or reload, an application's restart). A script that is still running the
    /// watch's grace plus [`AFTER_STOP`] later (code after its watch that loops or waits, a
    /// watch never reached) is ended where it stands ([`Route::abandon`]), so the host's wait
    /// ends and the program's end says why.
    pub fn stop_for_host(&self, reason: impl Into<String>) {
        let reason = reason.into();
        self.stop(reason.clone());
        let patience = self.grace() + AFTER_STOP;
        let ended = self.script_end();
        let program = self.downgrade();
        self.inner.route.core().handle().spawn(async move {
            let why = || {
                // Told as "the program was ended by <why>".
                let why = format!(
                    "its host after the stop ({reason}): the script was still running {} s \
                     after it",
                    patience.as_secs()
                );
                tracing::warn!("ending the program where it stands: {why}");
                why
            };
            program.abandon_unless_ended(ended, patience, why).await;
        });
    }

    /// [`Lifecycle::stop`], giving turns in flight `grace` instead of the watch's own.
    pub fn stop_within(&self, reason: impl Into<String>, grace: Duration) {
        self.inner.route.set_grace(grace);
        self.inner.route.stop(reason)
    }

    pub fn stopping(&self) -> bool {
        self.inner.route.stopping()
    }

    /// The stop's reason, once stopping.
    pub fn stop_reason(&self) -> Option<String> {
        self.inner.route.stop_reason()
    }

    /// Waits for the stop and returns its reason.
    pub async fn stopped(&self) -> String {
        self.inner.route.stopped().await
    }

    /// After a stop of a program with no watch (one that lingers, served over MCP, after its
    /// main chunk): waits up to the grace for calls from outside still in flight
    /// ([`Route::hold`]), as a watch waits for turns in flight.
    pub async fn finish_calls(&self) {
        let route = &self.inner.route;
        route.shutdown(route.grace()).await;
    }

    /// Ends the grace of a stop now: turns still in flight are stopped where they are (a
    /// second Ctrl-C). Called before the stop, it leaves that stop no grace.
    pub fn cut_short(&self) {
        self.inner.route.cut_short()
    }

    /// Residents in the middle of a turn.
    pub fn busy(&self) -> usize {
        self.inner.route.busy()
    }

    /// The grace turns in flight get after the stop.
    pub fn grace(&self) -> Duration {
        self.inner.route.grace()
    }

    /// How the program ended, if it settled.
    pub fn settled(&self) -> Option<Settled> {
        self.inner.route.settled()
    }

    /// The route's events from now on, as the watch hands them on (a receiver that falls more
    /// than 256 behind misses the oldest).
    pub fn subscribe(&self) -> broadcast::Receiver<RouteEvent> {
        self.inner.events.subscribe()
    }

    /// Whether, and when, the program's script ends, held apart from the program.
    pub fn script_end(&self) -> ScriptEnd {
        ScriptEnd(self.inner.script_ended.subscribe())
    }

    /// The script ended: the program stops (a host waiting for the watch to open, or for it to
    /// end, learns that it never will).
    pub fn script_ended(&self) {
        {
            // Residents spawned by a script that ended before its watch are never hired: they
            // go, and with them what they held (a host's delivery channel, whose reader waited
            // for ever).
            let mut st = self.state();
            if matches!(st.watch, Watch::NotYet) {
                st.pending.clear();
                st.pending_names.clear();
            }
        }
        self.inner.route.stop(SCRIPT_ENDED);
        self.inner.script_ended.send_replace(true);
    }

    /// Tells the program that its host serves `exports` over MCP (`colony mcp serve`, `colony
    /// serve`'s `/mcp`): a watch with no residents then runs until the host stops it, where it
    /// would end at once, and with it the tools the host was serving.
    pub fn serve_exports(&self, exports: crate::mcp::server::Exports) {
        let _ = self.inner.exports.set(exports);
    }

    /// Keeps `conns` open for the program's life (they are closed at its end).
    pub fn keep_servers<'a>(&self, conns: impl IntoIterator<Item = &'a Arc<Connection>>) {
        let mut list = lock(&self.inner.servers);
        list.retain(|w| w.strong_count() > 0);
        list.extend(conns.into_iter().map(Arc::downgrade));
    }

    /// Shuts down, in order, every server the program still holds (the end of the program).
    pub async fn close_servers(&self) {
        let conns: Vec<Arc<Connection>> = lock(&self.inner.servers)
            .iter()
            .filter_map(Weak::upgrade)
            .collect();
        futures::future::join_all(conns.iter().map(|c| c.close())).await;
    }

    /// Runs the program's watch until it stops, handing each route event to `on_event` (a
    /// crash, a failure, a block; a resident gone has already ended its sources), and returns
    /// the stop's reason. Runs once per program.
    pub async fn watch<F, Fut>(
        &self,
        opts: WatchOptions,
        mut on_event: F,
    ) -> Result<String, WatchError>
    where
        F: FnMut(RouteEvent) -> Fut,
        Fut: Future<Output = ()>,
    {
        let route = self.inner.route.clone();
        let mut events = {
            let mut st = self.state();
            if st.watch != Watch::NotYet {
                return Err(WatchError::Twice);
            }
            st.watch = Watch::Running;
            let Some(events) = route.events() else {
                return Err(WatchError::EventsTaken);
            };
            let pending = std::mem::take(&mut st.pending);
            drop(st);
            route.set_grace(opts.grace);
            // Everyone registers before the route opens, so no early mail finds a name missing.
            for q in pending {
                let name = q.spec.name.clone();
                match self.admit(q) {
                    Ok(()) => {}
                    // Stopped while it starts (a host's signal as the script reaches its
                    // watch): the watch returns the stop's reason, not the hire it refused.
                    Err(HireError::Spawn(SpawnError::Stopping)) => break,
                    Err(HireError::Spawn(e)) => return Err(WatchError::Hire(name, e)),
                    Err(_) => return Err(WatchError::Hire(name.clone(), SpawnError::Taken(name))),
                }
            }
            route.open();
            events
        };
        if let Some(placement) = route.placement() {
            placement.start(self.clone());
        } else {
            warn_of_unserved_mail(&route);
            // A program with no residents has nothing to watch, unless its host serves what it
            // exports (tools only, over MCP): then the watch runs until the host stops it.
            let serves = self.inner.exports.get().is_some_and(|e| !e.is_empty());
            if route.is_empty() && !serves {
                route.stop("there are no residents");
            }
        }
        // Heard on the core's runtime, not this task's: the script's thread may be busy.
        let _signals = if opts.signals {
            Some(listen_for_signals(&route).map_err(WatchError::Signals)?)
        } else {
            None
        };
        let reason = loop {
            tokio::select! {
                biased;
                reason = route.stopped() => break reason,
                Some(event) = events.recv() => {
                    self.keep_failure(&event, opts.handles_failures);
                    self.hand_on(event, &mut on_event).await
                }
                // Idle or blocked with nothing left to bring mail: the program has ended by itself.
                _ = route.changed(), if opts.until_idle => {
                    // Hooks first: on_blocked may unblock the resident it is told of.
                    route.settle_when(|| events.is_empty());
                }
            }
        };
        // No new turns start; sources end now; turns in flight get the grace period.
        {
            let mut st = self.state();
            for (_, handles) in st.sources.drain() {
                for h in handles {
                    h.abort();
                }
            }
            st.watch = Watch::Ended;
        }
        let cut = route.shutdown(route.grace()).await;
        if !cut.is_empty() && !route.was_cut_short() {
            // Named: which turns were cut is what the operator looks for next.
            tracing::warn!(
                "{} resident(s) were still busy after the grace period and were stopped: {}",
                cut.len(),
                cut.join(", ")
            );
        }
        if let Some(placement) = route.placement() {
            placement.ended();
        }
        // Failures reported while stopping still reach the callbacks.
        while let Ok(event) = events.try_recv() {
            self.keep_failure(&event, opts.handles_failures);
            self.hand_on(event, &mut on_event).await;
        }
        Ok(reason)
    }

    /// Keeps a child's failure for good that nobody else is told of.
    fn keep_failure(&self, event: &RouteEvent, handled: bool) {
        if let RouteEvent::Failed { id, message, .. } = event
            && !handled
        {
            self.state().unhandled.push((id.clone(), message.clone()));
        }
    }

    /// The children (`<ai>` or `<ai>/source/<n>`) that failed for good while the watch ran
    /// with nothing of the program's own to handle it, and why: `colony run` ends with status 1
    /// naming them. A program whose only source had died ended `idle`, with status 0.
    pub fn unhandled_failures(&self) -> Vec<(String, String)> {
        self.state().unhandled.clone()
    }

    /// Ends what a route event ends (a resident gone or failed takes its sources with it), then
    /// hands the event on: to the subscribers, and to the watcher's `on_event`.
    async fn hand_on<F, Fut>(&self, event: RouteEvent, on_event: &mut F)
    where
        F: FnMut(RouteEvent) -> Fut,
        Fut: Future<Output = ()>,
    {
        match &event {
            RouteEvent::Failed { id, ai, .. } if id == ai => self.end_sources_of_gone(ai),
            RouteEvent::Gone { ai } => self.end_sources_of_gone(ai),
            _ => {}
        }
        let _ = self.inner.events.send(event.clone());
        on_event(event).await
    }

    /// Hires `q` once the watch runs: placed in a cluster (dormant until claimed here), else
    /// registered at once.
    fn admit(&self, q: Pending) -> Result<(), HireError> {
        if let Some(placement) = self.inner.route.placement()
            && placement.places(&q.spec)
        {
            let name = q.spec.name.clone();
            let mut st = self.state();
            if st.placed.contains_key(&name) || self.inner.route.resident(&name).is_some() {
                return Err(HireError::Taken(name));
            }
            st.placed.insert(
                name,
                Placed {
                    pending: q,
                    here: false,
                },
            );
            return Ok(());
        }
        self.hire(q.spec, q.sources)?;
        Ok(())
    }

    /// Registers a resident on the route and starts its sources.
    fn hire(&self, spec: ResidentSpec, sources: Vec<Source>) -> Result<(), SpawnError> {
        let route = &self.inner.route;
        let name = spec.name.clone();
        let workspace = spec.workspace.clone();
        route.spawn(spec)?;
        let script = route.script();
        let handles: Vec<AbortHandle> = sources
            .into_iter()
            .enumerate()
            .map(|(i, source)| {
                let run = run_source(RunningSource {
                    route: route.clone(),
                    // Listening from now: the program cannot settle before the source has run.
                    _listening: route.listen(),
                    script: script.clone(),
                    id: format!("{name}/source/{}", i + 1),
                    ai: name.clone(),
                    workspace: workspace.clone(),
                    source,
                });
                route.core().handle().spawn(run).abort_handle()
            })
            .collect();
        self.state().sources.insert(name, handles);
        Ok(())
    }

    /// Ends the sources started for `ai`.
    fn end_sources(&self, ai: &str) {
        if let Some(handles) = self.state().sources.remove(ai) {
            for h in handles {
                h.abort();
            }
        }
    }

    /// Ends `ai`'s sources after a report that it is gone, unless the name was hired again
    /// meanwhile (the sources under that name are then the new resident's).
    fn end_sources_of_gone(&self, ai: &str) {
        if self.inner.route.resident(ai).is_none() {
            self.end_sources(ai);
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, LifeState> {
        lock(&self.inner.state)
    }
}

/// Says which saved conversations hold accepted mail that no resident of this run will serve:
/// one renamed or removed since the mail was accepted (or no longer keeping its conversation).
/// The mail stays saved; `true` was answered for it, so its loss must not be silent.
fn warn_of_unserved_mail(route: &Route) {
    let Some(store) = route.store() else { return };
    let Ok(names) = store.conversations() else {
        return;
    };
    for name in names {
        if route.resident(&name).is_some_and(|r| r.spec.persist) {
            continue;
        }
        if let Ok(Some(cell)) = store.load_cell(&name)
            && !cell.backlog.is_empty()
        {
            tracing::warn!(
                "a saved conversation {name:?} holds {} accepted mail(s) that no resident of \
                 this run serves (renamed, removed or no longer keeping its conversation): spawn \
                 {name:?} with persist_conversation = true to serve them, or clear it with \
                 `colony conversations FILE clear {name}`",
                cell.backlog.len()
            );
        }
    }
}

/// Listens for SIGTERM and SIGINT (and SIGHUP where it stops programs, `colony run`) while
/// the watch runs (until the guard is dropped): the first stops `route` (its reason is the
/// signal's name) and says what the grace is for; another cuts the grace short. Registered here, on the core's runtime, so that a signal is
/// heard at once whatever this thread is doing.
fn listen_for_signals(route: &Route) -> std::io::Result<SignalListener> {
    let runtime = route.core().handle().clone();
    let mut stops = {
        let _core = runtime.enter();
        crate::signals::stops()?
    };
    let listening = route.clone();
    let route = route.clone();
    let task = runtime.spawn(async move {
        let mut heard = 0;
        // When the watch must have ended after the last signal (the grace and a second after
        // the first, a second after another), and which signal that was.
        let mut due: Option<(tokio::time::Instant, &str)> = None;
        loop {
            let signal = tokio::select! {
                signal = stops.recv() => signal,
                () = tokio::time::sleep_until(due.map_or_else(tokio::time::Instant::now, |d| d.0)),
                    if due.is_some() =>
                {
                    let signal = due.take().map_or("SIGTERM", |d| d.1);
                    // The grace runs from when the watch began its shutdown, which a hook that
                    // was running at the signal delays: the turns get all of it.
                    if !route.was_cut_short()
                        && let Some(began) = route.shutdown_began()
                        && began + route.grace() + AFTER_INTERRUPT > tokio::time::Instant::now()
                    {
                        due = Some((began + route.grace() + AFTER_INTERRUPT, signal));
                        continue;
                    }
                    // Still watching (this task ends with the watch): what it waits for does
                    // not end (a hook that sleeps, a hook blocked outside Lua).
                    tracing::warn!(
                        "{signal}: the watch did not end in time: ending the program where it \
                         waits"
                    );
                    route.abandon(signal);
                    continue;
                }
            };
            heard += 1;
            route.heard_signal();
            // A program already stopping for another reason (`--max-time`, `ai.stop`) has its
            // turns in their grace: a signal then is the user's "now".
            let stopping_already = route
                .stop_reason()
                .is_some_and(|r| !crate::signals::is_stop_signal(&r));
            if heard == 1 && !stopping_already {
                due = Some((
                    tokio::time::Instant::now() + route.grace() + AFTER_INTERRUPT,
                    signal,
                ));
                route.stop(signal);
                let busy = route.busy();
                if busy > 0 {
                    tracing::warn!(
                        "{}{signal}: stopping; {busy} turn(s) in flight get up to {:.1} s to \
                         finish (Ctrl-C or SIGTERM again stops them now)",
                        route.label(),
                        route.grace().as_secs_f64()
                    );
                }
            } else {
                due = Some((tokio::time::Instant::now() + AFTER_INTERRUPT, signal));
                route.stop(signal);
                let again = if heard > 1 { " again" } else { "" };
                tracing::warn!(
                    "{}{signal}{again}: stopping the turns in flight now",
                    route.label()
                );
                route.cut_short();
            }
        }
    });
    listening.set_watch_listening(true);
    Ok(SignalListener(task.abort_handle(), listening))
}

/// Ends the signal listener of [`listen_for_signals`] when dropped.
struct SignalListener(tokio::task::AbortHandle, Route);

impl Drop for SignalListener {
    fn drop(&mut self) {
        self.1.set_watch_listening(false);
        self.0.abort();
    }
}

/// A source as it runs: while it does, it may mail (`_listening` is dropped when it ends or is
/// ended).
struct RunningSource {
    route: Route,
    _listening: Listener,
    script: Arc<dyn Script>,
    id: String,
    ai: String,
    workspace: Option<String>,
    source: Source,
}

/// One source under its restart policy.
async fn run_source(s: RunningSource) {
    let mut supervisor = Supervisor::new(s.source.policy);
    loop {
        let exit = match s
            .script
            .run_source(s.source.func, s.ai.clone(), s.workspace.clone())
            .await
        {
            Ok(()) => Exit::Normal,
            Err(fault) => Exit::Crashed(fault),
        };
        if s.route.stopping() {
            return;
        }
        match supervise_exit(&mut supervisor, exit, &s.id, &s.ai, &|e| s.route.report(e)) {
            Decision::Restart => {
                tokio::select! {
                    () = tokio::time::sleep(supervisor.backoff(std::time::Instant::now())) => {}
                    _ = s.route.stopped() => return,
                }
            }
            Decision::Done | Decision::Failed => return,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_resident_no_node_runs_is_unplaced() {
        assert_eq!(placed_state(Some("b")), State::Elsewhere);
        assert_eq!(placed_state(None), State::Unplaced);
        assert_eq!(State::Unplaced.as_str(), "unplaced");
    }
}
