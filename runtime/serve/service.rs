//! The service: the programs it hosts (each in a [`Slot`] that outlives its runs, so a failed
//! or stopped program still shows, and restarts in place), what their residents are observed
//! doing (turned into [`Events`] and [`Metrics`]), and the drain.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
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
use crate::residents::{Delivery, DeliveryKind, Observation, RouteEvent};
use crate::turn::TurnError;

/// How many mail ids the service remembers, to accept each once (a resident that keeps its
/// conversation also remembers them in its state directory, across restarts).
const IDS_KEPT: usize = 100_000;

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
    pub launch: Launch,
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
}

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

/// The ids accepted lately, and their order (the oldest is forgotten first).
#[derive(Default)]
struct IdMemory {
    seen: HashSet<MailKey>,
    order: VecDeque<MailKey>,
}

/// The service.
pub struct Service {
    core: Core,
    pub events: Arc<Events>,
    pub metrics: Metrics,
    programs: BTreeMap<String, Arc<Slot>>,
    draining: AtomicBool,
    ids: Mutex<IdMemory>,
    tallies: DashMap<(String, String), Tally>,
}

impl Service {
    /// A service for `launches` (named by file stem; a second of the same stem gets `-2`).
    pub fn new(core: Core, launches: Vec<Launch>) -> Arc<Service> {
        let mut programs = BTreeMap::new();
        for launch in launches {
            let stem = launch
                .file
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "program".into());
            let mut name = stem.clone();
            let mut n = 2;
            while programs.contains_key(&name) {
                name = format!("{stem}-{n}");
                n += 1;
            }
            programs.insert(
                name.clone(),
                Arc::new(Slot {
                    name,
                    launch,
                    now: Mutex::new(Now {
                        phase: Phase::Starting,
                        error: None,
                        reason: None,
                        hosted: None,
                        runs: 0,
                        hash: None,
                    }),
                    ended: watch::Sender::new(0),
                    ops: tokio::sync::Mutex::new(()),
                }),
            );
        }
        Arc::new(Service {
            core,
            events: Arc::new(Events::default()),
            metrics: Metrics::default(),
            programs,
            draining: AtomicBool::new(false),
            ids: Mutex::new(IdMemory::default()),
            tallies: DashMap::new(),
        })
    }

    pub fn core(&self) -> &Core {
        &self.core
    }

    /// Starts every program; one that fails to start shows as failed.
    pub fn start_all(self: &Arc<Self>) {
        for slot in self.programs.values() {
            self.start(slot);
        }
    }

    pub fn programs(&self) -> impl Iterator<Item = &Arc<Slot>> {
        self.programs.values()
    }

    pub fn program(&self, name: &str) -> Option<&Arc<Slot>> {
        self.programs.get(name)
    }

    pub fn draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }

    /// Every program's route is open and none has failed or stopped.
    pub fn ready(&self) -> bool {
        self.programs.values().all(|s| {
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

    /// Whether the mail `id` for `to` in `program` is new (and remembers it if so).
    pub fn first_time(&self, program: &str, to: &str, id: &str) -> bool {
        let key = (program.to_string(), to.to_string(), id.to_string());
        let mut ids = self.ids.lock().unwrap_or_else(|e| e.into_inner());
        if !ids.seen.insert(key.clone()) {
            return false;
        }
        ids.order.push_back(key);
        if ids.order.len() > IDS_KEPT
            && let Some(old) = ids.order.pop_front()
        {
            ids.seen.remove(&old);
        }
        true
    }

    /// Forgets `id` again (the mail it came with was refused).
    pub fn forget(&self, program: &str, to: &str, id: &str) {
        let key = (program.to_string(), to.to_string(), id.to_string());
        self.ids
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .seen
            .remove(&key);
    }

    /// The gauges' view of every program now, and the scrape.
    pub fn scrape(&self) -> String {
        let snapshots: Vec<(String, bool, Vec<crate::residents::ResidentInfo>)> = self
            .programs
            .values()
            .map(|s| {
                let (up, hosted) = {
                    let now = s.lock();
                    (now.phase == Phase::Running, now.hosted.clone())
                };
                let residents = hosted.map(|h| h.residents()).unwrap_or_default();
                (s.name.clone(), up, residents)
            })
            .collect();
        let now: Vec<ProgramNow<'_>> = snapshots
            .iter()
            .map(|(program, up, residents)| ProgramNow {
                program,
                up: *up,
                residents,
            })
            .collect();
        self.metrics.encode(&now)
    }

    /// Starts a run of `slot`'s program.
    fn start(self: &Arc<Self>, slot: &Arc<Slot>) {
        let (observer, observations) = mpsc::unbounded_channel();
        let (deliveries_tx, deliveries) = mpsc::unbounded_channel();
        let hash = file_hash(&slot.launch.file);
        // A run that just ended may still be letting go of the state directory's lock.
        let mut started = host::start(
            self.core.clone(),
            &slot.launch,
            observer.clone(),
            deliveries_tx.clone(),
        );
        for _ in 0..20 {
            match &started {
                Err(e) if e.contains("locked") || e.contains("in use") => {
                    std::thread::sleep(Duration::from_millis(100));
                    started = host::start(
                        self.core.clone(),
                        &slot.launch,
                        observer.clone(),
                        deliveries_tx.clone(),
                    );
                }
                _ => break,
            }
        }
        drop((observer, deliveries_tx));
        let hosted = match started {
            Ok(h) => Arc::new(h),
            Err(e) => {
                tracing::error!(program = %slot.name, "cannot start: {e}");
                {
                    let mut now = slot.lock();
                    now.phase = Phase::Failed;
                    now.error = Some(e.clone());
                    now.hash = hash;
                }
                self.events.publish(
                    "program_failed",
                    json!({ "program": slot.name, "error": e }),
                );
                return;
            }
        };
        {
            let mut now = slot.lock();
            now.phase = Phase::Starting;
            now.error = None;
            now.reason = None;
            now.hosted = Some(hosted.clone());
            now.hash = hash;
        }
        let handle = self.core.handle().clone();
        handle.spawn(observe(self.clone(), slot.name.clone(), observations));
        handle.spawn(hear(self.clone(), slot.name.clone(), deliveries));
        handle.spawn(lifecycle(self.clone(), slot.clone(), hosted));
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
        let Some(hosted) = hosted else { return };
        hosted.stop(reason);
        drop(hosted);
        let mut ended = slot.ended.subscribe();
        let _ = ended.wait_for(|n| *n > runs).await;
    }

    /// Stops `slot`'s run and starts it again from its file (persisted residents carry on).
    pub async fn restart(self: &Arc<Self>, slot: &Arc<Slot>) {
        let _op = slot.ops.lock().await;
        self.stop_locked(slot, "restart").await;
        let me = self.clone();
        let s = slot.clone();
        let _ = tokio::task::spawn_blocking(move || me.start(&s)).await;
        self.events
            .publish("program_restarted", json!({ "program": slot.name }));
    }

    /// SIGHUP: the config file is read again, blocked residents try again, and programs whose
    /// file changed since their run started are restarted.
    pub async fn reload(self: &Arc<Self>) {
        self.core.reload_config();
        let mut unblocked = 0;
        for slot in self.programs.values() {
            let (hosted, hash) = {
                let now = slot.lock();
                (now.hosted.clone(), now.hash.clone())
            };
            if let Some(h) = &hosted {
                unblocked += h.unblock_all();
            }
            if hash != file_hash(&slot.launch.file) {
                tracing::info!(program = %slot.name, "its file changed: restarting");
                self.restart(slot).await;
            }
        }
        tracing::info!(unblocked, "reloaded");
        self.events
            .publish("reloaded", json!({ "unblocked": unblocked }));
    }

    /// SIGTERM: no new mail; every program stops, its turns in flight given their grace; answers
    /// once all have ended.
    pub async fn drain(&self, reason: &str) {
        self.draining.store(true, Ordering::Release);
        let stops = self.programs.values().map(|s| self.stop(s, reason));
        futures::future::join_all(stops).await;
        self.events.close();
    }
}

impl Slot {
    fn lock(&self) -> std::sync::MutexGuard<'_, Now> {
        self.now.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The running program, if it runs.
    pub fn hosted(&self) -> Option<Arc<Hosted>> {
        self.lock().hosted.clone()
    }

    /// The program as the API shows it.
    pub fn view(&self) -> Value {
        let (phase, error, reason, hosted, runs) = {
            let now = self.lock();
            (
                now.phase.clone(),
                now.error.clone(),
                now.reason.clone(),
                now.hosted.clone(),
                now.runs,
            )
        };
        let residents = hosted.as_ref().map_or(0, |h| h.residents().len());
        json!({
            "name": self.name,
            "file": self.launch.file.display().to_string(),
            "state": phase,
            "error": error,
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
    let runs = {
        let mut now = slot.lock();
        now.hosted = None;
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

/// What the program's residents do, as events and metrics.
async fn observe(
    service: Arc<Service>,
    program: String,
    mut observations: mpsc::UnboundedReceiver<Observation>,
) {
    while let Some(o) = observations.recv().await {
        match o {
            Observation::TurnStarted { ai, mails } => {
                service.events.publish(
                    "turn_started",
                    json!({ "program": program, "resident": ai, "mails": mails }),
                );
            }
            Observation::TurnEnded(t) => {
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
                for call in &t.tool_calls {
                    service.events.publish(
                        "tool_call",
                        json!({
                            "program": program,
                            "resident": t.ai,
                            "tool": call.name,
                            "kind": call.kind,
                            "step": call.step,
                            "duration_ms": call.duration.as_secs_f64() * 1000.0,
                        }),
                    );
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
            Observation::Route(event) => {
                let (kind, data) = match event {
                    RouteEvent::Crashed { id, ai, message } => (
                        "crash",
                        json!({ "program": program, "resident": ai, "id": id, "message": message }),
                    ),
                    RouteEvent::Failed { id, ai, message } => (
                        "failure",
                        json!({ "program": program, "resident": ai, "id": id, "message": message }),
                    ),
                    RouteEvent::Gone { ai } => {
                        ("gone", json!({ "program": program, "resident": ai }))
                    }
                    RouteEvent::Blocked { ai, error } => (
                        "blocked",
                        json!({ "program": program, "resident": ai, "error": error }),
                    ),
                };
                service.events.publish(kind, data);
            }
        }
    }
}

/// What the program's residents hand to `deliver_to = "host"`, as events.
async fn hear(
    service: Arc<Service>,
    program: String,
    mut deliveries: mpsc::UnboundedReceiver<Delivery>,
) {
    while let Some(d) = deliveries.recv().await {
        let kind = match d.kind {
            DeliveryKind::Reply => "delivery",
            DeliveryKind::Outage => "outage",
            DeliveryKind::Recovered => "recovery",
            DeliveryKind::Blocked => "blocked_notice",
        };
        service.events.publish(
            kind,
            json!({
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
            }),
        );
    }
}

fn file_hash(path: &Path) -> Option<Vec<u8>> {
    std::fs::read(path)
        .ok()
        .map(|bytes| Sha256::digest(&bytes).to_vec())
}
