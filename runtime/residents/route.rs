//! The route: the table of addressable AIs, the nursery their tasks live in, and the stop.
//!
//! A [`Route`] is `Send + Sync` and cheap to clone. The Lua `ai.*` functions drive one per
//! program, and an embedding application can drive its own: [`Route::open`] (mail is refused
//! before), [`Route::spawn`], [`Route::mail`], [`Route::dismiss`], [`Route::stop`] and
//! [`Route::shutdown`]. Crashes and failures are reported on [`Route::events`].
//!
//! Mail is at-most-once: a mailbox that has closed (its resident died or was dismissed) refuses
//! it, and the route evicts the name.
//!
//! **Settling.** A program whose residents are all idle (nothing waiting) or blocked, with no
//! turn in flight and nothing that could still bring mail (a [`Listener`]: a source, an
//! embedding application), has nothing left to do: [`Route::settle`] stops it, and
//! [`Route::settled`] says how it ended ([`Settled`]). Residents report going idle or blocked
//! ([`Route::changed`] wakes), and an activity count, bumped after every mail and every start of
//! work, tells a check that raced with a change to look again.

use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant};

use futures::FutureExt;
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::AbortHandle;

use super::breakers::{Breakers, Tracked};
use super::mail::{Delivered, Mail, MailError};
use super::observe::{Observation, Observer};
use super::placement::Placement;
use super::resident::{Host, Resident, ResidentInfo, ResidentSpec, State, live};
use super::supervision::{Decision, Exit, Supervisor};
use crate::core::Core;
use crate::script::Script;
use crate::store::Store;
use crate::turn::TurnError;

/// How long turns in flight may finish after a stop, unless the watch says otherwise.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(10);

/// What the route reports as it happens.
#[derive(Debug, Clone, PartialEq)]
pub enum RouteEvent {
    /// A child raised: `id` is the resident's name or its source's `<ai>/source/<n>`.
    Crashed {
        id: String,
        ai: String,
        message: String,
    },
    /// A child passed its restart intensity and is not started again.
    Failed {
        id: String,
        ai: String,
        message: String,
    },
    /// A resident left the table (dismissed, failed or stopped): its sources should end.
    Gone { ai: String },
    /// A resident cannot be served until its settings change (its notice has gone out).
    Blocked { ai: String, error: TurnError },
    /// An outage began or ended (`kind` `Outage` or `Recovered`): the notice its `deliver_to`
    /// is handed, told whatever that is (a host following the program saw only those of
    /// residents that deliver to it).
    Notice(super::resident::Delivery),
}

/// How a program that ran out of things to do ended.
#[derive(Debug, Clone, PartialEq)]
pub enum Settled {
    /// Every resident idle, nothing waiting, nothing that could bring mail.
    Idle,
    /// As idle, but these residents (in name order) are blocked, each by its error.
    Blocked(Vec<(String, TurnError)>),
}

impl Settled {
    /// What the watch returns: `idle`, or `blocked: <name>: <kind>: <message>` (the first).
    pub fn reason(&self) -> String {
        match self {
            Settled::Idle => "idle".into(),
            Settled::Blocked(list) => match list.first() {
                Some((name, e)) => format!("blocked: {name}: {}: {}", e.kind, e.message),
                None => "blocked".into(),
            },
        }
    }
}

/// Why a resident could not be hired.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SpawnError {
    #[error("an AI named {0:?} is already registered")]
    Taken(String),
    #[error("the route is stopping")]
    Stopping,
    #[error("cannot load its saved conversation: {0}")]
    Store(String),
}

/// The route of one program.
#[derive(Clone)]
pub struct Route {
    inner: Arc<Inner>,
}

struct Entry {
    resident: Arc<Resident>,
    task: AbortHandle,
}

struct Inner {
    core: Core,
    script: Arc<dyn Script>,
    store: Option<Arc<dyn Store>>,
    table: RwLock<HashMap<String, Entry>>,
    open: watch::Sender<bool>,
    stopping: AtomicBool,
    /// Signals the watch heard (SIGINT, SIGTERM): a listener of the host's tells its own from
    /// those by this count.
    signals_heard: AtomicU32,
    /// Whether the watch listens for signals now (from its start until it returns).
    watch_listening: AtomicBool,
    /// Open and not stopping: the one flag `mail` reads.
    accepting: AtomicBool,
    reason: watch::Sender<Option<String>>,
    events: mpsc::UnboundedSender<RouteEvent>,
    events_rx: Mutex<Option<mpsc::UnboundedReceiver<RouteEvent>>>,
    /// Resident tasks still running (a dismissed one counts until its task is dropped).
    tasks: AtomicUsize,
    tasks_done: Notify,
    /// Whether the table has ever held a resident (an empty route that never had one is not
    /// "every resident gone").
    ever: AtomicBool,
    /// Bumped after every mail posted and every start of work: see [`Route::settle`].
    activity: AtomicU64,
    /// Told when a resident goes idle or blocked, or something leaves: the program may have
    /// settled. One waiter (the watch): a notice given while it is busy is kept for it.
    quiet: Notify,
    /// What could still bring mail ([`Listener`]s alive).
    listeners: AtomicUsize,
    /// How the program ended, if it settled.
    settled: Mutex<Option<Settled>>,
    /// The grace its watch gives turns in flight after a stop.
    grace: Mutex<Duration>,
    /// Set by [`Route::cut_short`]: the grace is over now (a second Ctrl-C).
    cut_short: watch::Sender<bool>,
    /// When the stop's grace began ([`Route::shutdown`]), once it has.
    shutdown_began: Mutex<Option<tokio::time::Instant>>,
    /// Set by [`Route::interrupt`]: code that does not wait is to be stopped too.
    interrupting: watch::Sender<bool>,
    /// Set by [`Route::abandon`], with why: the program's code is ended where it stands.
    abandoning: watch::Sender<Option<String>>,
    /// Who looks on from outside the program ([`Route::set_observer`]), if anyone.
    observer: OnceLock<Observer>,
    /// Where each breaker of the residents' stacks stands ([`Route::breaker_store`]).
    breakers: Arc<Breakers>,
    /// In a cluster, where mail to a resident placed on another node goes; and an empty table
    /// is not "every resident gone" (this node may take some over yet).
    placement: OnceLock<Arc<dyn Placement>>,
    /// The program's name where a host runs several (`colony serve`): its stop's log lines
    /// name it.
    label: OnceLock<String>,
}

/// What the work done for one resident (its tools' and sources' model calls) spends: its budget.
struct Paying {
    resident: Arc<Resident>,
    host: Arc<Inner>,
}

impl crate::infer::spending::Pays for Paying {
    fn charge(&self, usage: &crate::vocab::Usage, provider: &str, model: &str) {
        self.resident.pay(&*self.host, usage, provider, model)
    }

    fn refusal(&self) -> Option<String> {
        self.resident.budget_refusal(&*self.host)
    }
}

impl Host for Inner {
    fn core(&self) -> &Core {
        &self.core
    }

    fn script(&self) -> &dyn Script {
        &*self.script
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }

    fn store(&self) -> Option<&Arc<dyn Store>> {
        self.store.as_ref()
    }

    fn stirred(&self) {
        self.activity.fetch_add(1, Ordering::SeqCst);
    }

    fn settling(&self) {
        self.quiet.notify_one();
    }

    fn report(&self, event: RouteEvent) {
        self.tell(event);
    }

    fn observe(&self, observation: Observation) {
        if let Some(observer) = self.observer.get() {
            let _ = observer.send(observation);
        }
    }

    fn observer(&self) -> Option<&Observer> {
        self.observer.get()
    }
}

/// Something that may still bring mail (a source, an embedding application, a listener): while
/// one is alive the program has not settled. Dropping it says it is done.
pub struct Listener(Arc<Inner>);

impl Drop for Listener {
    fn drop(&mut self) {
        self.0.listeners.fetch_sub(1, Ordering::SeqCst);
        self.0.quiet.notify_one();
    }
}

impl Route {
    /// A closed route whose residents call models through `core` and the script's tools through
    /// `script` ([`crate::script::Detached`] when there is no script).
    pub fn new(core: Core, script: impl Script + 'static) -> Route {
        Route::with_store(core, script, None)
    }

    /// A route whose residents keep their audit log (and, with `persist`, their conversations)
    /// in `store`.
    pub fn with_store(
        core: Core,
        script: impl Script + 'static,
        store: Option<Arc<dyn Store>>,
    ) -> Route {
        let (events, events_rx) = mpsc::unbounded_channel();
        Route {
            inner: Arc::new(Inner {
                core,
                script: Arc::new(script),
                store,
                table: RwLock::new(HashMap::new()),
                open: watch::Sender::new(false),
                stopping: AtomicBool::new(false),
                signals_heard: AtomicU32::new(0),
                watch_listening: AtomicBool::new(false),
                accepting: AtomicBool::new(false),
                reason: watch::Sender::new(None),
                events,
                events_rx: Mutex::new(Some(events_rx)),
                tasks: AtomicUsize::new(0),
                tasks_done: Notify::new(),
                ever: AtomicBool::new(false),
                activity: AtomicU64::new(0),
                quiet: Notify::new(),
                listeners: AtomicUsize::new(0),
                settled: Mutex::new(None),
                grace: Mutex::new(DEFAULT_GRACE),
                cut_short: watch::Sender::new(false),
                shutdown_began: Mutex::new(None),
                interrupting: watch::Sender::new(false),
                abandoning: watch::Sender::new(None),
                observer: OnceLock::new(),
                breakers: Arc::default(),
                placement: OnceLock::new(),
                label: OnceLock::new(),
            }),
        }
    }

    pub fn core(&self) -> &Core {
        &self.inner.core
    }

    /// The script the residents' handlers and callbacks run in.
    pub fn script(&self) -> Arc<dyn Script> {
        self.inner.script.clone()
    }

    /// From now on mail is delivered (the watch is up).
    pub fn open(&self) {
        // Accepting first: whoever `opened()` wakes may mail at once.
        if !self.stopping() {
            self.inner.accepting.store(true, Ordering::Release);
        }
        self.inner.open.send_replace(true);
    }

    pub fn is_open(&self) -> bool {
        *self.inner.open.borrow()
    }

    /// Waits until the route is open (a program's `ai.watch` is up); returns at once if it is,
    /// and also once it is stopping (it will not open then).
    pub async fn opened(&self) {
        let mut open = self.inner.open.subscribe();
        let mut reason = self.inner.reason.subscribe();
        tokio::select! {
            _ = open.wait_for(|o| *o) => {}
            _ = reason.wait_for(Option::is_some) => {}
        }
    }

    /// The receiver of the route's events; `None` once taken.
    pub fn events(&self) -> Option<mpsc::UnboundedReceiver<RouteEvent>> {
        lock(&self.inner.events_rx).take()
    }

    /// Reports an event (the Lua side reports its sources' crashes here).
    pub fn report(&self, event: RouteEvent) {
        self.inner.tell(event);
    }

    /// Lends the route an observer (before any resident is hired, to miss nothing): it hears
    /// every [`RouteEvent`] and each turn's start and end. The first one lent is kept.
    pub fn set_observer(&self, observer: Observer) {
        let _ = self.inner.observer.set(observer);
    }

    pub fn store(&self) -> Option<&Arc<dyn Store>> {
        self.inner.store.as_ref()
    }

    /// Where the breaker kept under `key` ([`crate::infer::stack::breaker_key`]) keeps its
    /// state: the route's store, and the route's view of it ([`Route::breaker_of`]), its
    /// changes told to the observer. Build each stack's breaker with one (after the observer
    /// is lent).
    pub fn breaker_store(&self, key: &str) -> Arc<dyn crate::infer::breaker::BreakerStore> {
        Arc::new(Tracked::new(
            crate::infer::stack::breaker_owner(key),
            key,
            self.inner.store.as_ref(),
            self.inner.breakers.clone(),
            self.inner.observer.get().cloned(),
        ))
    }

    /// Where the breaker resident `name`'s model calls go through stands (its own, else the
    /// route's); `None`: none has been used for it.
    pub fn breaker_of(&self, name: &str) -> Option<crate::infer::breaker::BreakerState> {
        self.inner.breakers.of(name)
    }

    /// Registers `spec` and starts its task on the core's runtime. A resident that keeps its
    /// conversation resumes from its saved cell (conversation, backlog, a turn in flight).
    pub fn spawn(&self, spec: ResidentSpec) -> Result<Arc<Resident>, SpawnError> {
        if self.stopping() {
            return Err(SpawnError::Stopping);
        }
        let name = spec.name.clone();
        let persist = spec.persist;
        let resident = Arc::new(Resident::new(spec));
        if persist && let Some(store) = &self.inner.store {
            match store.load_cell(&name) {
                Ok(Some(cell)) => {
                    // Its files are the program's again: `ai.view_file` finds them.
                    let files = self.inner.core.files();
                    files.remember_all(&cell.messages);
                    for mail in &cell.backlog {
                        mail.files.iter().for_each(|f| files.remember(f));
                    }
                    resident.restore(cell)
                }
                Ok(None) => {}
                Err(e) => return Err(SpawnError::Store(e.to_string())),
            }
        }
        let mut table = write(&self.inner.table);
        if table.contains_key(&name) {
            return Err(SpawnError::Taken(name));
        }
        self.inner.tasks.fetch_add(1, Ordering::AcqRel);
        let task = self.inner.core.handle().spawn(supervise(
            self.inner.clone(),
            resident.clone(),
            TaskCount(self.inner.clone()),
        ));
        table.insert(
            name,
            Entry {
                resident: resident.clone(),
                task: task.abort_handle(),
            },
        );
        self.inner.ever.store(true, Ordering::Release);
        self.inner.stirred();
        Ok(resident)
    }

    /// A refusal as a script reads it: what was refused and what it concerns
    /// (`no_recipient: "wroker"`, `hop_limit: hop 9 to "b" is above its max_hop of 8`).
    pub fn refusal(&self, e: MailError, to: &str, hop: u32) -> String {
        match e {
            // Whoever it is for, the program is stopping: not the "nobody of that name" the
            // other case means, which a relay would tell its model.
            MailError::NoRecipient if self.stopping() => format!(
                "stopping: no mail is taken for {to:?}, the program is stopping ({})",
                self.stop_reason().unwrap_or_default()
            ),
            MailError::NoRecipient => format!("no_recipient: {to:?}"),
            MailError::HopLimit => {
                let max_hop = self
                    .resident(to)
                    .map_or_else(String::new, |r| format!(" of {}", r.spec.max_hop));
                format!("hop_limit: hop {hop} to {to:?} is above its max_hop{max_hop}")
            }
            other => other.as_str().to_string(),
        }
    }

    /// Posts `mail` to its recipient. A recipient whose mailbox holds its capacity of waiting
    /// mails refuses it with [`MailError::MailboxFull`] (for a persisted one, before saving it):
    /// the sender may try again once some are served.
    /// In a cluster, mail to a resident running on another node is forwarded to it
    /// ([`Placement::forward`]).
    pub fn mail(&self, mail: Mail) -> Result<(), MailError> {
        self.post(mail, true).map(drop)
    }

    /// [`Route::mail`], saying whether the mail was new or a repeat of an id the recipient's
    /// store accepted before (the API's `duplicate`, across a restart).
    pub fn mail_once(&self, mail: Mail) -> Result<Delivered, MailError> {
        self.post(mail, true)
    }

    /// [`Route::mail`] to a resident running here, never forwarded: how mail a cluster brought
    /// from another node is delivered (`NoRecipient` if it is not here, or no longer).
    pub fn mail_here(&self, mail: Mail) -> Result<(), MailError> {
        self.post(mail, false).map(drop)
    }

    /// Names the program in the lines its stop logs, for a host of several (the first name
    /// given is kept).
    pub fn set_label(&self, label: &str) {
        let _ = self.inner.label.set(label.to_string());
    }

    /// `[name] ` for a program a host named ([`Route::set_label`]), else nothing.
    pub fn label(&self) -> String {
        self.inner
            .label
            .get()
            .map(|l| format!("[{l}] "))
            .unwrap_or_default()
    }

    /// Places the route's residents with `placement` (before the watch; the first one lent is
    /// kept).
    pub fn set_placement(&self, placement: Arc<dyn Placement>) {
        let _ = self.inner.placement.set(placement);
    }

    /// The placement lent, if the program is part of a cluster.
    pub fn placement(&self) -> Option<&Arc<dyn Placement>> {
        self.inner.placement.get()
    }

    fn post(&self, mail: Mail, forward: bool) -> Result<Delivered, MailError> {
        if !self.inner.accepting.load(Ordering::Acquire) {
            if self.stopping() {
                tracing::warn!(
                    "mail from {:?} refused: {}",
                    mail.source,
                    self.refusal(MailError::NoRecipient, &mail.to, mail.hop)
                );
            }
            return Err(MailError::NoRecipient);
        }
        let table = read(&self.inner.table);
        let Some(entry) = table.get(&mail.to) else {
            drop(table);
            if forward && let Some(placement) = self.inner.placement.get() {
                return placement.forward(mail);
            }
            // Before the watch and while stopping, refusals are expected; not once it runs.
            if *self.inner.open.borrow() {
                tracing::warn!(
                    "mail from {:?} refused: {}",
                    mail.source,
                    self.refusal(MailError::NoRecipient, &mail.to, mail.hop)
                );
            }
            return Err(MailError::NoRecipient);
        };
        let resident = &entry.resident;
        if mail.hop > resident.spec.max_hop {
            tracing::warn!(
                "mail from {:?} refused: hop_limit: hop {} to {:?} is above its max_hop of {}",
                mail.source,
                mail.hop,
                mail.to,
                resident.spec.max_hop
            );
            return Err(MailError::HopLimit);
        }
        let store = match &self.inner.store {
            Some(store) if resident.spec.persist => store,
            // The common path posts under the table's read lock: no reference count to touch.
            _ => {
                return match resident.mailbox.post(mail) {
                    Ok(()) => {
                        self.inner.stirred();
                        Ok(Delivered::New)
                    }
                    Err(MailError::MailboxFull) => {
                        full(&resident.spec.name, resident.spec.mailbox);
                        Err(MailError::MailboxFull)
                    }
                    Err(e) => {
                        let (name, resident) = (resident.spec.name.clone(), resident.clone());
                        drop(table);
                        // It has died: evict it, so the next sender learns at once.
                        self.inner.evict(&name, &resident);
                        Err(e)
                    }
                };
            }
        };
        // Saving takes a while: not under the table's lock.
        let resident = resident.clone();
        drop(table);
        let to = mail.to.clone();
        match resident
            .mailbox
            .post_saved(mail, |m| store.push_backlog(&m.to, m))
        {
            Ok(Ok(delivered)) => {
                self.inner.stirred();
                Ok(delivered)
            }
            Ok(Err(MailError::MailboxFull)) => {
                full(&to, resident.spec.mailbox);
                Err(MailError::MailboxFull)
            }
            Ok(Err(e)) => {
                self.inner.evict(&to, &resident);
                Err(e)
            }
            Err(e) => {
                if let Some(unsaid) = UNSAVED_SAID.say() {
                    let also = crate::said::also(unsaid);
                    tracing::error!(to = %to, "mail not accepted: cannot save it: {e}{also}");
                }
                // A save whose answer was lost (the store went away) may have committed: the
                // resident looks. A refusal (a lease another node holds, a value JSON cannot
                // hold) wrote nothing, and the backlog then holds another owner's mail.
                if matches!(e, crate::store::StoreError::Io(_)) {
                    resident.mailbox.unsure();
                }
                Err(MailError::NotSaved)
            }
        }
    }

    /// Ends the AI `name`: its task is stopped (a turn in flight with it), its name freed and
    /// its saved conversation cleared.
    pub fn dismiss(&self, name: &str) -> bool {
        let entry = write(&self.inner.table).remove(name);
        let Some(entry) = entry else { return false };
        if entry.resident.spec.persist
            && let Some(store) = &self.inner.store
            && let Err(e) = store.clear_cell(name)
        {
            tracing::error!(ai = %name, "cannot clear its saved conversation: {e}");
        }
        // Its waiting mail goes with it, said: a dismissal ended a busy resident's queue unseen.
        let waiting = entry.resident.mailbox.len();
        if waiting > 0 {
            tracing::warn!(ai = %name, "dismissed with {waiting} waiting mail(s): they are dropped");
        }
        entry.resident.mailbox.close();
        entry.resident.set_state(State::Stopped);
        entry.task.abort();
        self.inner.breakers.forget(name);
        self.report(RouteEvent::Gone { ai: name.into() });
        self.inner.check_all_gone();
        self.inner.quiet.notify_one();
        true
    }

    /// Ends the AI `name` here without ending it for good: its task is stopped (a turn in
    /// flight with it: its saved cell resumes it wherever it is claimed next), its name freed,
    /// its saved conversation kept. A cluster retires a resident it hands over or lost.
    pub fn retire(&self, name: &str) -> bool {
        let entry = write(&self.inner.table).remove(name);
        let Some(entry) = entry else { return false };
        entry.resident.mailbox.close();
        entry.resident.set_state(State::Stopped);
        entry.task.abort();
        self.inner.breakers.forget(name);
        self.report(RouteEvent::Gone { ai: name.into() });
        self.inner.quiet.notify_one();
        true
    }

    /// Lets the blocked resident `name` try again now. `None`: no such resident; `Some(false)`:
    /// it was not blocked.
    pub fn unblock(&self, name: &str) -> Option<bool> {
        let resident = self.resident(name)?;
        let was = resident.unblock();
        if was {
            self.inner.stirred();
        }
        Some(was)
    }

    /// Registers something that may still bring mail: until the [`Listener`] is dropped, the
    /// program does not settle.
    pub fn listen(&self) -> Listener {
        self.inner.listeners.fetch_add(1, Ordering::SeqCst);
        self.inner.stirred();
        Listener(self.inner.clone())
    }

    /// Waits until the program may have settled (a resident went idle or blocked, a listener
    /// or a resident left); then [`Route::settle`] says whether it has.
    pub async fn changed(&self) {
        self.inner.quiet.notified().await
    }

    /// If the program has settled (every resident at rest or blocked, no listener, no mail
    /// waiting, no turn in flight), stops it with [`Settled::reason`] and answers how; else
    /// `None`. The activity count, read before and after the look, catches a mail or a start
    /// of work that raced with it.
    pub fn settle(&self) -> Option<Settled> {
        self.settle_when(|| true)
    }

    /// [`Route::settle`], if `heard()` still holds once the program is found settled: a watcher
    /// that calls hooks on [`Route::events`] passes "no event waiting", so a resident's block is
    /// told to `on_blocked` (which may unblock it) before it can end the program. Until then it
    /// looks again at the next [`Route::changed`].
    pub fn settle_when(&self, heard: impl FnOnce() -> bool) -> Option<Settled> {
        let inner = &self.inner;
        if !self.is_open() || self.stopping() {
            return None;
        }
        // A cassette's answers never change: one blocked resident ends a replayed run at once,
        // whatever else is still going.
        let replaying = inner.core.is_replaying();
        let listening = || inner.listeners.load(Ordering::SeqCst) > 0;
        if listening() && !replaying {
            return None;
        }
        let before = inner.activity.load(Ordering::SeqCst);
        let mut blocked = Vec::new();
        let mut at_rest = true;
        for e in read(&inner.table).values() {
            let r = &e.resident;
            if let Some(error) = r.blocked_by() {
                blocked.push((r.name().to_string(), error));
            } else if !r.at_rest() {
                at_rest = false;
                if !replaying {
                    return None;
                }
            }
        }
        let ends_now = replaying && !blocked.is_empty();
        if !ends_now && (!at_rest || listening()) {
            return None;
        }
        if !ends_now && inner.activity.load(Ordering::SeqCst) != before {
            // Something happened meanwhile: look again.
            inner.quiet.notify_one();
            return None;
        }
        if !heard() {
            inner.quiet.notify_one();
            return None;
        }
        blocked.sort_by(|a, b| a.0.cmp(&b.0));
        let settled = if blocked.is_empty() {
            Settled::Idle
        } else {
            Settled::Blocked(blocked)
        };
        if !inner.stop_with(&settled.reason()) {
            return None;
        }
        *lock(&inner.settled) = Some(settled.clone());
        Some(settled)
    }

    /// Records the grace the watch will give turns in flight after a stop (for whoever stops
    /// it from outside and must wait that long).
    pub fn set_grace(&self, grace: Duration) {
        *lock(&self.inner.grace) = grace;
    }

    pub fn grace(&self) -> Duration {
        *lock(&self.inner.grace)
    }

    /// How the program ended, if it settled (a replayed run settles as soon as a resident is
    /// blocked).
    pub fn settled(&self) -> Option<Settled> {
        lock(&self.inner.settled).clone()
    }

    /// The live residents, in name order.
    pub fn residents(&self) -> Vec<ResidentInfo> {
        let mut list: Vec<ResidentInfo> = read(&self.inner.table)
            .values()
            .map(|e| e.resident.info())
            .collect();
        list.sort_by(|a, b| a.name.cmp(&b.name));
        list
    }

    /// The resident `name`, if registered.
    /// Who pays for the model calls of work done for resident `name` (a tool handler of its
    /// turn, one of its sources): its budget and usage. `None` if it is not here.
    pub fn payer_for(&self, name: &str) -> Option<crate::infer::spending::Payer> {
        let resident = self.resident(name)?;
        Some(Arc::new(Paying {
            resident,
            host: self.inner.clone(),
        }))
    }

    pub fn resident(&self, name: &str) -> Option<Arc<Resident>> {
        read(&self.inner.table)
            .get(name)
            .map(|e| e.resident.clone())
    }

    pub fn len(&self) -> usize {
        read(&self.inner.table).len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Asks everything to stop: no new turns start, mail is refused, idle residents end. The
    /// first reason given is the one kept.
    pub fn stop(&self, reason: impl Into<String>) {
        let _ = self.inner.stop_with(&reason.into());
    }

    pub fn stopping(&self) -> bool {
        self.inner.stopping()
    }

    /// Counts a signal the watch heard (before it acts on it).
    pub fn heard_signal(&self) {
        self.inner.signals_heard.fetch_add(1, Ordering::AcqRel);
    }

    /// How many signals the watch heard.
    pub fn signals_heard(&self) -> u32 {
        self.inner.signals_heard.load(Ordering::Acquire)
    }

    /// Set while the watch listens for signals.
    pub fn set_watch_listening(&self, listening: bool) {
        self.inner
            .watch_listening
            .store(listening, Ordering::Release);
    }

    /// Whether a watch listens for signals now: when none does, a signal is nobody's to hear
    /// but the host's.
    pub fn watch_listening(&self) -> bool {
        self.inner.watch_listening.load(Ordering::Acquire)
    }

    /// The reason given to [`Route::stop`], once stopping.
    pub fn stop_reason(&self) -> Option<String> {
        self.inner.reason.borrow().clone()
    }

    /// Waits for [`Route::stop`] and returns its reason.
    pub async fn stopped(&self) -> String {
        let mut rx = self.inner.reason.subscribe();
        match rx.wait_for(Option::is_some).await {
            Ok(r) => r.clone().unwrap_or_default(),
            Err(_) => String::new(),
        }
    }

    /// [`Route::stop`], as a signal stops a program: whatever runs the program's code is also
    /// asked to stop code that does not wait (a source or a tool spinning in a loop), which a
    /// stop alone leaves to its own deadline. `--max-time` stops this way, as SIGTERM does.
    pub fn interrupt(&self, reason: impl Into<String>) {
        self.stop(reason);
        self.inner.interrupting.send_replace(true);
    }

    /// Waits for [`Route::interrupt`].
    pub async fn interrupted(&self) {
        let mut rx = self.inner.interrupting.subscribe();
        let _ = rx.wait_for(|i| *i).await;
    }

    /// [`Route::interrupt`], and whatever runs the program's code ends it at once, code that
    /// waits too (an `ai.sleep`, a model call): for a host that will not wait any longer for a
    /// script that runs on after its stop. `why` is how the program's end is told.
    pub fn abandon(&self, why: impl Into<String>) {
        let why = why.into();
        self.interrupt(why.clone());
        self.inner.abandoning.send_if_modified(|a| {
            if a.is_none() {
                *a = Some(why);
                true
            } else {
                false
            }
        });
    }

    /// Waits for [`Route::abandon`] and returns why.
    pub async fn abandoned(&self) -> String {
        let mut rx = self.inner.abandoning.subscribe();
        let why = rx
            .wait_for(Option::is_some)
            .await
            .map(|why| why.clone().unwrap_or_default());
        match why {
            Ok(why) => why,
            // The route is gone: nothing will abandon it.
            Err(_) => std::future::pending().await,
        }
    }

    /// Ends the grace of a stop at once: [`Route::shutdown`], waiting or yet to, ends the turns
    /// still in flight now (the second Ctrl-C of a user who will not wait).
    pub fn cut_short(&self) {
        self.inner.cut_short.send_replace(true);
    }

    /// Waits for [`Route::cut_short`]: the turns in flight end now, without a reply.
    pub async fn cut(&self) {
        let mut cut_short = self.inner.cut_short.subscribe();
        let _ = cut_short.wait_for(|cut| *cut).await;
    }

    /// When the grace of a stop began ([`Route::shutdown`]), once it has: a watch's hook that
    /// was running at the stop delays it.
    pub fn shutdown_began(&self) -> Option<tokio::time::Instant> {
        *lock(&self.inner.shutdown_began)
    }

    /// Whether [`Route::cut_short`] was asked.
    pub fn was_cut_short(&self) -> bool {
        *self.inner.cut_short.borrow()
    }

    /// Holds a stop's [`Route::shutdown`] while the returned guard lives, as a resident's turn
    /// in flight does: a call from outside (an MCP client's `tools/call`) is given the same
    /// grace, rather than cut off the moment the program is asked to stop.
    pub fn hold(&self) -> impl Drop + Send + 'static {
        self.inner.tasks.fetch_add(1, Ordering::AcqRel);
        TaskCount(self.inner.clone())
    }

    /// Resident tasks in the middle of a turn.
    pub fn busy(&self) -> usize {
        read(&self.inner.table)
            .values()
            .filter(|e| e.resident.state() == State::Busy)
            .count()
    }

    /// After [`Route::stop`]: waits up to `grace` for turns in flight (and [`Route::hold`]s) to
    /// finish (or until [`Route::cut_short`]), then ends the tasks still running. Returns the
    /// names of the residents that had to be cut off.
    pub async fn shutdown(&self, grace: Duration) -> Vec<String> {
        let began = tokio::time::Instant::now();
        lock(&self.inner.shutdown_began).get_or_insert(began);
        let deadline = began + grace;
        loop {
            let done = self.inner.tasks_done.notified();
            tokio::pin!(done);
            done.as_mut().enable();
            if self.inner.tasks.load(Ordering::Acquire) == 0 {
                return Vec::new();
            }
            let over = tokio::select! {
                waited = tokio::time::timeout_at(deadline, done) => waited.is_err(),
                () = self.cut() => true,
            };
            if over {
                break;
            }
        }
        let table = std::mem::take(&mut *write(&self.inner.table));
        let mut cut = Vec::new();
        for (name, e) in table {
            if e.resident.state() != State::Stopped {
                cut.push(name);
            }
            e.task.abort();
        }
        cut.sort();
        cut
    }
}

impl Inner {
    /// Reports `event` to the watcher, and to the observer if there is one.
    fn tell(&self, event: RouteEvent) {
        if let Some(observer) = self.observer.get() {
            let _ = observer.send(Observation::Route(event.clone()));
        }
        let _ = self.events.send(event);
    }

    /// Removes `resident` from the table if it is still the one registered under `name`.
    fn evict(&self, name: &str, resident: &Arc<Resident>) {
        let removed = {
            let mut table = write(&self.table);
            match table.get(name) {
                Some(e) if Arc::ptr_eq(&e.resident, resident) => table.remove(name).is_some(),
                _ => false,
            }
        };
        if removed {
            self.tell(RouteEvent::Gone { ai: name.into() });
            self.check_all_gone();
            self.quiet.notify_one();
        }
    }

    fn check_all_gone(&self) {
        if *self.open.borrow()
            && self.ever.load(Ordering::Acquire)
            && self.placement.get().is_none()
            && read(&self.table).is_empty()
        {
            self.stop_with("every resident is gone");
        }
    }

    /// Stops with `reason` unless already stopping; answers whether this was the first stop.
    fn stop_with(&self, reason: &str) -> bool {
        let first = self.reason.send_if_modified(|r| {
            if r.is_none() {
                *r = Some(reason.to_string());
                true
            } else {
                false
            }
        });
        if first {
            tracing::info!(reason, "stopping");
            self.stopping.store(true, Ordering::Release);
            self.accepting.store(false, Ordering::Release);
            for e in read(&self.table).values() {
                e.resident.mailbox.wake();
            }
        }
        first
    }
}

/// Counts a resident task (or a [`Route::hold`]) until it is dropped, aborted or not.
struct TaskCount(Arc<Inner>);

impl Drop for TaskCount {
    fn drop(&mut self) {
        self.0.tasks.fetch_sub(1, Ordering::AcqRel);
        self.0.tasks_done.notify_waiters();
    }
}

/// Runs a resident under its restart policy.
async fn supervise(inner: Arc<Inner>, me: Arc<Resident>, _count: TaskCount) {
    let mut supervisor = Supervisor::new(me.spec.restart);
    let name = me.name().to_string();
    loop {
        let exit = match AssertUnwindSafe(live(&*inner, &me)).catch_unwind().await {
            Ok(exit) => exit,
            Err(panic) => {
                Exit::Crashed(format!("the resident panicked: {}", panic_text(&panic)).into())
            }
        };
        if inner.stopping() || me.mailbox.is_closed() {
            break;
        }
        match supervise_exit(&mut supervisor, exit, &name, &name, &|e| inner.tell(e)) {
            Decision::Restart => me.restarted(),
            Decision::Done | Decision::Failed => break,
        }
    }
    me.set_state(State::Stopped);
    me.mailbox.close();
    inner.evict(&name, &me);
}

/// After a child (a resident, or a source `id` of `ai`) ended: reports a crash, decides by the
/// policy, reports a failure. The one place supervision's events are made, and the one place a
/// crash is logged: once, as `[id] crashed: file:line: message` with the script's traceback.
pub fn supervise_exit(
    supervisor: &mut Supervisor,
    exit: Exit,
    id: &str,
    ai: &str,
    report: &dyn Fn(RouteEvent),
) -> Decision {
    if let Exit::Crashed(fault) = &exit {
        match fault.during {
            Some(during) => tracing::warn!("[{id}] crashed in {during}: {fault}"),
            None => tracing::warn!("[{id}] crashed: {fault}"),
        }
        report(RouteEvent::Crashed {
            id: id.into(),
            ai: ai.into(),
            message: fault.message.clone(),
        });
    }
    let now = Instant::now();
    let decision = supervisor.decide(&exit, now);
    if decision == Decision::Failed {
        // The crash itself was logged above: this line says only what follows from it.
        let limit = supervisor.limit_passed(&exit, now);
        let message = match exit {
            Exit::Crashed(f) => f.message,
            Exit::Normal => "ended too often".to_string(),
        };
        tracing::error!("[{id}] failed: not started again ({limit})");
        report(RouteEvent::Failed {
            id: id.into(),
            ai: ai.into(),
            message,
        });
    }
    decision
}

fn panic_text(panic: &Box<dyn std::any::Any + Send>) -> String {
    panic
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "(no message)".into())
}

/// Says that mail to `to` was refused for a full mailbox, at most once every
/// [`SaidEvery::PERIOD`](crate::said::SaidEvery::PERIOD): refusals were logged for every reason but this one (ai.lua: "a refusal
/// once the watch runs is also logged"), and a sender pushed back hard would write one a mail.
fn full(to: &str, capacity: usize) {
    if let Some(unsaid) = FULL_SAID.say() {
        let also = crate::said::also(unsaid);
        let mails = if capacity == 1 { "mail" } else { "mails" };
        tracing::warn!(
            "mail to {to:?} refused: mailbox_full: it holds its {capacity} waiting {mails}{also}"
        );
    }
}

static FULL_SAID: crate::said::SaidEvery = crate::said::SaidEvery::new();

/// Mail refused because the store cannot save it is said at most once every
/// [`SaidEvery::PERIOD`](crate::said::SaidEvery::PERIOD), with how many went unsaid: a full disk wrote one line a mail (117 in
/// 14 s), the same line each time.
static UNSAVED_SAID: crate::said::SaidEvery = crate::said::SaidEvery::new();

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn read<T>(l: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|e| e.into_inner())
}

fn write<T>(l: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {

    use super::*;

    /// The size of the future `f` makes, without making one.
    fn future_size<F: FnOnce(A, B, C) -> Fut, A, B, C, Fut>(_: &F) -> usize {
        std::mem::size_of::<Fut>()
    }

    /// Every idle resident's task holds this future for as long as it lives: a turn's state
    /// inline made it 2,176 bytes, most of what an idle resident cost. The turn and the rarer
    /// waits are boxed (`resident::live`), so it stays a few hundred.
    #[test]
    fn an_idle_residents_task_is_small() {
        let size = future_size(&supervise);
        assert!(size <= 768, "the resident task's future is {size} bytes");
    }
}
