//! One resident: a supervised task with its own conversation and mailbox.
//!
//! The loop: wait for mail; take the waiting arrivals (at most [`HELD`]) as user turns labelled
//! with their source; run `take_turn` through the resident's middleware; commit the transcript;
//! hand a non-empty reply to its [`Deliver`]. One resident's turns are strictly ordered (one
//! task); residents run in parallel on the core.
//!
//! **The outage path** (`ARCHITECTURE.md`, "The outage path"). When a turn's first model call fails, nothing of the turn
//! happened: the arrivals go back to the mailbox, which from then on holds only the newest
//! [`HELD`] and counts what it discards, and the stored conversation stays as it was. The resident
//! tries again after the provider's retry-after (an open breaker's says when its next probe is
//! due) or its own backoff (1 s doubling to 60 s), each attempt reading the held arrivals behind
//! a dropped marker derived from the count. One notice goes out on the way into the outage and
//! one on the way out. A failure after a step already ran (tools ran, so the turn cannot be
//! repeated) commits what happened and the next attempt continues from it.
//!
//! **Blocked.** A failure that waiting cannot cure (a key refused, a request refused as it
//! stands, no provider configured, a cassette without the request:
//! [`crate::providers::ProviderError::is_permanent`]) does not take the outage path: retrying
//! every minute would hang the program for nothing. A garbled answer is the exception until it
//! comes [`GARBLED_IN_A_ROW`] times in a row. The resident is *blocked*: its arrivals are
//! kept, all of them (and stay saved when it keeps its conversation), one notice
//! ([`DeliveryKind::Blocked`]) goes out, the route is told, and it tries again only when its
//! settings could have changed: the config file changed on disk (looked at once a second while
//! blocked) or [`Resident::unblock`] (`ai.unblock`).

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::mpsc;

use super::budget;
use super::mail::{Batch, HELD, Mailbox, Provenance, dropped_marker};
use super::observe::{Observation, ObservedHooks, Timed, TurnReport};
use super::persist::ResidentHooks;
use super::route::RouteEvent;
use super::supervision::{Exit, Fault, RestartPolicy};
use crate::core::Ask;
use crate::infer::SharedInfer;
use crate::script::{FnId, Script};
use crate::store::{JournalEntry, SavedResident, Store};
use crate::turn::TurnHooks;
use crate::turn::{Compaction, ToolDef, TurnError, TurnOutcome, TurnSpec, take_turn};
use crate::vocab::{Message, Stop, Usage};

/// The default `max_hop`: a mail that has been relayed more often than this is refused.
pub const DEFAULT_MAX_HOP: u32 = 8;

/// The line a turn gains when its text had nobody to go to.
pub const UNDELIVERED_NOTE: &str = "[colony] Your last reply was not delivered: you have no \
    deliver_to, so nobody reads your replies. Speak through your tools.";

/// Everything a resident is hired with.
#[derive(Clone)]
pub struct ResidentSpec {
    pub name: String,
    /// System, settings (use-type, provider, model ...) and request shaping for every turn;
    /// its `messages` are ignored.
    pub ask: Ask,
    pub tools: Vec<ToolDef>,
    /// Tools read again before each step, beside `tools`: its MCP servers', which a server
    /// may change while the resident lives ([`crate::mcp::relisted`]).
    pub changing_tools: Option<Arc<dyn crate::turn::DynamicTools>>,
    pub max_steps: u32,
    pub max_hop: u32,
    /// The most mails that may wait in its mailbox ([`super::mail::CAPACITY`] by default); past
    /// it a mail is refused with `mailbox_full`.
    pub mailbox: usize,
    pub compaction: Compaction,
    pub deliver: Deliver,
    pub restart: RestartPolicy,
    /// The middleware stack its model calls go through (the core itself for none).
    pub stack: SharedInfer,
    /// Whether its conversation and backlog are kept in the store across restarts.
    pub persist: bool,
    /// The store namespace its tools and sources see (`None`: the global space).
    pub workspace: Option<String>,
    /// Its own and its program's budgets ([`super::budget`]); none by default.
    pub budgets: super::budget::Budgets,
}

/// Where a resident's replies and notices go.
#[derive(Clone)]
pub enum Deliver {
    /// Nowhere: the AI speaks only through its tools.
    Nobody,
    /// A script's function `deliver_to(text, info)`; an error it raises crashes the resident.
    Script(Arc<dyn Script>, FnId),
    /// A channel (an embedding application's).
    Channel(mpsc::UnboundedSender<Delivery>),
    /// Standard output, as `[name] text` (`deliver_to = "host"` under `colony run`).
    Stdout,
}

/// What a delivery is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryKind {
    /// A turn's reply.
    Reply,
    /// The model cannot be called: arrivals are being held.
    Outage,
    /// The model answers again.
    Recovered,
    /// The model cannot be called until the settings change: arrivals are kept.
    Blocked,
}

/// One reply or notice from a resident.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Delivery {
    pub ai: String,
    pub kind: DeliveryKind,
    pub text: String,
    /// The sender of the mail the turn served (the newest, if several).
    pub origin: Option<String>,
    pub hop: u32,
    pub stop: Option<&'static str>,
    pub steps: u32,
    pub usage: Usage,
    /// For a notice: the error that began the outage (or blocked the resident).
    pub error: Option<String>,
    /// For a blocked notice: the error, classified (`deliver_to` reads it as `info.error`).
    #[serde(skip)]
    pub blocked: Option<TurnError>,
    /// Arrivals held (outage) or discarded (recovery).
    pub held: usize,
    pub dropped: u64,
}

/// What a resident is doing, as `ai.residents()` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum State {
    Idle,
    Busy,
    Outage,
    Restarting,
    Stopped,
    /// A permanent failure: waiting for its settings to change.
    Blocked,
    /// Hired before the watch, not registered yet ([`super::Lifecycle::residents`]).
    Pending,
    /// Placed on another node of the cluster ([`super::placement`]): `node` names it.
    Elsewhere,
    /// Placed in the cluster, and no node runs it now: it is being handed over or taken over
    /// (its lease free or expired), or no live node has it.
    Unplaced,
}

impl State {
    /// Every state, as [`State::as_str`] names them.
    pub const ALL: [State; 9] = [
        State::Idle,
        State::Busy,
        State::Outage,
        State::Restarting,
        State::Stopped,
        State::Blocked,
        State::Pending,
        State::Elsewhere,
        State::Unplaced,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            State::Idle => "idle",
            State::Busy => "busy",
            State::Outage => "outage",
            State::Restarting => "restarting",
            State::Stopped => "stopped",
            State::Blocked => "blocked",
            State::Pending => "pending",
            State::Elsewhere => "elsewhere",
            State::Unplaced => "unplaced",
        }
    }

    fn from_u8(v: u8) -> State {
        match v {
            0 => State::Idle,
            1 => State::Busy,
            2 => State::Outage,
            3 => State::Restarting,
            5 => State::Blocked,
            6 => State::Pending,
            7 => State::Elsewhere,
            8 => State::Unplaced,
            _ => State::Stopped,
        }
    }
}

/// A resident as the route holds it: its mailbox, its conversation (which outlives a crash) and
/// what `ai.residents()` reports.
pub struct Resident {
    pub spec: ResidentSpec,
    pub mailbox: Mailbox,
    conversation: Mutex<Vec<Message>>,
    /// The journal of the step in flight found at a restart, for the first turn.
    journal: Mutex<Vec<JournalEntry>>,
    conversation_len: AtomicUsize,
    state: AtomicU8,
    restarts: AtomicU32,
    /// Why it is blocked, while it is (boxed: an idle resident's size is an aim, and it is
    /// rarely blocked).
    blocked: Mutex<Option<Box<TurnError>>>,
    /// Why its model (or store) cannot be reached, while in an outage: what a caller waiting
    /// for its reply is told (it was told only that the call timed out).
    failing: Mutex<Option<Box<str>>>,
    /// Usage the store could not record (a full disk), to record with the next: a budgeted
    /// resident waits until it is (it went on spending past its budget, uncounted).
    unsaved: Mutex<Option<Box<budget::Spent>>>,
    unblocked: tokio::sync::Notify,
    /// Where its usage is counted when the route has no store (an embedding without one).
    local_usage: std::sync::OnceLock<Arc<dyn Store>>,
    /// Its last turn called a model that reported no token usage (many local servers do not).
    usage_unreported: AtomicBool,
    /// Senders waiting for the reply to their mail, by the mail's `source` (an MCP client
    /// calling an exported resident): the reply of a turn that served it goes to them.
    awaited: Mutex<std::collections::HashMap<String, tokio::sync::oneshot::Sender<Delivery>>>,
}

/// A snapshot for `ai.residents()`.
#[derive(Debug, Clone, Serialize)]
pub struct ResidentInfo {
    pub name: String,
    pub state: State,
    /// Messages in its stored conversation.
    pub conversation: usize,
    /// Arrivals waiting (held, during an outage).
    pub held: usize,
    pub dropped: u64,
    pub restarts: u32,
    /// While blocked: the error that blocked it.
    pub error: Option<TurnError>,
    /// Mails refused because its mailbox was full.
    pub refused: u64,
    /// Mails its turns have served (taken into its conversation).
    pub served: u64,
    /// In a cluster, the node it runs on (`None`: this process, not in a cluster, or not known).
    pub node: Option<String>,
}

impl ResidentInfo {
    /// A resident with no task here (waiting for the watch, or on another node): nothing
    /// counted yet.
    pub fn absent(name: &str, state: State, node: Option<String>) -> ResidentInfo {
        ResidentInfo {
            name: name.to_string(),
            state,
            conversation: 0,
            held: 0,
            dropped: 0,
            restarts: 0,
            error: None,
            refused: 0,
            served: 0,
            node,
        }
    }
}

impl Resident {
    pub fn new(spec: ResidentSpec) -> Resident {
        Resident {
            mailbox: if spec.persist {
                Mailbox::keeping_all(spec.mailbox)
            } else {
                Mailbox::with_capacity(spec.mailbox)
            },
            spec,
            conversation: Mutex::new(Vec::new()),
            journal: Mutex::new(Vec::new()),
            conversation_len: AtomicUsize::new(0),
            state: AtomicU8::new(State::Idle as u8),
            restarts: AtomicU32::new(0),
            blocked: Mutex::new(None),
            failing: Mutex::new(None),
            unsaved: Mutex::new(None),
            unblocked: tokio::sync::Notify::new(),
            local_usage: std::sync::OnceLock::new(),
            usage_unreported: AtomicBool::new(false),
            awaited: Mutex::new(std::collections::HashMap::new()),
        }
    }

    /// The reply to the next turn that serves a mail from `source` goes to the returned
    /// receiver instead of `deliver_to` (a caller waiting for its answer). Mail from `source`
    /// should be posted after this; [`Resident::forget_reply`] when the caller gives up.
    pub fn await_reply(&self, source: &str) -> tokio::sync::oneshot::Receiver<Delivery> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.awaited
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(source.to_string(), tx);
        self.mailbox.awaited(source);
        rx
    }

    /// The caller awaiting mail from `source` is gone (answered, or it gave up): its mail still
    /// waiting, and not saved, is not served. How many were taken out.
    pub fn forget_reply(&self, source: &str) -> usize {
        // The mail first: were the caller forgotten first, a batch taken in between would
        // serve it as any mail.
        let withdrawn = self.mailbox.unawaited(source);
        self.awaited
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(source);
        withdrawn
    }

    /// The next batch of mail to serve: a mail whose sender awaits its reply is served alone,
    /// so that the reply it is handed answers that mail (calls made together each got the reply
    /// to the last of them).
    fn next_batch(&self) -> super::mail::Batch {
        let awaited = self.awaited.lock().unwrap_or_else(|e| e.into_inner());
        if awaited.is_empty() {
            return self.mailbox.take();
        }
        self.mailbox.take_apart(|m| awaited.contains_key(&m.source))
    }

    /// Whether a caller awaits the reply to a mail of `batch`: the reply goes to it.
    fn awaited_by(&self, batch: &[super::mail::Mail]) -> bool {
        let awaited = self.awaited.lock().unwrap_or_else(|e| e.into_inner());
        !awaited.is_empty() && batch.iter().any(|m| awaited.contains_key(&m.source))
    }

    /// Hands `d` to the callers awaiting a reply to any mail of `batch`; whether there were any.
    fn answer_awaited(&self, batch: &[super::mail::Mail], d: &Delivery) -> bool {
        let mut awaited = self.awaited.lock().unwrap_or_else(|e| e.into_inner());
        if awaited.is_empty() {
            return false;
        }
        let mut any = false;
        for m in batch {
            if let Some(tx) = awaited.remove(&m.source) {
                any |= tx.send(d.clone()).is_ok();
            }
        }
        any
    }

    pub fn name(&self) -> &str {
        &self.spec.name
    }

    /// The most mails that may wait for it.
    pub fn mailbox_capacity(&self) -> usize {
        self.mailbox.capacity()
    }

    pub fn state(&self) -> State {
        State::from_u8(self.state.load(Ordering::Relaxed))
    }

    pub(crate) fn set_state(&self, s: State) {
        self.state.store(s as u8, Ordering::Relaxed);
    }

    pub(crate) fn restarted(&self) {
        self.restarts.fetch_add(1, Ordering::Relaxed);
        self.set_state(State::Restarting);
    }

    pub fn info(&self) -> ResidentInfo {
        ResidentInfo {
            name: self.spec.name.clone(),
            state: self.state(),
            conversation: self.conversation_len.load(Ordering::Relaxed),
            held: self.mailbox.len(),
            dropped: self.mailbox.dropped(),
            restarts: self.restarts.load(Ordering::Relaxed),
            error: self.blocked_by(),
            refused: self.mailbox.refused(),
            served: self.mailbox.served_count(),
            node: None,
        }
    }

    /// The error that blocked it, while it is blocked.
    pub fn blocked_by(&self) -> Option<TurnError> {
        self.blocked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_deref()
            .cloned()
    }

    /// Why it cannot go on, while it is in an outage ("it cannot reach its model (...)").
    pub fn failing_because(&self) -> Option<String> {
        self.failing
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_deref()
            .map(str::to_string)
    }

    fn set_failing(&self, why: Option<&str>) {
        *self.failing.lock().unwrap_or_else(|e| e.into_inner()) = why.map(Box::from);
    }

    /// Lets a blocked resident try again now (its settings were changed some other way than the
    /// config file). Answers whether it was blocked. From here on it counts as busy.
    pub fn unblock(&self) -> bool {
        let was = self
            .blocked
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .is_some();
        if was {
            self.set_state(State::Busy);
            self.unblocked.notify_one();
        }
        was
    }

    /// Blocks it, and `announce`s it under the same lock: whoever sees it blocked
    /// ([`Resident::blocked_by`]) knows the announcement has been made.
    fn block(&self, error: TurnError, announce: impl FnOnce(&TurnError)) {
        let mut slot = self.blocked.lock().unwrap_or_else(|e| e.into_inner());
        self.set_state(State::Blocked);
        announce(&error);
        *slot = Some(Box::new(error));
    }

    /// Whether it is waiting with nothing to do: idle with no mail and no turn to finish (one
    /// restored mid-turn is idle only until its task starts).
    pub(crate) fn at_rest(&self) -> bool {
        self.state() == State::Idle && self.mailbox.is_empty() && !self.mid_turn()
    }

    /// Resumes from a saved cell: its conversation, its backlog, its journal.
    pub fn restore(&self, cell: SavedResident) {
        self.commit(cell.messages);
        self.mailbox.restore(cell.backlog);
        *self.journal.lock().unwrap_or_else(|e| e.into_inner()) = cell.journal;
    }

    /// Whether the conversation stops in the middle of a turn (calls without results, or
    /// results the model has not read): the resident continues it before taking new mail. A
    /// turn that reached its `max_steps` ends with the results of the calls it did not run, and
    /// is over: read as unfinished, it kept the program from ever being at rest (a watch that
    /// never returned) and would have been continued after a restart.
    fn mid_turn(&self) -> bool {
        self.lock().last().is_some_and(|m| {
            (m.role == crate::vocab::Role::Tool && !crate::turn::take_turn::ended_at_step_limit(m))
                || (m.role == crate::vocab::Role::Assistant && m.tool_calls().next().is_some())
        })
    }

    /// A copy of the stored conversation.
    pub fn conversation(&self) -> Vec<Message> {
        self.lock().clone()
    }

    /// Where its usage is counted: the program's store, else its own memory.
    fn usage_store<'a>(&'a self, host: &'a dyn Host) -> &'a dyn Store {
        match host.store() {
            Some(store) => &**store,
            None => &**self
                .local_usage
                .get_or_init(|| Arc::new(crate::store::memory::MemoryStore::new())),
        }
    }

    /// Adds a turn's usage (and its cost, at the config's prices) to the store. `steps`: the
    /// model calls it made, each of which used tokens whether reported or not.
    fn record_usage(&self, host: &dyn Host, usage: &Usage, steps: u32) {
        let reported = usage.input + usage.output + usage.cache_read + usage.cache_write > 0;
        self.usage_unreported
            .store(steps > 0 && !reported, Ordering::Relaxed);
        // A turn that called a model is counted even when its server reported no tokens:
        // `colony usage` shows its turns (it showed nothing).
        if !reported && steps == 0 {
            return;
        }
        let cost = host
            .core()
            .resolve(&self.spec.ask.overrides)
            .ok()
            .and_then(|r| {
                let prices = host.core().config().prices.clone().unwrap_or_default();
                prices.cost(&r.endpoint.provider, &r.model, usage)
            });
        self.add_spent(host, &budget::Spent::of(usage, cost));
    }

    /// Adds `spent` to its usage now, with what could not be recorded before; what cannot be
    /// recorded now either is kept for the next time.
    fn add_spent(&self, host: &dyn Host, spent: &budget::Spent) {
        if let Err(e) = self.record_with_kept(host, Some(spent)) {
            static SAID: crate::said::SaidEvery = crate::said::SaidEvery::new();
            if let Some(n) = SAID.say() {
                tracing::warn!(
                    ai = %self.spec.name,
                    "its usage could not be recorded (kept to record later): {e}{}",
                    crate::said::also(n)
                );
            }
        }
    }

    /// Records the usage kept unrecorded, if any: `Err` while it still cannot be.
    fn record_unsaved(&self, host: &dyn Host) -> Result<(), String> {
        self.record_with_kept(host, None).map_err(|e| e.to_string())
    }

    /// Records `spent` (if any) with the usage kept unrecorded; on failure both are kept, with
    /// what another thread kept meanwhile. The kept usage is taken out, not locked across the
    /// store's write: a tool's or a source's model call pays from another thread meanwhile.
    fn record_with_kept(
        &self,
        host: &dyn Host,
        spent: Option<&budget::Spent>,
    ) -> crate::store::StoreResult<()> {
        let kept = self
            .unsaved
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        let mut all = match (kept, spent) {
            (None, None) => return Ok(()),
            (Some(kept), None) => *kept,
            (None, Some(spent)) => spent.clone(),
            (Some(kept), Some(spent)) => {
                let mut all = *kept;
                all.add(spent);
                all
            }
        };
        let recorded = budget::record(
            self.usage_store(host),
            &self.spec.name,
            chrono::Utc::now(),
            &all,
        );
        if recorded.is_err() {
            let mut unsaved = self.unsaved.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(meanwhile) = unsaved.as_deref() {
                all.add(meanwhile);
            }
            *unsaved = Some(Box::new(all));
        }
        recorded
    }

    /// Adds what a model call made on its behalf used (by a tool handler of its turn, by one
    /// of its sources: not a turn of its own) to its usage, at that call's prices.
    pub(crate) fn pay(&self, host: &dyn Host, usage: &Usage, provider: &str, model: &str) {
        let prices = host.core().config().prices.clone().unwrap_or_default();
        self.add_spent(
            host,
            &budget::Spent {
                turns: 0,
                ..budget::Spent::of(usage, prices.cost(provider, model, usage))
            },
        );
    }

    /// Why a model call made for it outside its turns (by a source, or a tool it called) may
    /// not be made now: a budget spent, and when it resets (the message says).
    pub(crate) fn budget_refusal(&self, host: &dyn Host) -> Option<String> {
        // "over its budget of 20 tokens per day (30 used); it resets at ..."
        self.over_budget(host)
            .map(|over| format!("{} is {}", self.spec.name, over.message))
    }

    /// Whether its budgets let it start a turn now.
    fn over_budget(&self, host: &dyn Host) -> Option<budget::Over> {
        if self.spec.budgets.is_empty() {
            return None;
        }
        let currency = host
            .core()
            .config()
            .prices
            .as_ref()
            .map(|p| p.currency().to_string())
            .unwrap_or_else(|| super::budget_prices::DEFAULT_CURRENCY.to_string());
        if let Some(message) = self.unmeasurable(host) {
            // Blocked until the settings change (a price added): the config is polled.
            return Some(budget::Over {
                message,
                resets_at: chrono::Utc::now() + chrono::Duration::hours(1),
            });
        }
        // Usage spent and not counted must not let it spend on: it waits until it is.
        if let Err(e) = self.record_unsaved(host) {
            return Some(budget::Over {
                message: format!("its usage could not be recorded ({e}); it waits until it can be"),
                resets_at: chrono::Utc::now() + chrono::Duration::minutes(1),
            });
        }
        let store = self.usage_store(host);
        match budget::over(
            store,
            &self.spec.name,
            &self.spec.budgets,
            &currency,
            chrono::Utc::now(),
        ) {
            Ok(over) => over,
            Err(e) => {
                // A store that cannot be read must not spend without bound: blocked a minute.
                tracing::warn!(ai = %self.spec.name, "its budget could not be read: {e}");
                Some(budget::Over {
                    message: format!("its usage could not be read ({e})"),
                    resets_at: chrono::Utc::now() + chrono::Duration::minutes(1),
                })
            }
        }
    }

    /// Why its budgets cannot be kept, if they cannot: a cost budget for a model the price
    /// table has no price for, or a token budget for a model that reported no usage for the
    /// last turn. Either was never reached (a budget that blocked nothing, without a word).
    fn unmeasurable(&self, host: &dyn Host) -> Option<String> {
        let budgets = &self.spec.budgets;
        let resolved = || host.core().resolve(&self.spec.ask.overrides).ok();
        if budgets.in_cost()
            && let Some(r) = resolved()
        {
            let prices = host.core().config().prices.clone().unwrap_or_default();
            if prices.find(&r.endpoint.provider, &r.model).is_none() {
                return Some(format!(
                    "a cost budget cannot be kept: {}/{} has no price (add one under [prices] \
                     in the config, or give the budget in tokens)",
                    r.endpoint.provider, r.model
                ));
            }
        }
        if budgets.in_tokens() && self.usage_unreported.load(Ordering::Relaxed) {
            let model = resolved()
                .map(|r| format!("{}/{}", r.endpoint.provider, r.model))
                .unwrap_or_else(|| "its model".into());
            return Some(format!(
                "a token budget cannot be kept: {model} reported no token usage colony could \
                 read for the last turn, so what it spends cannot be counted (have its server \
                 report usage)"
            ));
        }
        None
    }

    fn lock(&self) -> MutexGuard<'_, Vec<Message>> {
        self.conversation.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn commit(&self, messages: Vec<Message>) {
        self.conversation_len
            .store(messages.len(), Ordering::Relaxed);
        *self.lock() = messages;
    }
}

/// What the resident loop needs from its route.
pub(crate) trait Host: Send + Sync {
    fn core(&self) -> &crate::core::Core;
    fn script(&self) -> &dyn Script;
    fn stopping(&self) -> bool;
    fn store(&self) -> Option<&Arc<dyn Store>>;
    /// A resident took up work (or left a wait): whatever concluded the program had settled
    /// must look again.
    fn stirred(&self);
    /// A resident went idle or blocked (its notice out, its event reported): the program may
    /// have settled.
    fn settling(&self);
    /// Reports an event to the route's watcher.
    fn report(&self, event: RouteEvent);
    /// Tells the route's observer, if it has one, what happened.
    fn observe(&self, observation: Observation);
    /// The route's observer, if it has one (to hand a turn's hooks and stack).
    fn observer(&self) -> Option<&super::observe::Observer> {
        None
    }
}

/// The resident's outage, while it lasts.
struct Outage {
    retry_at: tokio::time::Instant,
    backoff: Duration,
    /// Garbled answers in a row ([`GARBLED_IN_A_ROW`]).
    garbled: u32,
    /// What fails: its model, or its store (a full disk), which the notices name.
    cause: Cause,
}

#[derive(Clone, Copy)]
enum Cause {
    Model,
    Store,
}

impl Cause {
    fn of(error: &TurnError) -> Cause {
        if error.kind == "store" {
            Cause::Store
        } else {
            Cause::Model
        }
    }

    /// `[colony] w cannot ... (why)`.
    fn failing(self) -> &'static str {
        match self {
            Cause::Model => "cannot reach its model",
            Cause::Store => "cannot save its progress to its store",
        }
    }

    /// `[colony] w ... again after 1.0 s`.
    fn working(self) -> &'static str {
        match self {
            Cause::Model => "reaches its model",
            Cause::Store => "saves its progress",
        }
    }
}

/// How often a blocked resident looks at the config file.
const CONFIG_POLL: Duration = Duration::from_secs(1);

/// A garbled answer (JSON that is not the API's, a body that is not UTF-8, no choices) blocks
/// a resident only when it comes this many times in a row; before, it is an outage. Once may
/// be a proxy's hiccup, and blocking on it held every mail until someone edited the config;
/// each is a paid call, so not tried for ever.
const GARBLED_IN_A_ROW: u32 = 3;

const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(60);
const MAX_WAIT: Duration = Duration::from_secs(600);

/// What a resident's loop carries from one turn to the next.
/// The rows a turn's commits did not remove ([`Carried::unserved`]).
fn left_unserved(hooks: Option<&ResidentHooks>) -> Vec<i64> {
    hooks.map(ResidentHooks::unserved).unwrap_or_default()
}

#[derive(Default)]
struct Carried {
    outage: Option<Outage>,
    /// Blocked: the config's generation when it was, so a re-read file lets it try again.
    blocked: Option<u64>,
    /// How many times it was blocked since its last turn that went through: an unblock after
    /// the second waits before its try ([`unblocked_wait`]).
    blocks_in_a_row: u32,
    /// Since when the model could not be called (an outage or a block), for the recovery notice.
    trouble_since: Option<Instant>,
    /// A turn cut short after a step ran (or by a restart): the next attempt continues it even
    /// without new mail.
    unfinished: bool,
    /// The mail a continued turn serves is the one its first attempt took.
    serving: Option<Provenance>,
    /// The conversation's size as last reported, for compaction across turns.
    reported_tokens: Option<u64>,
    /// Blocked by a budget: when its window resets.
    budget_resets: Option<tokio::time::Instant>,
    /// Backlog rows of mail already in the conversation whose removal has not landed yet (a
    /// turn whose first commit failed after its step ran, or whose final answer could not be
    /// saved): the next commit removes them with its own. Forgotten, a later commit saved the
    /// conversation with the mail in it and left its row, which the next owner served again.
    unserved: Vec<i64>,
}

/// Runs the resident until the route stops, it is dismissed (its mailbox closed), or it crashes
/// (its delivery raised). A restart calls this again with the same [`Resident`].
///
/// This loop only waits; a turn, and every rarer wait, is a boxed future of its own. A future
/// is as large as the largest state it can be in, and every idle resident's task holds this
/// one: with the turn inline it was 2 KB, most of an idle resident's cost.
pub(crate) async fn live(host: &dyn Host, me: &Resident) -> Exit {
    let mut carried = Carried {
        unfinished: me.mid_turn(),
        ..Carried::default()
    };
    loop {
        if host.stopping() || me.mailbox.is_closed() {
            me.set_state(State::Stopped);
            let waiting = me.mailbox.len();
            if host.stopping() && waiting > 0 && !me.spec.persist {
                // Accepted (a 202 from `colony serve`, `true` from `ai.mail`) and now gone: say so.
                tracing::warn!(
                    "[{}] stopped with {waiting} mail(s) not served; it does not keep its \
                     conversation (persist_conversation), so they are dropped",
                    me.spec.name
                );
            }
            return Exit::Normal;
        }
        if let Some(generation) = carried.blocked {
            Box::pin(wait_unblocked(host, me, generation, carried.budget_resets)).await;
            if host.stopping() || me.mailbox.is_closed() {
                continue;
            }
            carried.blocked = None;
            carried.budget_resets = None;
            // A changed config (a fix, perhaps) is tried at once; an unblock asked again and
            // again (`on_blocked` calling `ai.unblock`) waits.
            let fixed = host.core().refresh_config() != generation;
            match unblocked_wait(carried.blocks_in_a_row).filter(|_| !fixed) {
                None => tracing::info!(ai = %me.spec.name, "unblocked: trying again"),
                Some(wait) => {
                    tracing::warn!(
                        ai = %me.spec.name,
                        "unblocked: trying again in {:.0} s (blocked {} times in a row)",
                        wait.as_secs_f64(),
                        carried.blocks_in_a_row
                    );
                    Box::pin(wait_unblocked_again(host, me, generation, wait)).await;
                    if host.stopping() || me.mailbox.is_closed() {
                        continue;
                    }
                }
            }
        } else if let Some(o) = &carried.outage {
            me.set_state(State::Outage);
            Box::pin(wait_outage(host, me, o.retry_at)).await;
            if host.stopping() || me.mailbox.is_closed() {
                continue;
            }
        } else if me.mailbox.is_unsure() && !carried.unfinished {
            Box::pin(resync(host, me, &carried.unserved)).await;
            continue;
        } else if me.mailbox.is_empty() && !carried.unfinished {
            me.set_state(State::Idle);
            host.settling();
            me.mailbox.notified().await;
            continue;
        }
        if let Some(exit) = Box::pin(serve(host, me, &mut carried)).await {
            return exit;
        }
    }
}

/// How long a resident whose saved backlog could not be compared with its queue waits before
/// it tries again (the store is down; the mail it may have kept is served once it is back).
const RESYNC_AGAIN: Duration = Duration::from_secs(2);

/// Compares the saved backlog with the queue after a save that failed ([`Mailbox::resync`]);
/// when the store cannot be read yet, waits a little (or for mail) and leaves it for the next
/// time round.
async fn resync(host: &dyn Host, me: &Resident, unserved: &[i64]) {
    let Some(store) = host.store().filter(|_| me.spec.persist) else {
        // Nothing kept: nothing to compare.
        let _ = me.mailbox.resync(|| Ok::<_, ()>(Vec::new()), unserved);
        return;
    };
    let store = store.clone();
    let name = me.spec.name.clone();
    let found = me.mailbox.resync(
        || {
            store
                .load_cell(&name)
                .map(|cell| cell.map(|c| c.backlog).unwrap_or_default())
        },
        unserved,
    );
    match found {
        Ok(0) => {}
        Ok(n) => tracing::warn!(
            ai = %me.spec.name,
            "{n} mail(s) whose save was answered as failed had been kept: serving them"
        ),
        Err(e) => {
            tracing::debug!(ai = %me.spec.name, "cannot compare its saved backlog yet: {e}");
            me.set_state(State::Idle);
            host.settling();
            tokio::select! {
                _ = tokio::time::sleep(RESYNC_AGAIN) => {}
                _ = me.mailbox.notified() => {}
            }
        }
    }
}

/// How long an unblocked resident waits before it tries again, having been blocked `in_a_row`
/// times since its last turn went through: at once the first time, then 1 s, doubling up to
/// [`MAX_BACKOFF`]. An `on_blocked` that calls `ai.unblock` (as the API invites) tried a refused
/// key again at once, blocked, and was called again: a request every few milliseconds, for ever.
fn unblocked_wait(in_a_row: u32) -> Option<Duration> {
    let doublings = in_a_row.checked_sub(2)?;
    Some(
        FIRST_BACKOFF
            .saturating_mul(1u32 << doublings.min(16))
            .min(MAX_BACKOFF),
    )
}

/// [`unblocked_wait`]'s wait: over early if the config changes (a fix is tried at once) or the
/// program stops.
async fn wait_unblocked_again(host: &dyn Host, me: &Resident, generation: u64, wait: Duration) {
    let until = tokio::time::Instant::now() + wait;
    while tokio::time::Instant::now() < until
        && !host.stopping()
        && !me.mailbox.is_closed()
        && host.core().refresh_config() == generation
    {
        tokio::select! {
            _ = tokio::time::sleep_until(until.min(tokio::time::Instant::now() + CONFIG_POLL)) => {}
            _ = me.mailbox.notified() => {}
        }
    }
}

/// Blocked: mail arriving meanwhile is kept; only a change of settings (or the budget's reset,
/// or `ai.unblock`) is worth a new try.
async fn wait_unblocked(
    host: &dyn Host,
    me: &Resident,
    generation: u64,
    budget_resets: Option<tokio::time::Instant>,
) {
    while me.blocked_by().is_some() && !host.stopping() && !me.mailbox.is_closed() {
        tokio::select! {
            _ = me.unblocked.notified() => {}
            _ = me.mailbox.notified() => {}
            _ = tokio::time::sleep_until(budget_resets.unwrap_or_else(tokio::time::Instant::now)),
                if budget_resets.is_some() => {
                me.unblock();
            }
            _ = tokio::time::sleep(CONFIG_POLL) => {
                if host.core().refresh_config() != generation {
                    me.unblock();
                }
            }
        }
    }
}

/// In an outage: mail arriving meanwhile is held, not a reason to call a model that is down.
async fn wait_outage(host: &dyn Host, me: &Resident, retry_at: tokio::time::Instant) {
    let wake = tokio::time::sleep_until(retry_at);
    tokio::pin!(wake);
    loop {
        tokio::select! {
            _ = &mut wake => break,
            _ = me.mailbox.notified() => {
                if host.stopping() || me.mailbox.is_closed() {
                    break;
                }
            }
        }
    }
}

/// One turn (or the notice that the budget blocks it): `Some` when the resident's life ends.
async fn serve(host: &dyn Host, me: &Resident, carried: &mut Carried) -> Option<Exit> {
    let Carried {
        outage,
        blocked,
        blocks_in_a_row,
        trouble_since,
        unfinished,
        serving,
        reported_tokens,
        budget_resets,
        unserved,
    } = carried;
    if let Some(over) = me.over_budget(host) {
        // Nothing is taken from the mailbox: the mail waits, saved, for the window's reset.
        let generation = host.core().refresh_config();
        let error = TurnError {
            kind: "budget".into(),
            message: over.message,
            permanent: true,
            ..TurnError::default()
        };
        let held = me.mailbox.len();
        let kept = kept_while(me);
        tracing::warn!(ai = %me.spec.name, "blocked: budget: {} (its mail is kept{kept})", error.message);
        let text = format!(
            "[colony] {} is blocked: budget: {}. Its {held} waiting arrival(s) are kept{kept}; \
             it tries again when the window resets, the config file changes or ai.unblock({:?}) \
             is called.",
            me.spec.name, error.message, me.spec.name
        );
        if let Err(e) = announce_block(host, me, error, text, held, serving.as_ref()).await {
            return Some(Exit::Crashed(e));
        }
        let wait = (over.resets_at - chrono::Utc::now())
            .to_std()
            .unwrap_or_default();
        *budget_resets = Some(tokio::time::Instant::now() + wait);
        *blocked = Some(generation);
        *blocks_in_a_row += 1;
        host.settling();
        return None;
    }
    me.set_state(State::Busy);
    host.stirred();
    // A turn to finish comes first: new mail after calls that have no results yet would
    // break the transcript, so it waits for the next turn.
    let batch = if *unfinished {
        Batch::default()
    } else {
        me.next_batch()
    };
    // In trouble, what waits behind this batch was held too (the recovery's notice counts it);
    // not looked at otherwise, on every turn.
    let held_behind = if trouble_since.is_some() {
        me.mailbox.len()
    } else {
        0
    };
    let provenance = if *unfinished {
        // After a restart the mail is no longer at hand: its messages say where it came from.
        serving
            .clone()
            .or_else(|| Provenance::resumed(&me.lock(), &me.spec.name))
    } else {
        Provenance::of(&batch.mail)
    };
    *serving = provenance.clone();
    // Someone looking on (colony serve's API and dashboard) reads the conversation while the
    // turn runs: it keeps the committed copy (taken, it read as empty for the whole turn).
    let mut messages = if host.observer().is_some() {
        me.lock().clone()
    } else {
        std::mem::take(&mut *me.lock())
    };
    let before = messages.len();
    if batch.dropped > 0 {
        messages.push(Message::user(dropped_marker(batch.dropped)));
    }
    messages.extend(batch.mail.iter().map(super::Mail::as_user_message));
    let mut ask = me.spec.ask.clone();
    ask.messages = messages;
    let mut turn = TurnSpec::new(ask);
    turn.tools = me.spec.tools.clone();
    turn.dynamic = me.spec.changing_tools.clone();
    turn.max_steps = me.spec.max_steps;
    turn.compaction = me.spec.compaction.clone();
    turn.provenance = provenance.clone();
    turn.workspace = me.spec.workspace.clone();
    turn.reported_tokens = *reported_tokens;
    let hooks = host.store().map(|store| {
        let journal = std::mem::take(&mut *me.journal.lock().unwrap_or_else(|e| e.into_inner()));
        // A resident that keeps its conversation drops nothing (`batch.dropped` is 0), and each
        // mail it holds was saved.
        let mut served = std::mem::take(unserved);
        served.extend(batch.mail.iter().filter_map(|m| m.saved));
        Arc::new(ResidentHooks::new(
            store.clone(),
            &me.spec.name,
            me.spec.persist,
            journal,
            served,
        ))
    });
    turn.hooks = hooks.clone().map(|h| h as Arc<dyn TurnHooks>);
    // Someone looks on: each tool call is told as it ends, each model step as it answers.
    let observer = host.observer();
    if let Some(observer) = observer {
        turn.hooks = Some(Arc::new(ObservedHooks {
            ai: me.spec.name.clone(),
            observer: observer.clone(),
            inner: turn.hooks.take(),
        }));
    }
    let span = tracing::info_span!("resident", ai = %me.spec.name);
    host.observe(Observation::TurnStarted {
        ai: me.spec.name.clone(),
        mails: batch.mail.len(),
    });
    let began = Instant::now();
    let mut cut = SpentIfCut {
        host,
        me,
        hooks: hooks.clone(),
    };
    let out: TurnOutcome = {
        use tracing::Instrument;
        match observer {
            Some(observer) => {
                let timed = Timed {
                    ai: &me.spec.name,
                    observer,
                    inner: &*me.spec.stack,
                };
                Box::pin(take_turn(host.core(), &timed, host.script(), turn))
                    .instrument(span)
                    .await
            }
            None => {
                Box::pin(take_turn(host.core(), &*me.spec.stack, host.script(), turn))
                    .instrument(span)
                    .await
            }
        }
    };
    cut.hooks = None;
    drop(cut);
    host.observe(Observation::TurnEnded(report(me, &out, &batch, began)));
    me.record_usage(host, &out.usage, out.steps);
    if let Some(error) = &out.error {
        if host.stopping() {
            // Cut off by the stop: keep what happened (a restart resumes it), say nothing.
            let mut messages = out.messages;
            if out.steps == 0 && out.compactions == 0 && !out.resumed {
                messages.truncate(before);
                me.mailbox.put_back(batch);
            } else {
                me.mailbox.served(&batch, false);
            }
            me.commit(messages);
            me.set_state(State::Stopped);
            return Some(Exit::Normal);
        }
        let garbled = error.kind == "parse_error";
        let in_a_row = outage.as_ref().map_or(0, |o| o.garbled) + u32::from(garbled);
        let blocks = error.permanent && !(garbled && in_a_row < GARBLED_IN_A_ROW);
        let nothing_happened = out.steps == 0 && out.compactions == 0 && !out.resumed;
        *unserved = left_unserved(hooks.as_deref());
        if nothing_happened {
            // Its mail goes back to the queue, rows and all.
            unserved.retain(|row| !batch.mail.iter().any(|m| m.saved == Some(*row)));
        }
        let mut messages = out.messages;
        let held = if nothing_happened {
            messages.truncate(before);
            me.commit(messages);
            if blocks {
                me.mailbox.keep(batch);
            } else {
                me.mailbox.put_back(batch);
            }
            me.mailbox.len()
        } else {
            me.commit(messages);
            me.mailbox.served(&batch, false);
            *unfinished = true;
            0
        };
        trouble_since.get_or_insert_with(Instant::now);
        if blocks {
            *outage = None;
            me.set_failing(None);
            // Read before the notice: a fix saved while it goes out is a change.
            let generation = host.core().refresh_config();
            let then = if host.core().is_replaying() {
                "a cassette's answers do not change, so the run ends"
            } else {
                "it tries again when the config file changes or ai.unblock is called"
            };
            let kept = kept_while(me);
            tracing::warn!(
                ai = %me.spec.name,
                "blocked: {}: {} (its mail is kept{kept}; {then})",
                error.kind,
                error.message
            );
            let text = format!(
                "[colony] {} is blocked: {}: {}. Its {held} waiting arrival(s) are kept{kept}; \
                 it tries again when the config file changes or ai.unblock({:?}) is called.",
                me.spec.name, error.kind, error.message, me.spec.name
            );
            let error = error.clone();
            if let Err(e) = announce_block(host, me, error, text, held, provenance.as_ref()).await {
                return Some(Exit::Crashed(e));
            }
            *blocked = Some(generation);
            *blocks_in_a_row += 1;
            host.settling();
            return None;
        }
        let wait = |backoff: Duration| {
            error
                .retry_after
                .map(|d| d.min(MAX_WAIT))
                .unwrap_or(backoff)
        };
        // Why, as a caller awaiting its reply is told: its model, or its store (a full disk).
        me.set_failing(Some(&format!(
            "it {} ({})",
            Cause::of(error).failing(),
            error.message
        )));
        // When it tries again, said: a provider's retry-after (up to ten minutes) kept a
        // resident silent that long.
        let next = |wait: Duration| match error.retry_after {
            // A wait past the longest duration was read as that longest: "asked for 31536000
            // s" misquoted a provider that asked for 99999999.
            Some(asked) if asked >= crate::duration::MAX => format!(
                "trying again in {:.0} s (the provider asked for a year or more)",
                wait.as_secs_f64()
            ),
            Some(asked) if asked > MAX_WAIT => format!(
                "trying again in {:.0} s (the provider asked for {:.0} s)",
                wait.as_secs_f64(),
                asked.as_secs_f64()
            ),
            Some(_) => format!(
                "trying again in {:.1} s, as the provider asked",
                wait.as_secs_f64()
            ),
            None => format!("trying again in {:.1} s", wait.as_secs_f64()),
        };
        match outage {
            Some(o) => {
                o.backoff = (o.backoff * 2).min(MAX_BACKOFF);
                let wait = wait(o.backoff);
                o.retry_at = tokio::time::Instant::now() + wait;
                o.garbled = in_a_row * u32::from(garbled);
                static SAID: crate::said::SaidEvery = crate::said::SaidEvery::new();
                if let Some(n) = SAID.say() {
                    tracing::warn!(
                        ai = %me.spec.name,
                        "outage goes on: {}; {}{}",
                        error.message,
                        next(wait),
                        crate::said::also(n)
                    );
                }
            }
            None => {
                tracing::warn!(
                    ai = %me.spec.name,
                    error = %error.message,
                    "outage: holding arrivals; {}",
                    next(wait(FIRST_BACKOFF))
                );
                let cause = Cause::of(error);
                *outage = Some(Outage {
                    retry_at: tokio::time::Instant::now() + wait(FIRST_BACKOFF),
                    backoff: FIRST_BACKOFF,
                    garbled: u32::from(garbled),
                    cause,
                });
                let holding = if me.spec.persist {
                    "keeping every arrival".to_string()
                } else {
                    format!("holding the newest {HELD} arrivals")
                };
                // When it tries again, in the notice too: a host reading only its notices
                // (a provider's retry-after of ten minutes) saw a resident gone quiet.
                let notice = Delivery {
                    text: format!(
                        "[colony] {} {} ({}); {holding} until it can ({}).",
                        me.spec.name,
                        cause.failing(),
                        error.message,
                        next(wait(FIRST_BACKOFF))
                    ),
                    error: Some(error.message.clone()),
                    held,
                    ..delivery(me, DeliveryKind::Outage, provenance.as_ref(), None)
                };
                host.report(RouteEvent::Notice(notice.clone()));
                if let Err(e) = Box::pin(deliver(me, notice)).await {
                    return Some(Exit::Crashed(e));
                }
            }
        }
        return None;
    }
    *unfinished = false;
    *blocks_in_a_row = 0;
    *reported_tokens = out.reported_tokens;
    *unserved = left_unserved(hooks.as_deref());
    me.mailbox.served(&batch, true);
    let mut messages = out.messages;
    let reply = out.reply;
    // A reply a caller awaits (an MCP call to an exported resident) is delivered to it.
    if matches!(me.spec.deliver, Deliver::Nobody)
        && !reply.trim().is_empty()
        && !me.awaited_by(&batch.mail)
    {
        messages.push(Message::user(UNDELIVERED_NOTE));
        if let Some(h) = &hooks {
            h.save(&messages);
        }
    }
    me.commit(messages);
    let cause = outage.take().map_or(Cause::Model, |o| o.cause);
    if let Some(since) = trouble_since.take() {
        me.set_failing(None);
        // What was held is this turn's batch and what waited behind it as it began (a turn
        // that finished one cut short serves none itself: the notice said 0 while five were
        // then served); what arrived during the turn was never held.
        let held = batch.mail.len() + held_behind;
        let notice = Delivery {
            text: format!(
                "[colony] {} {} again after {:.1} s; {held} held {} served{}.",
                me.spec.name,
                cause.working(),
                since.elapsed().as_secs_f64(),
                if held == 1 {
                    "arrival is"
                } else {
                    "arrivals are"
                },
                if batch.dropped > 0 {
                    format!(" ({} older ones were dropped)", batch.dropped)
                } else {
                    String::new()
                }
            ),
            held,
            dropped: batch.dropped,
            ..delivery(me, DeliveryKind::Recovered, provenance.as_ref(), None)
        };
        host.report(RouteEvent::Notice(notice.clone()));
        if let Err(e) = Box::pin(deliver(me, notice)).await {
            return Some(Exit::Crashed(e));
        }
    }
    if reply.trim().is_empty() {
        // The model said nothing and did nothing (an empty `content`, Gemini's empty answer):
        // the mail is served without a word, which nobody would otherwise know.
        if out.tool_events.is_empty() && !batch.mail.is_empty() {
            tracing::warn!(
                ai = %me.spec.name,
                "its model answered nothing (no text, no tool call; stop: {}): {} mail(s) \
                 served without a reply",
                out.stop.as_str(),
                batch.mail.len()
            );
        }
        if !me.awaited_by(&batch.mail) {
            return None;
        }
        // A caller awaiting this turn's reply is told there is none now: it waited out its
        // whole deadline (300 s by default) for a reply that was never coming.
        let none = Delivery {
            text: String::new(),
            stop: Some(out.stop.as_str()),
            steps: out.steps,
            usage: out.usage,
            ..delivery(me, DeliveryKind::Reply, provenance.as_ref(), Some(out.stop))
        };
        me.answer_awaited(&batch.mail, &none);
        return None;
    }
    let d = Delivery {
        text: reply,
        stop: Some(out.stop.as_str()),
        steps: out.steps,
        usage: out.usage,
        ..delivery(me, DeliveryKind::Reply, provenance.as_ref(), Some(out.stop))
    };
    if me.answer_awaited(&batch.mail, &d) {
        return None;
    }
    if let Err(e) = Box::pin(deliver(me, d)).await {
        return Some(Exit::Crashed(e));
    }
    None
}

/// Records what a turn's model calls spent when the turn is cut before it ends: its task
/// aborted at the end of a stop's grace (a second Ctrl-C, `--max-time`), a dismissal. The
/// turn's outcome never comes, and what it had spent was lost: a budget undercounted every
/// stopped run, and `colony usage` showed nothing of it. A turn that ends is recorded from its
/// outcome (taking `hooks` out disarms this).
struct SpentIfCut<'a> {
    host: &'a dyn Host,
    me: &'a Resident,
    hooks: Option<Arc<ResidentHooks>>,
}

impl Drop for SpentIfCut<'_> {
    fn drop(&mut self) {
        if let Some(hooks) = &self.hooks {
            let (usage, steps) = hooks.take_spent();
            if steps > 0 {
                self.me.record_usage(self.host, &usage, steps);
            }
        }
    }
}

/// How long a blocked resident's mail is kept, as its notice says: a resident that does not
/// keep its conversation loses it when the program ends (it said "kept", then dropped it).
fn kept_while(me: &Resident) -> &'static str {
    if me.spec.persist {
        ""
    } else {
        " while the program runs"
    }
}

/// Sends the notice that `me` is blocked by `error` (`text`, with `held` arrivals kept), then
/// marks it blocked and reports it; `Err` is what its delivery raised.
async fn announce_block(
    host: &dyn Host,
    me: &Resident,
    error: TurnError,
    text: String,
    held: usize,
    provenance: Option<&Provenance>,
) -> Result<(), Fault> {
    let notice = Delivery {
        text,
        error: Some(error.message.clone()),
        blocked: Some(error.clone()),
        held,
        ..delivery(me, DeliveryKind::Blocked, provenance, None)
    };
    Box::pin(deliver(me, notice)).await?;
    me.block(error, |error| {
        host.report(RouteEvent::Blocked {
            ai: me.spec.name.clone(),
            error: error.clone(),
        })
    });
    Ok(())
}

/// The observer's account of a turn.
fn report(me: &Resident, out: &TurnOutcome, batch: &Batch, began: Instant) -> TurnReport {
    let duration = began.elapsed();
    // Calls of one step may run at once: their sum can pass the wall time.
    let tools: Duration = out.tool_events.iter().map(|e| e.duration).sum();
    let happened = out.error.is_none() || out.steps > 0 || out.compactions > 0 || out.resumed;
    TurnReport {
        ai: me.spec.name.clone(),
        served: if happened { batch.mail.len() } else { 0 },
        steps: out.steps,
        stop: out.stop.as_str(),
        usage: out.usage,
        tool_calls: out.tool_events.clone(),
        error: out.error.clone(),
        duration,
        model_time: duration.saturating_sub(tools),
    }
}

fn delivery(
    me: &Resident,
    kind: DeliveryKind,
    provenance: Option<&Provenance>,
    stop: Option<Stop>,
) -> Delivery {
    Delivery {
        ai: me.spec.name.clone(),
        kind,
        text: String::new(),
        origin: provenance.map(|p| p.origin.clone()),
        hop: provenance.map(|p| p.hop).unwrap_or(0),
        stop: stop.map(Stop::as_str),
        steps: 0,
        usage: Usage::default(),
        error: None,
        blocked: None,
        held: 0,
        dropped: 0,
    }
}

/// Hands `d` over; `Err` is what the script's `deliver_to` raised (a crash).
async fn deliver(me: &Resident, d: Delivery) -> Result<(), Fault> {
    match &me.spec.deliver {
        Deliver::Nobody => {
            // A block is logged where it happens.
            if !matches!(d.kind, DeliveryKind::Reply | DeliveryKind::Blocked) {
                tracing::warn!(ai = %d.ai, "{}", d.text);
            }
            Ok(())
        }
        Deliver::Channel(tx) => {
            let _ = tx.send(d);
            Ok(())
        }
        Deliver::Stdout => {
            use std::io::Write;
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "[{}] {}", d.ai, d.text);
            let _ = out.flush();
            Ok(())
        }
        Deliver::Script(script, func) => {
            let text = serde_json::Value::String(d.text.clone());
            let mut info = serde_json::to_value(&d).unwrap_or(serde_json::Value::Null);
            if let Some(map) = info.as_object_mut() {
                map.remove("text");
                if let Some(error) = &d.blocked {
                    // A blocked notice's error is a table, as the Lua API's errors are.
                    let mut error = serde_json::to_value(error).unwrap_or(serde_json::Value::Null);
                    // What blocks is permanent: `transient` is false, as `on_blocked` and
                    // `ai.residents()` read it (it was absent here alone).
                    if let Some(e) = error.as_object_mut() {
                        e.insert("transient".into(), false.into());
                    }
                    map.insert("error".into(), error);
                }
                // Absent is nil in Lua; JSON null would arrive as a (truthy) json.null.
                map.retain(|_, v| !v.is_null());
            }
            script
                .call(*func, vec![text, info])
                .await
                .map_err(|f| f.during("deliver_to"))
        }
    }
}
