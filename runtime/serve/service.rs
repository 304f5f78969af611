//! The service: the programs it hosts (each in a [`Slot`] that outlives its runs, so a failed
//! or stopped program still shows, and restarts in place), what their residents are observed
//! doing (turned into [`Events`] and [`Metrics`]), and the drain.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use dashmap::DashMap;
use serde::Serialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::{mpsc, watch};

use super::events::Events;
use super::host::{self, Hosted, Launch};
use super::metrics::{Metrics, ProgramNow};
use crate::core::Core;
use crate::embed::Runtime;
use crate::infer::breaker::BreakerState;
use crate::residents::{Delivery, DeliveryKind, Observation, RouteEvent};
use crate::turn::TurnError;

/// How many mail ids the service remembers, to accept each once (a resident that keeps its
/// conversation also remembers them in its state directory, across restarts).
const IDS_KEPT: usize = 100_000;

/// The wait before a program whose store or cluster could not be reached is started again,
/// doubling with each start that fails, up to [`START_AGAIN_MOST`].
const START_AGAIN_FIRST: Duration = Duration::from_secs(1);
const START_AGAIN_MOST: Duration = Duration::from_secs(60);

/// Where a program is in its life.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Starting,
    Running,
    /// Its script raised, or it could not start (the state directory is locked, say).
    Failed,
    /// Stopped (by the API, a signal, or because every resident was gone).
    Stopped,
}

/// One hosted program, across its runs.
pub struct Slot {
    pub name: String,
    /// What it is started from (SIGHUP may change it: a config entry edited).
    launch: Mutex<Launch>,
    now: Mutex<Now>,
    /// Runs ended so far (a restart waits for the one it stopped).
    ended: watch::Sender<u64>,
    /// One restart or stop at a time.
    ops: tokio::sync::Mutex<()>,
}

struct Now {
    phase: Phase,
    error: Option<String>,
    reason: Option<String>,
    hosted: Option<Arc<Hosted>>,
    runs: u64,
    /// The file's hash when this run started (SIGHUP restarts a program whose file changed).
    hash: Option<Vec<u8>>,
    /// Starts tried so far: a start tried again later goes ahead only if none came since.
    attempts: u64,
    /// Starts that failed since the last that worked (the wait before the next grows).
    failed_in_a_row: u32,
    /// When its start is tried again, if it is to be.
    again_at: Option<std::time::Instant>,
    /// Between a restart's stop and its start: no run, one coming.
    restarting: bool,
    /// Why its file on disk does not load, while its run goes on from the file before
    /// (`program_kept`): the API showed it running, no error, and the broken file was seen only
    /// by who caught the event.
    file_error: Option<String>,
    /// What of this run failed for good (a source or a resident past its restarts), newest
    /// last, at most [`FAILURES_KEPT`]: the program ran on, shown running with no error, and
    /// the failure was seen only by who caught its event (`colony run` ends 1 on it).
    failures: Vec<Value>,
    /// How many failed for good in this run, those [`FAILURES_KEPT`] let go included.
    failed_total: usize,
    /// The run's observer ([`observe`]), which ends once the run's route is let go, with the
    /// `turn_ended` of the turns the stop cut: a stop waits for it (a moment), so those come
    /// before the next run's events.
    observing: Option<tokio::task::JoinHandle<()>>,
}

/// The most failures of one run a program's view keeps (the newest).
const FAILURES_KEPT: usize = 32;

/// Per resident, what the observer tallied (for the API's view).
#[derive(Debug, Clone, Default, Serialize)]
pub struct Tally {
    pub tokens_in: u64,
    pub tokens_out: u64,
    pub turns: u64,
    pub last_error: Option<TurnError>,
}

/// A mail id as the service remembers it: program, recipient, id.
type MailKey = (String, String, String);

/// The ids accepted lately, each with whether its mail is durable (its recipient keeps its
/// conversation) and whether its post has settled, and their order (the oldest is forgotten
/// first).
#[derive(Default)]
struct IdMemory {
    seen: HashMap<MailKey, IdState>,
    /// Each id as it was remembered, with its number: an entry whose id was forgotten (and
    /// perhaps remembered again since, under another number) evicts nothing.
    order: VecDeque<(MailKey, u64)>,
    remembered: u64,
}

#[derive(Clone, Copy)]
struct IdState {
    durable: bool,
    /// Its mail was accepted; until then its post is in flight, and may yet be refused.
    settled: bool,
    /// Its number in `order`.
    at: u64,
}

/// What the service knows of a mail's id ([`Service::first_time`]).
#[derive(Debug, PartialEq, Eq)]
pub enum IdSeen {
    /// Not seen: now remembered, in flight until [`Service::settled`] or [`Service::forget`].
    New,
    /// Its mail was accepted: a duplicate.
    Accepted,
    /// A mail with it is being posted now, and may yet be refused: not a duplicate yet.
    InFlight,
}

impl IdMemory {
    /// What is known of `key`; a new one is remembered, in flight.
    fn look(&mut self, key: MailKey, durable: bool) -> IdSeen {
        match self.seen.get(&key) {
            Some(state) if state.settled => return IdSeen::Accepted,
            Some(_) => return IdSeen::InFlight,
            None => {}
        }
        self.remembered += 1;
        let at = self.remembered;
        self.seen.insert(
            key.clone(),
            IdState {
                durable,
                settled: false,
                at,
            },
        );
        self.order.push_back((key, at));
        if self.order.len() > IDS_KEPT
            && let Some((old, when)) = self.order.pop_front()
            && self.seen.get(&old).is_some_and(|state| state.at == when)
        {
            self.seen.remove(&old);
        }
        IdSeen::New
    }

    /// `key`'s mail was accepted.
    fn settle(&mut self, key: &MailKey) {
        if let Some(state) = self.seen.get_mut(key) {
            state.settled = true;
        }
    }

    /// Forgets the ids `drop` picks: their mail is gone, and the same id sent again is new.
    fn forget_where(&mut self, drop: impl Fn(&MailKey, bool) -> bool) {
        self.seen.retain(|key, state| !drop(key, state.durable));
    }

    /// Forgets `key` (its mail was refused).
    fn forget(&mut self, key: &MailKey) {
        self.seen.remove(key);
    }
}

/// What a reload did, for the operator who sent SIGHUP: each step is logged at `info`, below
/// the default level, so without this line a reload looked the same as one never received.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Reloaded {
    pub restarted: usize,
    pub added: usize,
    pub removed: usize,
    /// Programs whose changed file does not compile, whose run goes on as it was.
    pub kept: usize,
    /// Programs restarted or added whose start failed (each a `program_failed` event).
    pub failed: usize,
    pub unblocked: usize,
    /// The config's programs no longer read: they stay as they were.
    pub config_refused: bool,
    /// The config file itself does not read (a syntax error, gone or emptied): every setting
    /// read before it stays. A SIGHUP then said "nothing changed".
    pub config_unread: bool,
}

impl Reloaded {
    /// A restart's or an added program's start: counted as done only if it started (a start
    /// that failed was said to be done).
    fn count_start(&mut self, started: bool, added: bool) {
        match (started, added) {
            (false, _) => self.failed += 1,
            (true, true) => self.added += 1,
            (true, false) => self.restarted += 1,
        }
    }
}

impl std::fmt::Display for Reloaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        for (n, what) in [
            (self.restarted, "restarted"),
            (self.added, "started (new in the config)"),
            (self.removed, "stopped (removed from the config)"),
            (self.kept, "kept as they ran (their file does not load)"),
            (self.failed, "failed to start (see /api/programs)"),
        ] {
            if n > 0 {
                let s = if n == 1 { "" } else { "s" };
                parts.push(format!("{n} program{s} {what}"));
            }
        }
        if self.unblocked > 0 {
            parts.push(format!(
                "{} blocked resident{} trying again",
                self.unblocked,
                if self.unblocked == 1 { "" } else { "s" }
            ));
        }
        if self.config_unread {
            parts.push(
                "the config file does not read: its settings and programs before it stay (the \
                 log says why)"
                    .into(),
            );
        } else if self.config_refused {
            parts.push("the config's programs kept (it does not read, or lists none)".into());
        }
        if parts.is_empty() {
            f.write_str("nothing changed")
        } else {
            f.write_str(&parts.join(", "))
        }
    }
}

/// Where the service's programs come from.
#[derive(Debug, Clone)]
pub enum Programs {
    /// The files named on the command line: SIGHUP restarts those that changed.
    Files(Vec<Launch>),
    /// The config's `[[serve.programs]]`, paths relative to this folder: SIGHUP also starts
    /// the programs added and stops those removed.
    Config(PathBuf),
}

/// The service.
pub struct Service {
    core: Core,
    /// What loads each program: the same lifecycle as `colony run` and an embedding application.
    runtime: Runtime,
    pub events: Arc<Events>,
    pub metrics: Metrics,
    programs: RwLock<BTreeMap<String, Arc<Slot>>>,
    from_config: Option<PathBuf>,
    /// `--store`, for the config's programs (started again on SIGHUP).
    store: Option<String>,
    /// `--cluster`, likewise.
    cluster: Option<crate::cluster::ClusterOptions>,
    draining: AtomicBool,
    ids: Mutex<IdMemory>,
    tallies: DashMap<(String, String), Tally>,
    /// Counts the runs started and ended: `/mcp` sessions are told their lists may have
    /// changed.
    lineup: watch::Sender<u64>,
}

impl Service {
    /// A service for `programs` (named by file stem; a second of the same stem gets `-2`).
    /// `Err`: the config's entries are wrong.
    /// `store` is `--store`: the PostgreSQL URL the config's programs keep their state in
    /// (else the config's `[store] url`, read again on SIGHUP).
    pub fn new(
        core: Core,
        programs: Programs,
        store: Option<String>,
        cluster: Option<crate::cluster::ClusterOptions>,
    ) -> Result<Arc<Service>, String> {
        let (launches, from_config) = match programs {
            Programs::Files(launches) => (launches, None),
            Programs::Config(base) => (
                config_launches(&core, &base, store.as_deref(), cluster.as_ref())?,
                Some(base),
            ),
        };
        let mut slots = BTreeMap::new();
        for (name, launch) in named(launches) {
            slots.insert(name.clone(), Arc::new(Slot::new(name, launch)));
        }
        Ok(Arc::new(Service {
            runtime: Runtime::new(core.clone()),
            core,
            events: Arc::new(Events::default()),
            metrics: Metrics::default(),
            programs: RwLock::new(slots),
            from_config,
            store,
            cluster,
            draining: AtomicBool::new(false),
            ids: Mutex::new(IdMemory::default()),
            tallies: DashMap::new(),
            lineup: watch::Sender::new(0),
        }))
    }

    /// Told each time a program's run starts or ends (what `/mcp` offers changes with it).
    pub fn lineup(&self) -> watch::Receiver<u64> {
        self.lineup.subscribe()
    }

    fn lineup_changed(&self) {
        self.lineup.send_modify(|runs| *runs += 1);
    }

    pub fn core(&self) -> &Core {
        &self.core
    }

    /// Starts every program; one that fails to start shows as failed.
    pub fn start_all(self: &Arc<Self>) {
        for slot in self.programs() {
            self.start(&slot);
        }
    }

    /// The programs, in name order.
    pub fn programs(&self) -> Vec<Arc<Slot>> {
        read(&self.programs).values().cloned().collect()
    }

    pub fn program(&self, name: &str) -> Option<Arc<Slot>> {
        read(&self.programs).get(name).cloned()
    }

    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Every program's route is open and none has failed or stopped.
    pub fn ready(&self) -> bool {
        self.programs().iter().all(|s| {
            let now = s.lock();
            now.phase == Phase::Running && now.hosted.as_ref().is_some_and(|h| h.is_open())
        })
    }

    pub fn tally(&self, program: &str, resident: &str) -> Tally {
        self.tallies
            .get(&(program.to_string(), resident.to_string()))
            .map(|t| t.clone())
            .unwrap_or_default()
    }

    /// Whether the mail `id` for `to` in `program` is new (and remembers it if so, with
    /// whether the mail is `durable`, in flight until its post settles). A second request with
    /// an id whose post is in flight is not told `duplicate`: that post may yet be refused (a
    /// full mailbox), and no copy would then have been accepted.
    pub fn first_time(&self, program: &str, to: &str, id: &str, durable: bool) -> IdSeen {
        let key = (program.to_string(), to.to_string(), id.to_string());
        self.ids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .look(key, durable)
    }

    /// The mail `id` came with was accepted: the id is a duplicate from now on.
    pub fn settled(&self, program: &str, to: &str, id: &str) {
        let key = (program.to_string(), to.to_string(), id.to_string());
        self.ids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .settle(&key);
    }

    /// Forgets `id` again (the mail it came with was refused).
    pub fn forget(&self, program: &str, to: &str, id: &str) {
        let key = (program.to_string(), to.to_string(), id.to_string());
        self.ids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .forget(&key);
    }

    /// Forgets the ids of `program`'s mail that its end dropped: mail to a resident that does
    /// not keep its conversation (every resident's, with `resident`: one dismissed). Sent again
    /// with its id, such a mail was answered `duplicate` and never served.
    pub fn forget_dropped(&self, program: &str, resident: Option<&str>) {
        self.ids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .forget_where(|(p, to, _), durable| {
                p == program && resident.map_or(!durable, |r| r == to)
            });
    }

    /// The gauges' view of every program now, and the scrape.
    pub fn scrape(&self) -> String {
        type Snapshot = (
            String,
            bool,
            usize,
            Vec<crate::residents::ResidentInfo>,
            Vec<Option<BreakerState>>,
        );
        let snapshots: Vec<Snapshot> = self
            .programs()
            .iter()
            .map(|s| {
                let (up, failed, hosted) = {
                    let now = s.lock();
                    (
                        now.phase == Phase::Running,
                        now.failed_total,
                        now.hosted.clone(),
                    )
                };
                let residents = hosted.as_ref().map(|h| h.residents()).unwrap_or_default();
                let breakers = residents
                    .iter()
                    .map(|r| hosted.as_ref().and_then(|h| h.breaker(&r.name)))
                    .collect();
                (s.name.clone(), up, failed, residents, breakers)
            })
            .collect();
        let now: Vec<ProgramNow<'_>> = snapshots
            .iter()
            .map(|(program, up, failed, residents, breakers)| ProgramNow {
                program,
                up: *up,
                failed: *failed,
                residents,
                breakers,
            })
            .collect();
        self.metrics.encode(&now)
    }

    /// Starts `slot`'s program again after `wait`, unless something else started (or stopped)
    /// it meanwhile (`attempt` is no longer its last) or the service is draining.
    fn start_again(self: &Arc<Self>, slot: &Arc<Slot>, attempt: u64, wait: Duration) {
        let (me, slot) = (self.clone(), slot.clone());
        self.core.handle().spawn(async move {
            tokio::time::sleep(wait).await;
            let _op = slot.ops.lock().await;
            let due = {
                let now = slot.lock();
                now.attempts == attempt && now.phase == Phase::Failed
            };
            if !due || me.draining() {
                return;
            }
            let s = slot.clone();
            let started = tokio::task::spawn_blocking(move || me.start(&s)).await;
            if matches!(started, Ok(true)) {
                // Its failures were said as warnings: so is the end of them.
                tracing::warn!(program = %slot.name, "started, after its store or cluster came back");
            }
        });
    }

    /// Starts a run of `slot`'s program; `false` when it could not start (it is then `failed`,
    /// and `program_failed` says why).
    fn start(self: &Arc<Self>, slot: &Arc<Slot>) -> bool {
        let (observer, observations) = mpsc::unbounded_channel();
        let (deliveries_tx, deliveries) = mpsc::unbounded_channel();
        let launch = slot.launch();
        let hash = file_hash(&launch.file);
        // A run that just ended may still be letting go of the state directory's lock.
        let mut started = host::start(
            &self.runtime,
            &launch,
            observer.clone(),
            deliveries_tx.clone(),
        );
        for _ in 0..20 {
            match &started {
                Err(e) if e.message.contains("locked") || e.message.contains("in use") => {
                    std::thread::sleep(Duration::from_millis(100));
                    started = host::start(
                        &self.runtime,
                        &launch,
                        observer.clone(),
                        deliveries_tx.clone(),
                    );
                }
                _ => break,
            }
        }
        drop((observer, deliveries_tx));
        let attempt = {
            let mut now = slot.lock();
            now.attempts += 1;
            now.again_at = None;
            now.attempts
        };
        let hosted = match started {
            Ok(h) => {
                h.name_in_logs(&slot.name);
                Arc::new(h)
            }
            Err(e) => {
                let again = (e.again && !self.draining()).then(|| {
                    let failed = slot.lock().failed_in_a_row + 1;
                    START_AGAIN_FIRST
                        .saturating_mul(1 << (failed - 1).min(6))
                        .min(START_AGAIN_MOST)
                });
                match again {
                    Some(wait) => tracing::error!(
                        program = %slot.name,
                        "cannot start: {e}; trying again in {}s",
                        wait.as_secs()
                    ),
                    None => tracing::error!(program = %slot.name, "cannot start: {e}"),
                }
                {
                    let mut now = slot.lock();
                    now.phase = Phase::Failed;
                    now.error = Some(e.message.clone());
                    now.hash = hash;
                    now.failed_in_a_row += 1;
                }
                self.events.publish(
                    "program_failed",
                    json!({ "program": slot.name, "error": e.message }),
                );
                if let Some(wait) = again {
                    slot.lock().again_at = Some(std::time::Instant::now() + wait);
                    self.start_again(slot, attempt, wait);
                }
                return false;
            }
        };
        {
            let mut now = slot.lock();
            now.failed_in_a_row = 0;
            now.phase = Phase::Starting;
            now.error = None;
            now.file_error = None;
            now.failures.clear();
            now.failed_total = 0;
            now.reason = None;
            now.hosted = Some(hosted.clone());
            now.hash = hash;
        }
        self.lineup_changed();
        let handle = self.core.handle().clone();
        let run_ends = (slot.ended.subscribe(), slot.lock().runs);
        let observing = handle.spawn(observe(
            self.clone(),
            slot.name.clone(),
            observations,
            run_ends,
            hosted.stopping_probe(),
        ));
        slot.lock().observing = Some(observing);
        handle.spawn(hear(self.clone(), slot.name.clone(), deliveries));
        handle.spawn(lifecycle(self.clone(), slot.clone(), hosted));
        true
    }

    /// Stops `slot`'s run (if it runs) and waits for it to end.
    pub async fn stop(&self, slot: &Arc<Slot>, reason: &str) {
        let _op = slot.ops.lock().await;
        self.stop_locked(slot, reason).await;
    }

    async fn stop_locked(&self, slot: &Arc<Slot>, reason: &str) {
        let (hosted, runs) = {
            let now = slot.lock();
            (now.hosted.clone(), now.runs)
        };
        if let Some(hosted) = hosted {
            hosted.stop(reason);
            drop(hosted);
            let mut ended = slot.ended.subscribe();
            let _ = ended.wait_for(|n| *n > runs).await;
        }
        // A run that ended by itself (it heard the signal too) is waited for as well: what its
        // observer says of the turns it cut comes before the events close.
        // Bounded: something that still holds the run's route (a call from outside finishing)
        // keeps its observer open, and the next run must not wait on it.
        let observing = slot.lock().observing.take();
        if let Some(observing) = observing {
            let _ = tokio::time::timeout(OBSERVER_ENDS, observing).await;
        }
    }

    /// A restart an operator asks for: a run that works is not stopped for a file that does not
    /// load (saved with a mistake), as at SIGHUP; it goes on, and the error is the answer. A
    /// program that is not running is started whatever its file (its start tells what fails).
    /// `Ok` says whether it started.
    pub async fn restart_if_loads(self: &Arc<Self>, slot: &Arc<Slot>) -> Result<bool, String> {
        if slot.hosted().is_some() {
            let file = slot.launch().file;
            let loads = tokio::task::spawn_blocking(move || crate::embed::Runtime::compiles(&file))
                .await
                .unwrap_or_else(|e| Err(e.to_string()));
            if let Err(e) = loads {
                tracing::error!(program = %slot.name, "its file does not load, so its run goes on as it was: {e}");
                slot.lock().file_error = Some(e.clone());
                self.events
                    .publish("program_kept", json!({ "program": slot.name, "error": e }));
                return Err(e);
            }
            slot.lock().file_error = None;
        }
        Ok(self.restart(slot).await)
    }

    /// Stops `slot`'s run and starts it again from its file (persisted residents carry on);
    /// whether it started (a failed start is its own event).
    pub async fn restart(self: &Arc<Self>, slot: &Arc<Slot>) -> bool {
        let _op = slot.ops.lock().await;
        slot.lock().restarting = true;
        self.stop_locked(slot, "restart").await;
        let me = self.clone();
        let s = slot.clone();
        let started = tokio::task::spawn_blocking(move || me.start(&s)).await;
        slot.lock().restarting = false;
        let started = matches!(started, Ok(true));
        if started {
            self.events
                .publish("program_restarted", json!({ "program": slot.name }));
        }
        started
    }

    /// SIGHUP: the config file is read again, blocked residents try again, programs whose
    /// file changed since their run started are restarted; with the programs from the config,
    /// those added start, those removed stop (and leave), those whose entry changed restart.
    pub async fn reload(self: &Arc<Self>) -> Reloaded {
        self.core.reload_config();
        self.reload_programs().await
    }

    /// [`Service::reload`] with the config already read again (`colony serve` reads its tokens
    /// from it in between).
    pub async fn reload_programs(self: &Arc<Self>) -> Reloaded {
        let mut done = Reloaded {
            config_unread: self.core.config_unread().is_some(),
            ..Reloaded::default()
        };
        // The programs the config listed before are the ones kept.
        done.config_refused = done.config_unread && self.from_config.is_some();
        let mut added = Vec::new();
        let mut removed = Vec::new();
        let mut changed = HashSet::new();
        if let Some(base) = &self.from_config {
            match config_launches(
                &self.core,
                base,
                self.store.as_deref(),
                self.cluster.as_ref(),
            ) {
                Err(e) => {
                    tracing::error!("the config's programs stay as they were: {e}");
                    done.config_refused = true;
                }
                // A config that lists no programs (emptied, or gone and read as the defaults)
                // is refused as a start with none is: it stopped every program, and the
                // service then answered ready with nothing to serve.
                Ok(launches) if launches.is_empty() => {
                    tracing::error!(
                        "the config lists no programs ([[serve.programs]]): the programs stay \
                         as they were"
                    );
                    done.config_refused = true;
                }
                Ok(launches) => {
                    let existing: Vec<(String, Launch)> = self
                        .programs()
                        .iter()
                        .map(|slot| (slot.name.clone(), slot.launch()))
                        .collect();
                    let wanted: BTreeMap<String, Launch> =
                        named_keeping(launches, &existing).into_iter().collect();
                    for slot in self.programs() {
                        match wanted.get(&slot.name) {
                            None => removed.push(slot),
                            Some(l) if !same(l, &slot.launch()) => {
                                slot.set_launch(l.clone());
                                changed.insert(slot.name.clone());
                            }
                            Some(_) => {}
                        }
                    }
                    let have = read(&self.programs).keys().cloned().collect::<HashSet<_>>();
                    for (name, launch) in wanted {
                        if !have.contains(&name) {
                            added.push(Arc::new(Slot::new(name, launch)));
                        }
                    }
                }
            }
        }
        for slot in &removed {
            tracing::info!(program = %slot.name, "no longer in the config: stopping");
            self.stop(slot, "removed from the config").await;
            write(&self.programs).remove(&slot.name);
            self.metrics.forget_program(&slot.name);
            self.tallies.retain(|(p, _), _| p != &slot.name);
            self.events
                .publish("program_removed", json!({ "program": slot.name }));
            done.removed += 1;
        }
        let mut unblocked = 0;
        for slot in self.programs() {
            let (hosted, hash, failed) = {
                let now = slot.lock();
                (
                    now.hosted.clone(),
                    now.hash.clone(),
                    now.phase == Phase::Failed,
                )
            };
            if let Some(h) = hosted {
                unblocked += h.unblock_all();
                // Let go of the run before restarting it: while it is held, its state
                // directory stays locked and the new run would find it in use.
                drop(h);
            }
            let file_now = file_hash(&slot.launch().file);
            if hash == file_now {
                // Put back as its run has it: nothing is wrong with the file any more.
                slot.lock().file_error = None;
            }
            if changed.contains(&slot.name) {
                tracing::info!(program = %slot.name, "its entry in the config changed: restarting");
                done.count_start(self.restart(&slot).await, false);
            } else if hash != file_now {
                // A file saved with a mistake must not take down the run that works: it goes on,
                // and the next SIGHUP tries the file again.
                if let Err(e) = crate::embed::Runtime::compiles(&slot.launch().file) {
                    tracing::error!(program = %slot.name, "its file changed but does not load, so its run goes on as it was: {e}");
                    slot.lock().file_error = Some(e.clone());
                    self.events
                        .publish("program_kept", json!({ "program": slot.name, "error": e }));
                    done.kept += 1;
                    continue;
                }
                slot.lock().file_error = None;
                tracing::info!(program = %slot.name, "its file changed: restarting");
                done.count_start(self.restart(&slot).await, false);
            } else if failed {
                // A program that failed waits for a fix: what it failed on may be outside its
                // file (a store repaired, a file it reads put back), and SIGHUP is the fix's
                // word. Only a changed file was tried again.
                tracing::info!(program = %slot.name, "it had failed: starting it again");
                done.count_start(self.restart(&slot).await, false);
            }
        }
        for slot in added {
            tracing::info!(program = %slot.name, "new in the config: starting");
            write(&self.programs).insert(slot.name.clone(), slot.clone());
            let me = self.clone();
            let s = slot.clone();
            // Added to the list whether or not it starts (a failed start is its own event).
            let started = tokio::task::spawn_blocking(move || me.start(&s)).await;
            self.events
                .publish("program_added", json!({ "program": slot.name }));
            done.count_start(matches!(started, Ok(true)), true);
        }
        done.unblocked = unblocked;
        tracing::info!(unblocked, "reloaded");
        self.events.publish(
            "reloaded",
            json!({
                "unblocked": unblocked,
                "restarted": done.restarted,
                "added": done.added,
                "removed": done.removed,
                "kept": done.kept,
                "failed": done.failed,
                "config_refused": done.config_refused,
                "config_unread": done.config_unread,
            }),
        );
        done
    }

    /// Ends every program now, where it waits ([`Hosted::end_now`]): for an operator who will
    /// not wait for a drain's grace.
    pub fn end_now(&self, reason: &str) {
        for slot in self.programs() {
            if let Some(hosted) = slot.hosted() {
                hosted.end_now(reason);
            }
        }
    }

    /// The programs whose script still runs (a program whose script has ended may still be
    /// closing its store).
    pub fn scripts_running(&self) -> Vec<String> {
        self.programs()
            .iter()
            .filter(|slot| slot.hosted().is_some_and(|h| h.script_running()))
            .map(|slot| slot.name.clone())
            .collect()
    }

    /// How long a drain may take when every program ends as a stop lets it: the longest of
    /// their graces, and the time a script may run on after it before it is ended where it
    /// stands ([`crate::residents::lifecycle::AFTER_STOP`]).
    pub fn drain_patience(&self) -> Duration {
        let grace = self
            .programs()
            .iter()
            .filter_map(|slot| slot.hosted())
            .map(|hosted| hosted.grace())
            .max()
            .unwrap_or_default();
        grace + crate::residents::lifecycle::AFTER_STOP
    }

    /// SIGTERM: no new mail; every program stops, its turns in flight given their grace; answers
    /// once all have ended.
    pub async fn drain(&self, reason: &str) {
        self.draining.store(true, Ordering::Release);
        let programs = self.programs();
        let stops = programs.iter().map(|s| self.stop(s, reason));
        futures::future::join_all(stops).await;
        self.events.close();
    }
}

impl Slot {
    fn new(name: String, launch: Launch) -> Slot {
        Slot {
            name,
            launch: Mutex::new(launch),
            now: Mutex::new(Now {
                phase: Phase::Starting,
                error: None,
                reason: None,
                hosted: None,
                runs: 0,
                hash: None,
                attempts: 0,
                failed_in_a_row: 0,
                again_at: None,
                restarting: false,
                file_error: None,
                failures: Vec::new(),
                failed_total: 0,
                observing: None,
            }),
            ended: watch::Sender::new(0),
            ops: tokio::sync::Mutex::new(()),
        }
    }

    /// What its next run starts from.
    pub fn launch(&self) -> Launch {
        self.launch
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn set_launch(&self, launch: Launch) {
        *self.launch.lock().unwrap_or_else(|e| e.into_inner()) = launch;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Now> {
        self.now.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The running program, if it runs.
    pub fn hosted(&self) -> Option<Arc<Hosted>> {
        self.lock().hosted.clone()
    }

    /// Whether a restart is between its stop and its start (a run is coming).
    pub fn restarting(&self) -> bool {
        self.lock().restarting
    }

    /// How long until its start is tried again, if it failed to start and is to be (its store
    /// or cluster could not be reached).
    pub fn starts_again_in(&self) -> Option<Duration> {
        let now = self.lock();
        (now.phase == Phase::Failed)
            .then_some(now.again_at)
            .flatten()
            .map(|at| at.saturating_duration_since(std::time::Instant::now()))
    }

    /// Why its last start failed, or its run did, if it did.
    pub fn error(&self) -> Option<String> {
        self.lock().error.clone()
    }

    /// Where it is in its life, without the rest of [`Slot::view`] (which lists its residents).
    pub fn phase(&self) -> Phase {
        self.lock().phase.clone()
    }

    /// How many parts of this run failed for good (the view lists the newest
    /// [`FAILURES_KEPT`]).
    pub fn failures(&self) -> usize {
        self.lock().failed_total
    }

    /// Notes a part of this run that failed for good.
    fn failed(&self, id: &str, resident: &str, message: &str) {
        let mut now = self.lock();
        if now.failures.len() >= FAILURES_KEPT {
            now.failures.remove(0);
        }
        now.failures
            .push(json!({ "id": id, "resident": resident, "message": message }));
        now.failed_total += 1;
    }

    /// The program as the API shows it.
    pub fn view(&self) -> Value {
        let (phase, error, reason, hosted, runs, file_error, failed) = {
            let now = self.lock();
            (
                now.phase.clone(),
                now.error.clone(),
                now.reason.clone(),
                now.hosted.clone(),
                now.runs,
                now.file_error.clone(),
                now.failures.clone(),
            )
        };
        let residents = hosted.as_ref().map_or(0, |h| h.residents().len());
        json!({
            "name": self.name,
            "file": self.launch().file.display().to_string(),
            "state": phase,
            "error": error,
            // Its file on disk does not load; the run goes on from the one before.
            "file_error": file_error,
            // Its sources and residents that failed for good, while the rest runs on.
            "failed": failed,
            "stop_reason": reason,
            // Runs that ended before this one (or, stopped, before and including it).
            "runs_ended": runs,
            "residents": residents,
        })
    }
}

/// A run from its start to its end.
async fn lifecycle(service: Arc<Service>, slot: Arc<Slot>, hosted: Arc<Hosted>) {
    // A script that raises before its watch never opens: its end is awaited meanwhile.
    let opener = {
        let (service, slot, hosted) = (service.clone(), slot.clone(), hosted.clone());
        tokio::spawn(async move {
            hosted.opened().await;
            if hosted.is_open() {
                slot.lock().phase = Phase::Running;
                service
                    .events
                    .publish("program_started", json!({ "program": slot.name }));
            }
        })
    };
    let reason_then = hosted.clone();
    let result = hosted.ended().await;
    opener.abort();
    let _ = opener.await;
    let reason = reason_then.stop_reason();
    drop(reason_then);
    // What a resident that keeps no conversation held when the run ended is gone.
    service.forget_dropped(&slot.name, None);
    let runs = {
        let mut now = slot.lock();
        now.hosted = None;
        service.lineup_changed();
        now.runs += 1;
        match &result {
            Err(e) => {
                now.phase = Phase::Failed;
                now.error = Some(e.clone());
            }
            Ok(()) => {
                now.phase = Phase::Stopped;
                now.reason = reason.clone();
            }
        }
        now.runs
    };
    match result {
        Err(e) => {
            tracing::error!(program = %slot.name, "failed: {e}");
            service.events.publish(
                "program_failed",
                json!({ "program": slot.name, "error": e }),
            );
        }
        Ok(()) => {
            service.events.publish(
                "program_stopped",
                json!({ "program": slot.name, "reason": reason }),
            );
        }
    }
    slot.ended.send_replace(runs);
}

/// How long a stop waits for the run's observer to end ([`Now::observing`]).
const OBSERVER_ENDS: Duration = Duration::from_secs(2);

/// What the program's residents do, as events and metrics.
///
/// It ends when the run's observations end, or once the run has ended (`run_ends`: the slot's
/// count of ended runs, and the count before this one) and what it observed before its end is
/// read: at a drain something may still hold the run's route, and the turns it cut were told
/// only if that let go within [`OBSERVER_ENDS`] (they never were at a SIGTERM).
async fn observe(
    service: Arc<Service>,
    program: String,
    mut observations: mpsc::UnboundedReceiver<Observation>,
    (mut ended, run): (watch::Receiver<u64>, u64),
    stopping: impl Fn() -> bool,
) {
    // Turns started and not yet ended, with when: a turn a crash, a dismissal or the run's end
    // cut short reported no end, and a client following the events saw it run for good.
    let mut open: HashMap<String, std::time::Instant> = HashMap::new();
    let cut = |ai: &str, started: std::time::Instant, why: &str| {
        service.events.publish(
            "turn_ended",
            json!({
                "program": program,
                "resident": ai,
                "served": 0,
                "steps": 0,
                "stop": "cut",
                "tokens_in": 0,
                "tokens_out": 0,
                "error": { "kind": "cut", "message": why },
                "duration_ms": started.elapsed().as_secs_f64() * 1000.0,
            }),
        );
    };
    let mut run_ended = false;
    loop {
        let o = if run_ended {
            match observations.try_recv() {
                Ok(o) => o,
                Err(_) => break,
            }
        } else {
            tokio::select! {
                biased;
                o = observations.recv() => match o {
                    Some(o) => o,
                    None => break,
                },
                _ = ended.wait_for(|n| *n > run) => {
                    run_ended = true;
                    continue;
                }
            }
        };
        match o {
            Observation::TurnStarted { ai, mails } => {
                service.events.publish(
                    "turn_started",
                    json!({ "program": program, "resident": ai, "mails": mails }),
                );
                open.insert(ai, std::time::Instant::now());
            }
            Observation::TurnEnded(t) => {
                open.remove(&t.ai);
                service.metrics.turn(&program, &t);
                {
                    let mut tally = service
                        .tallies
                        .entry((program.clone(), t.ai.clone()))
                        .or_default();
                    tally.turns += 1;
                    tally.tokens_in += t.usage.input;
                    tally.tokens_out += t.usage.output;
                    if t.error.is_some() {
                        tally.last_error = t.error.clone();
                    }
                }
                service.events.publish(
                    "turn_ended",
                    json!({
                        "program": program,
                        "resident": t.ai,
                        "served": t.served,
                        "steps": t.steps,
                        "stop": t.stop,
                        "tokens_in": t.usage.input,
                        "tokens_out": t.usage.output,
                        "error": t.error,
                        "duration_ms": t.duration.as_secs_f64() * 1000.0,
                    }),
                );
            }
            Observation::ToolCallEnded { ai, call } => {
                service.metrics.tool_call(&program, &ai, &call);
                service.events.publish(
                    "tool_call",
                    json!({
                        "program": program,
                        "resident": ai,
                        "tool": call.name,
                        "call_id": call.call_id,
                        "kind": call.kind,
                        "step": call.step,
                        "duration_ms": call.duration.as_secs_f64() * 1000.0,
                    }),
                );
            }
            Observation::ModelCall { ai, duration, ok } => {
                service.metrics.model_call(&program, &ai, duration, ok);
            }
            Observation::Breaker { owner, from, state } => {
                service.events.publish(
                    "breaker",
                    json!({
                        "program": program,
                        // A resident's own breaker, `route` (shared) or `script`.
                        "owner": owner,
                        "from": from,
                        "to": state.status,
                        "breaker": super::api::breaker_view(&state),
                    }),
                );
            }
            Observation::Route(RouteEvent::Gone { ai }) => {
                if let Some(started) = open.remove(&ai) {
                    cut(&ai, started, "the resident is gone");
                }
                // Its run ends (a restart, a reload, a stop): its counters and totals carry
                // on into the next run, as a resident's own do. Each restart or reload reset
                // them, and said `gone` of every resident as if each had been dismissed.
                if stopping() {
                    continue;
                }
                // Dismissed or failed: its series and tallies leave with it.
                service.metrics.forget(&program, &ai);
                service.tallies.remove(&(program.clone(), ai.clone()));
                service
                    .events
                    .publish("gone", json!({ "program": program, "resident": ai }));
            }
            Observation::Route(event) => {
                if let RouteEvent::Crashed { ai, message, .. }
                | RouteEvent::Failed { ai, message, .. } = &event
                    && let Some(started) = open.remove(ai)
                {
                    cut(ai, started, message);
                }
                let (kind, data) = match event {
                    RouteEvent::Crashed { id, ai, message } => (
                        "crash",
                        json!({ "program": program, "resident": ai, "id": id, "message": message }),
                    ),
                    RouteEvent::Failed { id, ai, message } => (
                        {
                            if let Some(slot) = service.program(&program) {
                                slot.failed(&id, &ai, &message);
                            }
                            "failure"
                        },
                        json!({ "program": program, "resident": ai, "id": id, "message": message }),
                    ),
                    RouteEvent::Gone { ai } => {
                        ("gone", json!({ "program": program, "resident": ai }))
                    }
                    RouteEvent::Blocked { ai, error } => (
                        "blocked",
                        json!({ "program": program, "resident": ai, "error": error }),
                    ),
                    RouteEvent::Notice(notice) => delivery_event(&program, &notice),
                };
                service.events.publish(kind, data);
            }
        }
    }
    // The run ended (stopped, restarted, failed) with these turns in flight.
    for (ai, started) in open {
        cut(&ai, started, "the program's run ended before the turn did");
    }
}

/// What the program's residents hand to `deliver_to = "host"`, as events. Outages and
/// recoveries are not: every resident's are told by the route ([`RouteEvent::Notice`]),
/// whatever its `deliver_to`.
async fn hear(
    service: Arc<Service>,
    program: String,
    mut deliveries: mpsc::UnboundedReceiver<Delivery>,
) {
    while let Some(d) = deliveries.recv().await {
        if matches!(d.kind, DeliveryKind::Outage | DeliveryKind::Recovered) {
            continue;
        }
        let (kind, data) = delivery_event(&program, &d);
        service.events.publish(kind, data);
    }
}

/// A reply or notice as an event: its kind and its data.
fn delivery_event(program: &str, d: &Delivery) -> (&'static str, Value) {
    let kind = match d.kind {
        DeliveryKind::Reply => "delivery",
        DeliveryKind::Outage => "outage",
        DeliveryKind::Recovered => "recovery",
        DeliveryKind::Blocked => "blocked_notice",
    };
    let data = json!({
        "program": program,
        "resident": d.ai,
        "text": d.text,
        "origin": d.origin,
        "steps": d.steps,
        "tokens_in": d.usage.input,
        "tokens_out": d.usage.output,
        "error": d.error,
        "held": d.held,
        "dropped": d.dropped,
    });
    (kind, data)
}

fn file_hash(path: &Path) -> Option<Vec<u8>> {
    std::fs::read(path)
        .ok()
        .map(|bytes| Sha256::digest(&bytes).to_vec())
}

/// The config's programs now.
fn config_launches(
    core: &Core,
    base: &Path,
    store: Option<&str>,
    cluster: Option<&crate::cluster::ClusterOptions>,
) -> Result<Vec<Launch>, String> {
    let config = core.config();
    let settings = config.serve.clone().unwrap_or_default();
    let mut launches = super::programs::from_config(&settings, base)?;
    let url = crate::store::select::url(store, &config);
    for launch in &mut launches {
        launch.store = url.clone();
        launch.cluster = cluster.cloned();
    }
    Ok(launches)
}

/// Each launch with its name: its file's stem, `-2`, `-3` ... after the first of a stem.
fn named(launches: Vec<Launch>) -> Vec<(String, Launch)> {
    named_keeping(launches, &[])
}

/// [`named`] for a reload: a launch that is a running program's (the same file and state,
/// else the same file) keeps that program's name, and a new one takes no name a program that
/// leaves still holds. Names are given by place in the config, so removing the first of two
/// files of one stem stopped the second and started the removed one with its file.
fn named_keeping(launches: Vec<Launch>, existing: &[(String, Launch)]) -> Vec<(String, Launch)> {
    let mut names: Vec<Option<String>> = vec![None; launches.len()];
    let mut kept: HashSet<&str> = HashSet::new();
    let passes: [fn(&Launch, &Launch) -> bool; 2] = [
        |a, b| a.file == b.file && a.state == b.state,
        |a, b| a.file == b.file,
    ];
    for matches in passes {
        for (i, launch) in launches.iter().enumerate() {
            if names[i].is_some() {
                continue;
            }
            if let Some((name, _)) = existing
                .iter()
                .find(|(name, old)| !kept.contains(name.as_str()) && matches(launch, old))
            {
                kept.insert(name);
                names[i] = Some(name.clone());
            }
        }
    }
    let mut taken: HashSet<String> = existing.iter().map(|(name, _)| name.clone()).collect();
    let mut out = Vec::new();
    for (launch, name) in launches.into_iter().zip(names) {
        let name = name.unwrap_or_else(|| {
            let stem = launch
                .file
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "program".into());
            let mut name = stem.clone();
            let mut n = 2;
            while taken.contains(&name) {
                name = format!("{stem}-{n}");
                n += 1;
            }
            taken.insert(name.clone());
            name
        });
        out.push((name, launch));
    }
    out
}

/// Whether two launches start the same program the same way.
fn same(a: &Launch, b: &Launch) -> bool {
    a.file == b.file
        && a.args == b.args
        && a.state == b.state
        && a.permissions == b.permissions
        && a.max_memory == b.max_memory
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

    fn launch(file: &str, state: &str) -> Launch {
        Launch {
            file: file.into(),
            args: Vec::new(),
            state: state.into(),
            permissions: Arc::default(),
            store: None,
            max_memory: None,
            cluster: None,
        }
    }

    fn names(named: &[(String, Launch)]) -> Vec<(&str, &str)> {
        named
            .iter()
            .map(|(n, l)| (n.as_str(), l.file.to_str().unwrap()))
            .collect()
    }

    #[test]
    fn an_id_is_a_duplicate_once_its_mail_is_accepted_and_not_while_it_is_in_flight() {
        let mut ids = IdMemory::default();
        let key = |id: &str| ("p".to_string(), "r".to_string(), id.to_string());
        assert_eq!(ids.look(key("a"), false), IdSeen::New);
        // A second request while the first is posted: not told it is a duplicate, since the
        // first may yet be refused (it was answered 202 duplicate, and no copy was accepted).
        assert_eq!(ids.look(key("a"), false), IdSeen::InFlight);
        ids.settle(&key("a"));
        assert_eq!(ids.look(key("a"), false), IdSeen::Accepted);
        // Refused: forgotten, from the order too, and new again.
        assert_eq!(ids.look(key("b"), true), IdSeen::New);
        ids.forget(&key("b"));
        assert_eq!(ids.look(key("b"), true), IdSeen::New);
        // Its first entry in the order, forgotten, does not evict it when its turn comes.
        ids.order.retain(|(k, _)| *k != key("a"));
        assert_eq!(ids.order.front().map(|(k, _)| k.clone()), Some(key("b")));
        while ids.order.front().is_some_and(|(_, at)| *at == 2) {
            let n = ids.remembered;
            ids.look(key(&format!("x{n}")), false);
        }
        assert_eq!(ids.look(key("b"), true), IdSeen::InFlight, "b was evicted");
    }

    /// A request between a restart's stop and its start is told to come back in a moment
    /// (`Retry-After`), as one while the program stops is; a program stopped for good is not.
    #[test]
    fn a_request_between_a_restarts_stop_and_its_start_is_told_when_to_come_back() {
        let slot = Slot::new("echo".into(), launch("a/echo.lua", "sa"));
        slot.lock().phase = Phase::Stopped;
        let stopped = crate::serve::api::not_running(&slot, "echo");
        assert_eq!(stopped.status(), 503);
        assert!(stopped.headers().get("retry-after").is_none());
        slot.lock().restarting = true;
        let restarting = crate::serve::api::not_running(&slot, "echo");
        assert_eq!(restarting.status(), 503);
        assert_eq!(restarting.headers()["retry-after"], "1");
    }

    #[test]
    fn a_reload_keeps_each_programs_name_whatever_its_place() {
        let existing = named(vec![launch("a/echo.lua", "sa"), launch("b/echo.lua", "sb")]);
        assert_eq!(
            names(&existing),
            [("echo", "a/echo.lua"), ("echo-2", "b/echo.lua")]
        );
        // The first entry removed: the second keeps its name, and is not taken for the first.
        let reloaded = named_keeping(vec![launch("b/echo.lua", "sb")], &existing);
        assert_eq!(names(&reloaded), [("echo-2", "b/echo.lua")]);
        // One added above the others: it takes a name neither holds.
        let reloaded = named_keeping(
            vec![
                launch("c/echo.lua", "sc"),
                launch("a/echo.lua", "sa"),
                launch("b/echo.lua", "sb"),
            ],
            &existing,
        );
        assert_eq!(
            names(&reloaded),
            [
                ("echo-3", "c/echo.lua"),
                ("echo", "a/echo.lua"),
                ("echo-2", "b/echo.lua")
            ]
        );
        // Its state moved: still the program of that file, under its name (a restart).
        let reloaded = named_keeping(vec![launch("b/echo.lua", "elsewhere")], &existing);
        assert_eq!(names(&reloaded), [("echo-2", "b/echo.lua")]);
    }
}
