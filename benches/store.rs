//! The durable store under load: how many persisted steps a second `synchronous=FULL` allows, and
//! how long a program takes to resume 10,000 persisted residents. Every store is a real
//! `SqliteStore` (WAL, `synchronous=FULL`) in a temporary directory on the disk the temp dir is on;
//! the provider is an in-bench `Infer` that answers at once, so every figure is the runtime's and
//! the disk's own cost.
//!
//! 0. **What an fsync costs on this disk.** 200 small writes each followed by `File::sync_all`,
//!    then by `File::sync_data` (SQLite's WAL commit is one `fdatasync`): the floor of a commit.
//! 1. **Persisted steps per second.**
//!    - *a. Store level.* `commit_step` in a loop of a conversation of ~200 B messages that grows
//!      and shrinks between 10 and 30 messages, so each commit differs from the last (SQLite
//!      writes, and syncs, nothing for a row rewritten with the same bytes): commits/s and ms per
//!      commit; the same around 200 messages (a commit rewrites the whole conversation); a tool
//!      step as `ResidentHooks` writes it (commit_step, journal started, audit line and journal
//!      finished together, commit_step: 4 transactions); a script's audit line alone (what
//!      `ai.run` writes for each tool call, at `synchronous=NORMAL`); `push_backlog` (what
//!      `ai.mail` waits for); 8 threads committing at once. The same loops on tmpfs
//!      (`/dev/shm`, where an fsync costs nothing) give the CPU part of a transaction.
//!    - *b. End to end.* N persisted residents (1, 8, 64) on a `Route` with a `SqliteStore`; mail
//!      posted round robin from this thread (as the Lua thread posts it: `Route::mail` returns
//!      once the mail is in the backlog on disk); the `Infer` answers "ok" at once, no tools, so
//!      a step is one `commit_step`. The clock stops when the store has committed the step that
//!      served the last mail (a wrapper around the store sums `commit_step`'s `served`), which is
//!      exact and durable. A resident takes every waiting mail (up to 24) into one turn, so
//!      mails/s is above steps/s.
//!    - *c. Batching.* How many writes share a transaction (group commit: the writes that arrive
//!      while one fsync is in flight go in the next transaction together): 8 threads committing
//!      at once against one, and writes an fsync end to end.
//!    - *d. Durable tool steps.* 1, 8 and 64 persisted residents with a native tool, one mail
//!      each and a turn of 30 tool steps: a step is the reply committed, the call journaled as
//!      started, its audit line with the call journaled as finished (one write), and the results
//!      committed (4 writes), every one durable before the resident goes on. The figure the
//!      issue sets: over 5,000 tool steps/s across 64 residents with `synchronous=FULL`.
//! 2. **Resume 10,000 persisted residents.** A store of 10,000 cells (10 messages each, a backlog
//!    of 0 to 2 mails) written in one transaction straight through SQLite (the `Store` API has no
//!    batch write; the cells are then checked through `load_cell`), everything dropped, then
//!    timed: `StateDir::open` + `Route::spawn` of 10,000 specs with `persist = true` (each loads its
//!    cell) until every task has been polled once (both workers parked, nothing queued). The
//!    `Infer` never answers, so a resident with a backlog stops at its first model request and
//!    the figure is resuming, not serving; the requests are checked against the cells. The page
//!    cache is warm (the file was just written): a cold start adds reading the file.
//!    Then the same with 2,000,000 audit lines appended (a service's history: 200 tool calls a
//!    resident), as the ratio to the resume without them: opening checks the tables a program
//!    resumes from, not the log, so the history should cost next to nothing.
//!
//! Run: `cargo bench --bench store` (about half a minute). `cargo bench --bench store -- fsync
//! steps resume` runs only the sections named.

use std::fs::File;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use colony::core::Ask;
use colony::infer::breaker::BreakerState;
use colony::infer::{Infer, OnText, SharedInfer, StepResult};
use colony::lua::bridge::LuaBridge;
use colony::providers::Endpoint;
use colony::residents::persist::ResidentHooks;
use colony::residents::resident::{DEFAULT_MAX_HOP, State};
use colony::residents::{Deliver, Mail, ResidentSpec, Restart, RestartPolicy, Route};
use colony::store::state_dir::{STORE_FILE, StateDir};
use colony::store::{AuditEntry, AuditFilter, JournalEntry, SavedResident, Store, StoreResult};
use colony::turn::{Compaction, EventKind, ToolDef, ToolEvent, TurnHooks};
use colony::vocab::{
    InferRequest, Inferred, Message, Part, Role, Stop, ToolCall, ToolResult, Usage,
};
use serde_json::Value;

mod common;
use common::{Rt, core, delivery_counter, load, runtime, settle};
use tokio::sync::Notify;

const FSYNCS: usize = 200;
/// How long each store-level loop runs on the disk (on tmpfs: a quarter of it).
const LOOP: Duration = Duration::from_millis(1500);
const THREADS: usize = 8;
/// End to end: (residents, mails each).
const E2E: &[(usize, usize)] = &[(1, 960), (8, 120), (64, 15)];
const E2E_RUNS: usize = 3;
const CELLS: usize = 10_000;
const CELL_MESSAGES: usize = 10;
const RESUME_RUNS: usize = 5;
const MESSAGE_BYTES: usize = 200;
/// Audit lines appended for the second resume: 200 tool calls for each of the 10,000 residents.
const AUDIT_HISTORY: usize = 2_000_000;

// ---------------------------------------------------------------------------------------------
// The runtime, a core that needs no key, and knowing when every task has been polled
// ---------------------------------------------------------------------------------------------

/// A temporary directory on the disk (the temp dir), or on tmpfs (`/dev/shm`) when there is one.
fn temp_dir(tmpfs: bool) -> Option<tempfile::TempDir> {
    if tmpfs {
        let shm = Path::new("/dev/shm");
        if !shm.is_dir() {
            return None;
        }
        tempfile::tempdir_in(shm).ok()
    } else {
        Some(tempfile::tempdir().expect("a temp dir"))
    }
}

// ---------------------------------------------------------------------------------------------
// Conversations and mail of a realistic size
// ---------------------------------------------------------------------------------------------

/// About `len` bytes of words, different for each `seed`.
fn prose(seed: usize, len: usize) -> String {
    const WORDS: &str = "the build failed on main after commit tests passed report disk latency \
        watcher noticed a new file in inbox summary deploy rolled back because queue grew \
        overnight alert cleared";
    let words: Vec<&str> = WORDS.split_whitespace().collect();
    let mut s = String::with_capacity(len + 16);
    let mut x = (seed as u64).wrapping_mul(2_654_435_761).wrapping_add(1);
    while s.len() < len {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str(words[(x >> 33) as usize % words.len()]);
    }
    s
}

/// `len` messages of about [`MESSAGE_BYTES`] each: mail user turns and replies alternating,
/// ending with a reply (a turn that was done).
fn conversation(seed: usize, len: usize) -> Vec<Message> {
    (0..len)
        .map(|i| {
            let text = prose(seed * 1_000 + i, MESSAGE_BYTES - 20);
            if (len - i).is_multiple_of(2) {
                Message::user(format!("[mail from feed] {text}"))
            } else {
                Message::assistant(text)
            }
        })
        .collect()
}

fn json_len<T: serde::Serialize + ?Sized>(v: &T) -> usize {
    serde_json::to_string(v).map(|s| s.len()).unwrap_or(0)
}

fn name(n: usize) -> String {
    format!("r{n:05}")
}

// ---------------------------------------------------------------------------------------------
// Timing loops
// ---------------------------------------------------------------------------------------------

/// Operations timed one by one.
struct Lat {
    elapsed: Duration,
    samples: Vec<Duration>,
}

impl Lat {
    fn n(&self) -> usize {
        self.samples.len()
    }

    fn rate(&self) -> f64 {
        self.n() as f64 / self.elapsed.as_secs_f64()
    }

    fn mean_ms(&self) -> f64 {
        self.samples.iter().sum::<Duration>().as_secs_f64() * 1e3 / self.n().max(1) as f64
    }

    fn pct_ms(&self, p: f64) -> f64 {
        let mut s = self.samples.clone();
        s.sort();
        s.get(((s.len() as f64 * p) as usize).min(s.len().saturating_sub(1)))
            .map(|d| d.as_secs_f64() * 1e3)
            .unwrap_or(f64::NAN)
    }

    /// "1234 /s, 0.81 ms each (p50 0.78, p99 1.90)"
    fn show(&self, unit: &str) -> String {
        format!(
            "{:>7.0} {unit}/s, {:.3} ms each (p50 {:.3}, p99 {:.3}; {} in {:.1} s)",
            self.rate(),
            self.mean_ms(),
            self.pct_ms(0.5),
            self.pct_ms(0.99),
            self.n(),
            self.elapsed.as_secs_f64()
        )
    }
}

/// Runs `op` (given its index) again and again for `dur`.
fn timed_loop(dur: Duration, mut op: impl FnMut(usize)) -> Lat {
    let mut samples = Vec::new();
    let started = Instant::now();
    let mut i = 0;
    while started.elapsed() < dur {
        let t = Instant::now();
        op(i);
        samples.push(t.elapsed());
        i += 1;
    }
    Lat {
        elapsed: started.elapsed(),
        samples,
    }
}

// ---------------------------------------------------------------------------------------------
// A store that counts (and times) what goes through it
// ---------------------------------------------------------------------------------------------

/// Wraps the route's store: counts and times `commit_step`, `push_backlog` and `load_cell`, and
/// signals when `commit_step`s have served `target` mails in all.
struct Counted {
    inner: Arc<dyn Store>,
    commits: AtomicU64,
    commit_ns: AtomicU64,
    accepts: AtomicU64,
    accept_ns: AtomicU64,
    loads: AtomicU64,
    load_ns: AtomicU64,
    served: AtomicU64,
    target: u64,
    done: Notify,
}

impl Counted {
    fn new(inner: Arc<dyn Store>, target: u64) -> Counted {
        Counted {
            inner,
            commits: AtomicU64::new(0),
            commit_ns: AtomicU64::new(0),
            accepts: AtomicU64::new(0),
            accept_ns: AtomicU64::new(0),
            loads: AtomicU64::new(0),
            load_ns: AtomicU64::new(0),
            served: AtomicU64::new(0),
            target,
            done: Notify::new(),
        }
    }

    fn ms(ns: &AtomicU64) -> f64 {
        ns.load(Ordering::Acquire) as f64 / 1e6
    }
}

fn add(counter: &AtomicU64, ns: &AtomicU64, since: Instant) {
    counter.fetch_add(1, Ordering::AcqRel);
    ns.fetch_add(since.elapsed().as_nanos() as u64, Ordering::AcqRel);
}

impl Store for Counted {
    fn get(&self, space: &str, key: &str) -> StoreResult<Option<Value>> {
        self.inner.get(space, key)
    }
    fn set(&self, space: &str, key: &str, value: &Value) -> StoreResult<()> {
        self.inner.set(space, key, value)
    }
    fn delete(&self, space: &str, key: &str) -> StoreResult<bool> {
        self.inner.delete(space, key)
    }
    fn list(&self, space: &str, prefix: &str) -> StoreResult<Vec<String>> {
        self.inner.list(space, prefix)
    }
    fn update(
        &self,
        space: &str,
        key: &str,
        f: &mut dyn FnMut(Option<Value>) -> Result<Option<Value>, String>,
    ) -> StoreResult<Option<Value>> {
        self.inner.update(space, key, f)
    }
    fn conversations(&self) -> StoreResult<Vec<String>> {
        self.inner.conversations()
    }
    fn load_cell(&self, name: &str) -> StoreResult<Option<SavedResident>> {
        let t = Instant::now();
        let r = self.inner.load_cell(name);
        add(&self.loads, &self.load_ns, t);
        r
    }
    fn push_backlog(&self, name: &str, mail: &Mail) -> StoreResult<Option<i64>> {
        let t = Instant::now();
        let r = self.inner.push_backlog(name, mail);
        add(&self.accepts, &self.accept_ns, t);
        r
    }
    fn commit_step(
        &self,
        name: &str,
        messages: &[Message],
        served: &[i64],
        dropped: u64,
    ) -> StoreResult<()> {
        let t = Instant::now();
        let r = self.inner.commit_step(name, messages, served, dropped);
        add(&self.commits, &self.commit_ns, t);
        if r.is_ok() && !served.is_empty() {
            let served = served.len() as u64;
            if self.served.fetch_add(served, Ordering::AcqRel) + served == self.target {
                self.done.notify_one();
            }
        }
        r
    }
    fn journal(&self, name: &str, entry: &JournalEntry) -> StoreResult<()> {
        self.inner.journal(name, entry)
    }
    fn drop_backlog(&self, name: &str, rows: &[i64]) -> StoreResult<usize> {
        self.inner.drop_backlog(name, rows)
    }
    fn clear_cell(&self, name: &str) -> StoreResult<bool> {
        self.inner.clear_cell(name)
    }
    fn breaker(&self, key: &str) -> StoreResult<Option<BreakerState>> {
        self.inner.breaker(key)
    }
    fn save_breaker(&self, key: &str, state: &BreakerState) -> StoreResult<()> {
        self.inner.save_breaker(key, state)
    }
    fn audit(&self, entry: &AuditEntry) -> StoreResult<()> {
        self.inner.audit(entry)
    }
    fn finish_call(
        &self,
        name: &str,
        audit: &AuditEntry,
        journal: Option<&JournalEntry>,
    ) -> StoreResult<()> {
        self.inner.finish_call(name, audit, journal)
    }
    fn audit_log(&self, filter: &AuditFilter) -> StoreResult<Vec<AuditEntry>> {
        self.inner.audit_log(filter)
    }
}

// ---------------------------------------------------------------------------------------------
// Providers: one that answers at once, one that never does
// ---------------------------------------------------------------------------------------------

/// Answers "ok" at once, no tools; counts the requests (the turns, each one step).
struct Answering {
    turns: AtomicU64,
}

impl Infer for Answering {
    async fn step<'a>(
        &'a self,
        _req: &'a InferRequest,
        _ep: &'a Endpoint,
        _on_text: OnText<'a>,
    ) -> StepResult {
        self.turns.fetch_add(1, Ordering::AcqRel);
        Ok(Inferred {
            message: Message::assistant("ok"),
            stop: Stop::EndTurn,
            usage: Usage::default(),
            model: None,
        })
    }
}

/// Never answers: counts the requests that reach it and the messages they carry.
struct Holding {
    reached: AtomicUsize,
    messages: AtomicUsize,
}

impl Infer for Holding {
    async fn step<'a>(
        &'a self,
        req: &'a InferRequest,
        _ep: &'a Endpoint,
        _on_text: OnText<'a>,
    ) -> StepResult {
        self.messages
            .fetch_add(req.messages.len(), Ordering::AcqRel);
        self.reached.fetch_add(1, Ordering::AcqRel);
        std::future::pending().await
    }
}

/// What `ai.spawn{ name = ..., persist_conversation = true, compact = "off" }` hires.
fn spec(name: String, stack: &SharedInfer, deliver: Deliver) -> ResidentSpec {
    ResidentSpec {
        name,
        ask: Ask::default(),
        tools: Vec::new(),
        changing_tools: None,
        max_steps: 8,
        max_hop: DEFAULT_MAX_HOP,
        mailbox: colony::residents::mail::CAPACITY,
        compaction: Compaction {
            enabled: false,
            ..Compaction::default()
        },
        deliver,
        restart: RestartPolicy::new(Restart::Permanent),
        stack: stack.clone(),
        persist: true,
        workspace: None,
        budgets: Default::default(),
    }
}

// ---------------------------------------------------------------------------------------------
// 0. fsync
// ---------------------------------------------------------------------------------------------

fn fsyncs(dir: &Path, data_only: bool) -> Lat {
    let mut f = File::create(dir.join("fsync-probe")).expect("a probe file");
    f.write_all(&[b'.'; 4096]).expect("written");
    f.sync_all().expect("synced");
    let samples = (0..FSYNCS)
        .map(|_| {
            let t = Instant::now();
            f.write_all(&[b'x'; 128]).expect("written");
            if data_only {
                f.sync_data().expect("synced");
            } else {
                f.sync_all().expect("synced");
            }
            t.elapsed()
        })
        .collect::<Vec<_>>();
    Lat {
        elapsed: samples.iter().sum(),
        samples,
    }
}

/// Prints the fsync cost; returns the mean `sync_data` in ms.
fn fsync_section() -> f64 {
    let dir = temp_dir(false).expect("a temp dir");
    println!(
        "0. fsync on this disk ({}; {FSYNCS} writes of 128 B, each synced)",
        dir.path().parent().unwrap_or(dir.path()).display()
    );
    let all = fsyncs(dir.path(), false);
    let data = fsyncs(dir.path(), true);
    println!("   write + sync_all:  {}", all.show("syncs"));
    println!("   write + sync_data: {}", data.show("syncs"));
    data.mean_ms()
}

// ---------------------------------------------------------------------------------------------
// 1a. Store level
// ---------------------------------------------------------------------------------------------

struct StoreLevel {
    commit20: Lat,
    commit200: Lat,
    tool: Lat,
    /// A script's tool call's audit line, alone in its transaction (`synchronous=NORMAL`).
    audit: Lat,
    accept: Lat,
    /// 8 threads committing at once: total commits, in how long, each commit's time; the
    /// writes a transaction held.
    concurrent: Option<(Lat, f64)>,
    bytes20: usize,
    bytes200: usize,
}

/// How far a conversation grows and shrinks around its size: commit `i` writes
/// `size - SPREAD + i % (2 * SPREAD + 1)` messages, so each commit differs from the last (SQLite
/// writes nothing, and syncs nothing, for a row rewritten with the same bytes).
const SPREAD: usize = 10;

/// The conversations a loop around `size` messages commits, one per step of the cycle.
fn growing(pool: &[Message], size: usize) -> Vec<&[Message]> {
    (0..=2 * SPREAD)
        .map(|k| &pool[..size - SPREAD + k])
        .collect()
}

fn store_level(dir: &Path, dur: Duration, concurrent: bool) -> StoreLevel {
    let state = StateDir::open(dir).expect("a state dir");
    let store: Arc<dyn Store> = state.dyn_store();
    let pool = conversation(1, 200 + SPREAD);
    let conv20 = growing(&pool, 20);
    let conv200 = growing(&pool, 200);
    // Warm the statements and the file.
    for i in 0..50 {
        store
            .commit_step("warm", conv20[i % conv20.len()], &[], 0)
            .expect("committed");
    }
    let commit20 = timed_loop(dur, |i| {
        store
            .commit_step("c20", conv20[i % conv20.len()], &[], 0)
            .expect("committed");
    });
    let commit200 = timed_loop(dur, |i| {
        store
            .commit_step("c200", conv200[i % conv200.len()], &[], 0)
            .expect("committed");
    });

    // A tool step as a persisted resident writes it: the reply with its call, the call started,
    // its audit line and its result, the step's results.
    let hooks = ResidentHooks::new(store.clone(), "tools", true, Vec::new(), Vec::new());
    let call = ToolCall {
        id: "call_1".into(),
        name: "read".into(),
        arguments: r#"{"path":"notes/today.md"}"#.into(),
        opaque: None,
    };
    let result = ToolResult {
        call_id: call.id.clone(),
        name: call.name.clone(),
        content: prose(7, MESSAGE_BYTES),
        is_error: false,
    };
    let event = ToolEvent {
        step: 1,
        call_id: call.id.clone(),
        name: call.name.clone(),
        kind: EventKind::Ok,
        outcome: result.content.clone(),
        duration: Duration::from_millis(3),
    };
    // (the reply with its call, the same with the results), around 20 messages.
    let steps: Vec<(Vec<Message>, Vec<Message>)> = conv20
        .iter()
        .map(|base| {
            let mut with_call = base.to_vec();
            with_call.push(Message::new(
                Role::Assistant,
                vec![Part::text("reading it"), Part::ToolCall(call.clone())],
            ));
            let mut with_result = with_call.clone();
            with_result.push(Message::new(
                Role::Tool,
                vec![Part::ToolResult(result.clone())],
            ));
            (with_call, with_result)
        })
        .collect();
    let tool = timed_loop(dur, |i| {
        let (with_call, with_result) = &steps[i % steps.len()];
        hooks.inferred(with_call).expect("commit");
        hooks.starting(&[&call]).expect("journal");
        hooks.finished(&call, &result, &[], &event);
        hooks.step_done(with_result).expect("commit");
    });

    // What a script's tool call writes (`ai.run` on the Lua thread), one turn at a time.
    let line = AuditEntry {
        at_ms: 1,
        resident: "script".into(),
        tool: "add".into(),
        args_hash: "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad".into(),
        duration_ms: 0.01,
        outcome: "ok".into(),
        message: None,
    };
    let audit = timed_loop(dur / 2, |_| {
        store
            .audit_all(std::slice::from_ref(&line))
            .expect("written");
    });

    let mail = Mail::new("inbox", "feed", prose(8, MESSAGE_BYTES), 0);
    let accept = timed_loop(dur / 2, |_| {
        assert!(
            store
                .push_backlog("inbox", &mail)
                .expect("accepted")
                .is_some()
        );
    });

    let concurrent = concurrent.then(|| {
        let before = state.store().commits();
        let started = Instant::now();
        let lats: Vec<Lat> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..THREADS)
                .map(|t| {
                    let (store, convs) = (&store, &conv20);
                    s.spawn(move || {
                        let who = format!("t{t}");
                        timed_loop(dur, |i| {
                            store
                                .commit_step(&who, convs[i % convs.len()], &[], 0)
                                .expect("committed");
                        })
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| h.join().expect("a thread"))
                .collect()
        });
        let lat = Lat {
            elapsed: started.elapsed(),
            samples: lats.into_iter().flat_map(|l| l.samples).collect(),
        };
        let after = state.store().commits();
        (
            lat,
            (after.writes - before.writes) as f64
                / (after.transactions - before.transactions).max(1) as f64,
        )
    });
    StoreLevel {
        commit20,
        commit200,
        tool,
        audit,
        accept,
        concurrent,
        bytes20: json_len(conv20[SPREAD]),
        bytes200: json_len(conv200[SPREAD]),
    }
}

// ---------------------------------------------------------------------------------------------
// 1b. End to end
// ---------------------------------------------------------------------------------------------

struct E2e {
    residents: usize,
    mails: u64,
    posted: Duration,
    served: Duration,
    turns: u64,
    commits: u64,
    accepts: u64,
    commit_ms: f64,
    accept_ms: f64,
    conversation_bytes: usize,
    /// Writes (commits and acceptances) a transaction held.
    writes_a_transaction: f64,
}

impl E2e {
    fn steps_per_s(&self) -> f64 {
        self.turns as f64 / self.served.as_secs_f64()
    }

    fn mails_per_s(&self) -> f64 {
        self.mails as f64 / self.served.as_secs_f64()
    }

    fn tx_per_s(&self) -> f64 {
        (self.commits + self.accepts) as f64 / self.served.as_secs_f64()
    }
}

/// `residents` persisted residents, `per` mails each posted round robin from this thread; until
/// the step serving the last mail is committed.
async fn end_to_end(rt: &Rt, dir: &Path, residents: usize, per: usize) -> E2e {
    let total = (residents * per) as u64;
    let state = StateDir::open(dir).expect("a state dir");
    let counted = Arc::new(Counted::new(state.dyn_store(), total));
    let sqlite = state.store();
    let answering = Arc::new(Answering {
        turns: AtomicU64::new(0),
    });
    let stack: SharedInfer = answering.clone();
    let route = Route::with_store(
        core(rt),
        LuaBridge::detached(),
        Some(counted.clone() as Arc<dyn Store>),
    );
    route.open();
    let (tx, drained) = delivery_counter();
    let names: Vec<String> = (0..residents).map(name).collect();
    for n in &names {
        route
            .spawn(spec(n.clone(), &stack, Deliver::Channel(tx.clone())))
            .expect("spawned");
    }
    drop(tx);
    settle(rt);
    let done = counted.done.notified();
    tokio::pin!(done);
    done.as_mut().enable();
    let before = sqlite.commits();
    let started = Instant::now();
    for i in 0..total as usize {
        route
            .mail(Mail::new(
                names[i % residents].as_str(),
                "bench",
                format!("ping {i}"),
                0,
            ))
            .expect("posted");
    }
    let posted = started.elapsed();
    if tokio::time::timeout(Duration::from_secs(60), done)
        .await
        .is_err()
    {
        panic!(
            "only {} of {total} mails were served",
            counted.served.load(Ordering::Acquire)
        );
    }
    let served = started.elapsed();
    let after = sqlite.commits();
    let turns = answering.turns.load(Ordering::Acquire);
    let commits = counted.commits.load(Ordering::Acquire);
    let accepts = counted.accepts.load(Ordering::Acquire);
    // Exactness: one commit per turn (no tools), every mail accepted once, and each conversation
    // holds its mail and one answer per turn.
    settle(rt);
    assert_eq!(commits, turns, "one commit_step per turn");
    assert_eq!(accepts, total, "one push_backlog per mail");
    // A resident counts its answer in its conversation after the commit the clock stopped on,
    // and may be doing so in `block_in_place`, where `settle` cannot see it: given a moment.
    let stored = || -> u64 {
        route
            .residents()
            .iter()
            .map(|r| r.conversation as u64)
            .sum()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while stored() != total + turns && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(stored(), total + turns, "stored conversations");
    let conversation_bytes = names
        .iter()
        .filter_map(|n| route.resident(n))
        .map(|r| json_len(&r.conversation()))
        .sum::<usize>()
        / residents;
    let (commit_ms, accept_ms) = (
        Counted::ms(&counted.commit_ns) / commits.max(1) as f64,
        Counted::ms(&counted.accept_ns) / accepts.max(1) as f64,
    );
    route.stop("bench done");
    route.shutdown(Duration::from_secs(10)).await;
    drop(route);
    assert_eq!(
        drained.await.expect("the drain"),
        turns,
        "one reply per turn"
    );
    E2e {
        residents,
        mails: total,
        posted,
        served,
        turns,
        commits,
        accepts,
        commit_ms,
        accept_ms,
        conversation_bytes,
        writes_a_transaction: (after.writes - before.writes) as f64
            / (after.transactions - before.transactions).max(1) as f64,
    }
}

fn best_end_to_end(rt: &Rt, tmpfs: bool, residents: usize, per: usize, runs: usize) -> E2e {
    (0..runs)
        .map(|_| {
            let dir = temp_dir(tmpfs).expect("a temp dir");
            rt.rt.block_on(end_to_end(rt, dir.path(), residents, per))
        })
        .min_by(|a, b| a.served.cmp(&b.served))
        .expect("a run")
}

fn show_e2e(e: &E2e) -> String {
    format!(
        "{:>3} residents x {:>3} mails: {:>6.0} steps/s, {:>6.0} mails/s ({:.1} mails a step; \
         {} steps in {:.0} ms; posting alone {:.0} ms); {:.0} transactions/s (commit {:.2} ms, \
         accept {:.2} ms); conversations end at {:.1} KB",
        e.residents,
        e.mails / e.residents as u64,
        e.steps_per_s(),
        e.mails_per_s(),
        e.mails as f64 / e.turns as f64,
        e.turns,
        e.served.as_secs_f64() * 1e3,
        e.posted.as_secs_f64() * 1e3,
        e.tx_per_s(),
        e.commit_ms,
        e.accept_ms,
        e.conversation_bytes as f64 / 1024.0,
    )
}

// ---------------------------------------------------------------------------------------------
// 1. Steps per second: the section
// ---------------------------------------------------------------------------------------------

fn steps_section(rt: &Rt, sync_ms: Option<f64>) {
    println!("1. Persisted steps per second (SqliteStore: WAL, synchronous=FULL, group commit)");
    println!(
        "   a. store level, one thread (a loop of {:.1} s each)",
        LOOP.as_secs_f64()
    );
    let disk_dir = temp_dir(false).expect("a temp dir");
    let disk = store_level(disk_dir.path(), LOOP, true);
    drop(disk_dir);
    println!(
        "      commit_step, 20 messages ({:.1} KB JSON):  {}",
        disk.bytes20 as f64 / 1024.0,
        disk.commit20.show("commits")
    );
    println!(
        "      commit_step, 200 messages ({:.1} KB JSON): {}",
        disk.bytes200 as f64 / 1024.0,
        disk.commit200.show("commits")
    );
    println!(
        "      tool step (4 transactions: commit_step, journal, audit + journal, commit_step): {}",
        disk.tool.show("steps")
    );
    println!(
        "      a script's audit line, alone (no fsync: synchronous=NORMAL): {}",
        disk.audit.show("lines")
    );
    println!(
        "      push_backlog (ai.mail accepting one mail): {}",
        disk.accept.show("mails")
    );
    if let Some((c, shared)) = &disk.concurrent {
        println!(
            "      {THREADS} threads, commit_step of 20 messages each: {:.0} commits/s in all \
             ({:.2}x one thread), {:.2} ms a commit (p99 {:.2}) waiting for the batch included; \
             {shared:.1} commits a transaction",
            c.rate(),
            c.rate() / disk.commit20.rate(),
            c.mean_ms(),
            c.pct_ms(0.99),
        );
    }
    let shm_dir = temp_dir(true);
    let shm = shm_dir
        .as_ref()
        .map(|d| store_level(d.path(), LOOP / 4, false));
    drop(shm_dir);
    if let Some(shm) = &shm {
        println!("      the same on tmpfs (/dev/shm, fsync free): the CPU part");
        println!(
            "        commit_step, 20 messages:  {}",
            shm.commit20.show("commits")
        );
        println!(
            "        commit_step, 200 messages: {}",
            shm.commit200.show("commits")
        );
        println!(
            "        tool step:                 {}",
            shm.tool.show("steps")
        );
        println!(
            "        audit line:                {}",
            shm.audit.show("lines")
        );
        println!(
            "        push_backlog:              {}",
            shm.accept.show("mails")
        );
    }
    println!(
        "      persisted steps/s with synchronous=FULL (the issue sets no number; with one fsync \
         a transaction the ceiling is 1 / fsync{}): {:.0} steps/s without tools, {:.0} with one \
         tool call",
        sync_ms
            .map(|ms| format!(" = {:.0}/s here", 1e3 / ms))
            .unwrap_or_default(),
        disk.commit20.rate(),
        disk.tool.rate()
    );

    println!(
        "   b. end to end: persisted residents on a Route, mail round robin from this thread \
         (Route::mail returns once the mail is on disk), the provider answers \"ok\" at once; \
         until the step serving the last mail is committed (best of {E2E_RUNS})"
    );
    let mut on_disk = Vec::new();
    for &(residents, per) in E2E {
        let e = best_end_to_end(rt, false, residents, per, E2E_RUNS);
        println!("      {}", show_e2e(&e));
        on_disk.push(e);
    }
    let mut on_tmpfs = Vec::new();
    if shm.is_some() {
        println!("      the same on tmpfs (fsync free; one run):");
        for &(residents, per) in E2E {
            let e = best_end_to_end(rt, true, residents, per, 1);
            println!("        {}", show_e2e(&e));
            on_tmpfs.push(e);
        }
    }
    println!(
        "      (a step here is one model call and one commit_step; a resident takes every mail \
         waiting, up to 24, into one step, so mails/s > steps/s. Each mail waits for its own \
         push_backlog to be durable on the sender's thread before the step that serves it; commit \
         and accept times include waiting for the batch that holds them.)"
    );

    println!("   c. batching (group commit: the writes arriving during an fsync share the next)");
    if let Some((c, shared)) = &disk.concurrent {
        println!(
            "      {THREADS} threads committing at once: {:.0} commits/s against {:.0} for one \
             ({:.2}x), {shared:.1} commits a transaction",
            c.rate(),
            disk.commit20.rate(),
            c.rate() / disk.commit20.rate(),
        );
    }
    for e in &on_disk {
        println!(
            "      end to end, {:>2} residents: {:.1} writes a transaction",
            e.residents, e.writes_a_transaction
        );
    }
    if let (Some(d), Some(t)) = (on_disk.last(), on_tmpfs.last()) {
        println!(
            "      end to end, 64 residents: {:.0} steps/s on disk, {:.0} on tmpfs (fsync free): \
             the disk's share is {:.1}x",
            d.steps_per_s(),
            t.steps_per_s(),
            d.served.as_secs_f64() / t.served.as_secs_f64(),
        );
    }
    let durable = tool_steps_section(rt);
    println!(
        "   durable tool steps/s across 64 residents with synchronous=FULL: {durable:.0} (aim: \
         over 5,000)"
    );
}

// ---------------------------------------------------------------------------------------------
// 1d. Durable tool steps across residents
// ---------------------------------------------------------------------------------------------

/// Tool steps in each resident's turn (the model calls `note` this many times, then answers).
const TOOL_STEPS: usize = 30;
/// Residents taking tool steps at once.
const TOOL_RESIDENTS: &[usize] = &[1, 8, 64];

/// Answers with a call of `note` until the turn holds [`TOOL_STEPS`] results, then "ok"; counts
/// the steps that called.
struct Calling {
    tool_steps: AtomicU64,
}

impl Infer for Calling {
    async fn step<'a>(
        &'a self,
        req: &'a InferRequest,
        _ep: &'a Endpoint,
        _on_text: OnText<'a>,
    ) -> StepResult {
        let done = req.messages.iter().filter(|m| m.role == Role::Tool).count();
        if done >= TOOL_STEPS {
            return Ok(Inferred {
                message: Message::assistant("ok"),
                stop: Stop::EndTurn,
                usage: Usage::default(),
                model: None,
            });
        }
        self.tool_steps.fetch_add(1, Ordering::AcqRel);
        let call = ToolCall {
            id: format!("call_{done}"),
            name: "note".into(),
            arguments: format!(r#"{{"line":"step {done}"}}"#),
            opaque: None,
        };
        Ok(Inferred {
            message: Message::new(
                Role::Assistant,
                vec![Part::text("noting it"), Part::ToolCall(call)],
            ),
            stop: Stop::ToolUse,
            usage: Usage::default(),
            model: None,
        })
    }
}

struct ToolRun {
    residents: usize,
    tool_steps: u64,
    elapsed: Duration,
    /// Writes the store was asked for, and the transactions (fsyncs) they took.
    writes: u64,
    transactions: u64,
}

impl ToolRun {
    fn steps_per_s(&self) -> f64 {
        self.tool_steps as f64 / self.elapsed.as_secs_f64()
    }
}

/// `residents` persisted residents with a native tool, one mail each; until every turn (of
/// [`TOOL_STEPS`] tool steps and an answer) has delivered its reply.
async fn tool_steps(rt: &Rt, dir: &Path, residents: usize) -> ToolRun {
    let state = StateDir::open(dir).expect("a state dir");
    let sqlite = state.store();
    let calling = Arc::new(Calling {
        tool_steps: AtomicU64::new(0),
    });
    let stack: SharedInfer = calling.clone();
    let note = ToolDef::native(
        "note",
        "Notes a line.",
        serde_json::json!({
            "type": "object",
            "properties": {"line": {"type": "string"}},
            "required": ["line"]
        }),
        |_args| async { Ok(Value::String("noted".into())) },
    )
    .expect("the note tool");
    let route = Route::with_store(core(rt), LuaBridge::detached(), Some(state.dyn_store()));
    route.open();
    let (tx, mut replies) = tokio::sync::mpsc::unbounded_channel();
    let names: Vec<String> = (0..residents).map(name).collect();
    for n in &names {
        let mut spec = spec(n.clone(), &stack, Deliver::Channel(tx.clone()));
        spec.tools = vec![note.clone()];
        spec.max_steps = TOOL_STEPS as u32 + 2;
        route.spawn(spec).expect("spawned");
    }
    drop(tx);
    settle(rt);
    let before = sqlite.commits();
    let started = Instant::now();
    for n in &names {
        route
            .mail(Mail::new(n.as_str(), "bench", "note thirty lines", 0))
            .expect("posted");
    }
    for _ in 0..residents {
        tokio::time::timeout(Duration::from_secs(120), replies.recv())
            .await
            .expect("every turn ends")
            .expect("a reply");
    }
    let elapsed = started.elapsed();
    let after = sqlite.commits();
    // Exactness: every step ran its call once and is on disk: the conversation (the mail, a
    // reply and results per step, the answer), one audit line per call.
    let tool_steps = calling.tool_steps.load(Ordering::Acquire);
    assert_eq!(tool_steps, (residents * TOOL_STEPS) as u64, "tool steps");
    for n in &names {
        let saved = sqlite.load_cell(n).expect("loaded").expect("a cell");
        assert_eq!(
            saved.messages.len(),
            2 + 2 * TOOL_STEPS,
            "{n}'s conversation"
        );
        assert!(saved.journal.is_empty() && saved.backlog.is_empty());
    }
    let audited = sqlite
        .audit_log(&AuditFilter::default())
        .expect("the audit log");
    assert_eq!(audited.len(), residents * TOOL_STEPS, "audit lines");
    route.stop("bench done");
    route.shutdown(Duration::from_secs(10)).await;
    ToolRun {
        residents,
        tool_steps,
        elapsed,
        writes: after.writes - before.writes,
        transactions: after.transactions - before.transactions,
    }
}

/// Prints the durable tool steps; returns the figure across the most residents.
fn tool_steps_section(rt: &Rt) -> f64 {
    println!(
        "   d. durable tool steps: persisted residents with a native tool, one mail each, a turn \
         of {TOOL_STEPS} tool steps (each: reply committed, call journaled as started, audit \
         line and call journaled as finished in one write, results committed) and an answer; until every reply is \
         delivered (best of {E2E_RUNS})"
    );
    let mut last = f64::NAN;
    for &residents in TOOL_RESIDENTS {
        let run = (0..E2E_RUNS)
            .map(|_| {
                let dir = temp_dir(false).expect("a temp dir");
                rt.rt.block_on(tool_steps(rt, dir.path(), residents))
            })
            .min_by(|a, b| a.elapsed.cmp(&b.elapsed))
            .expect("a run");
        println!(
            "      {:>3} residents: {:>6.0} tool steps/s ({} in {:.0} ms); {} writes in {} \
             transactions ({:.1} writes an fsync)",
            run.residents,
            run.steps_per_s(),
            run.tool_steps,
            run.elapsed.as_secs_f64() * 1e3,
            run.writes,
            run.transactions,
            run.writes as f64 / run.transactions.max(1) as f64,
        );
        last = run.steps_per_s();
    }
    last
}

// ---------------------------------------------------------------------------------------------
// 2. Resume 10,000 persisted residents
// ---------------------------------------------------------------------------------------------

fn backlog_of(n: usize) -> Vec<Mail> {
    (0..n % 3)
        .map(|k| Mail::new(name(n), "feed", prose(n * 10 + k, MESSAGE_BYTES - 20), 0))
        .collect()
}

fn cell_of(n: usize) -> SavedResident {
    SavedResident {
        messages: conversation(n, CELL_MESSAGES),
        backlog: backlog_of(n),
        dropped: 0,
        journal: Vec::new(),
    }
}

/// Writes the cells in one transaction straight through SQLite (the schema made by opening the
/// store first), then checks a sample through the `Store` API.
fn populate(dir: &Path) -> Duration {
    let started = Instant::now();
    drop(StateDir::open(dir).expect("a state dir"));
    {
        let mut conn = rusqlite::Connection::open(dir.join(STORE_FILE)).expect("the store file");
        let tx = conn.transaction().expect("a transaction");
        {
            let mut cells = tx
                .prepare("INSERT INTO cells (name, messages, dropped) VALUES (?1, ?2, 0)")
                .expect("the cells table");
            let mut backlog = tx
                .prepare("INSERT INTO backlog (name, mail) VALUES (?1, ?2)")
                .expect("the backlog table");
            for n in 0..CELLS {
                let cell = cell_of(n);
                let messages = serde_json::to_string(&cell.messages).expect("json");
                cells
                    .execute(rusqlite::params![name(n), messages])
                    .expect("a cell");
                for m in &cell.backlog {
                    let mail = serde_json::to_string(m).expect("json");
                    backlog
                        .execute(rusqlite::params![name(n), mail])
                        .expect("a mail");
                }
            }
        }
        tx.commit().expect("committed");
    }
    let state = StateDir::open(dir).expect("a state dir");
    let store = state.dyn_store();
    assert_eq!(store.conversations().expect("names").len(), CELLS);
    for n in (0..CELLS).step_by(997).chain([CELLS - 1]) {
        assert_eq!(
            store.load_cell(&name(n)).expect("loaded"),
            Some(cell_of(n)),
            "cell {n} as the Store API reads it"
        );
    }
    started.elapsed()
}

struct Resumed {
    open: Duration,
    load: Duration,
    spawn: Duration,
    poll: Duration,
}

impl Resumed {
    fn total(&self) -> Duration {
        self.open + self.spawn + self.poll
    }
}

fn resume(dir: &Path) -> Resumed {
    let rt = runtime();
    let core = core(&rt);
    let holding = Arc::new(Holding {
        reached: AtomicUsize::new(0),
        messages: AtomicUsize::new(0),
    });
    let stack: SharedInfer = holding.clone();
    settle(&rt);

    let started = Instant::now();
    let state = StateDir::open(dir).expect("a state dir");
    let open = started.elapsed();
    let counted = Arc::new(Counted::new(state.dyn_store(), u64::MAX));
    let route = Route::with_store(
        core,
        LuaBridge::detached(),
        Some(counted.clone() as Arc<dyn Store>),
    );
    for n in 0..CELLS {
        route
            .spawn(spec(name(n), &stack, Deliver::Nobody))
            .expect("spawned");
    }
    let spawned = started.elapsed();
    settle(&rt);
    let polled = started.elapsed();

    // Exactness: every cell loaded; a resident with a backlog has asked the provider with its
    // conversation and its mail; the others are idle with theirs.
    assert_eq!(counted.loads.load(Ordering::Acquire), CELLS as u64);
    let with_backlog = (0..CELLS).filter(|n| n % 3 != 0).count();
    let expected_messages: usize = (0..CELLS)
        .filter(|n| n % 3 != 0)
        .map(|n| CELL_MESSAGES + n % 3)
        .sum();
    assert_eq!(holding.reached.load(Ordering::Acquire), with_backlog);
    assert_eq!(holding.messages.load(Ordering::Acquire), expected_messages);
    let residents = route.residents();
    assert_eq!(residents.len(), CELLS);
    assert!(residents.iter().all(|r| r.conversation == CELL_MESSAGES));
    let idle = residents.iter().filter(|r| r.state == State::Idle).count();
    assert_eq!(idle, CELLS - with_backlog, "idle residents");

    let load = Duration::from_nanos(counted.load_ns.load(Ordering::Acquire));
    route.stop("bench done");
    rt.rt.block_on(route.shutdown(Duration::ZERO));
    drop(route);
    drop(counted);
    drop(state);
    drop(rt);
    Resumed {
        open,
        load,
        spawn: spawned - open,
        poll: polled - spawned,
    }
}

fn resume_section() {
    let dir = temp_dir(false).expect("a temp dir");
    let state: PathBuf = dir.path().join("state");
    let populated = populate(&state);
    let size = std::fs::metadata(state.join(STORE_FILE))
        .map(|m| m.len())
        .unwrap_or(0);
    println!(
        "2. Resume {CELLS} persisted residents ({CELL_MESSAGES} messages of ~{MESSAGE_BYTES} B \
         and 0-2 backlog mails each; store file {:.1} MB, written in {:.2} s in one transaction, \
         not counted; page cache warm; best of {RESUME_RUNS})",
        size as f64 / 1e6,
        populated.as_secs_f64()
    );
    let runs: Vec<Resumed> = (0..RESUME_RUNS).map(|_| resume(&state)).collect();
    let best = runs.iter().min_by_key(|r| r.total()).expect("a resume run");
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "   StateDir::open + {CELLS} x Route::spawn (persist) until every task was polled: \
         {:.0} ms (aim < 300 ms){}",
        ms(best.total()),
        if best.total() < Duration::from_millis(300) {
            ""
        } else {
            "  MISSED"
        }
    );
    println!(
        "     opening the state dir and store (lock, header, quick_check but the audit log, WAL): {:.0} ms",
        ms(best.open)
    );
    println!(
        "     loading cells (load_cell inside Route::spawn): {:.0} ms = {:.1} us a cell",
        ms(best.load),
        best.load.as_secs_f64() * 1e6 / CELLS as f64
    );
    println!(
        "     spawning (Route::spawn besides load_cell; the workers start the tasks meanwhile, \
         on the same 2 cores): {:.0} ms",
        ms(best.spawn.saturating_sub(best.load))
    );
    println!(
        "     until every task was polled once ({} with a backlog at their first model request): \
         {:.0} ms",
        (0..CELLS).filter(|n| n % 3 != 0).count(),
        ms(best.poll)
    );
    println!(
        "   runs: {}",
        runs.iter()
            .map(|r| format!(
                "{:.0} ms (open {:.0}, load {:.0}, spawn {:.0}, poll {:.0})",
                ms(r.total()),
                ms(r.open),
                ms(r.load),
                ms(r.spawn.saturating_sub(r.load)),
                ms(r.poll)
            ))
            .collect::<Vec<_>>()
            .join("; ")
    );

    // The same store after a service's history: the audit log a long-lived program writes, a
    // line a tool call. Opening checks every table a program resumes from, not the log.
    let grown = append_audit_log(&state, AUDIT_HISTORY);
    let runs: Vec<Resumed> = (0..RESUME_RUNS).map(|_| resume(&state)).collect();
    let long = runs.iter().min_by_key(|r| r.total()).expect("a resume run");
    println!(
        "   the same store with {AUDIT_HISTORY} audit lines more (+{:.1} MB, a service's history): \
         {:.0} ms (open {:.0} ms), {:.2}x the resume without them (open {:.2}x)",
        grown as f64 / 1e6,
        ms(long.total()),
        ms(long.open),
        long.total().as_secs_f64() / best.total().as_secs_f64(),
        long.open.as_secs_f64() / best.open.as_secs_f64()
    );
}

/// Appends `lines` audit lines to the store in `dir` in one transaction, straight through
/// SQLite; answers how many bytes the file grew by.
fn append_audit_log(dir: &Path, lines: usize) -> u64 {
    let file = dir.join(STORE_FILE);
    let before = std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0);
    let conn = rusqlite::Connection::open(&file).expect("the store file");
    conn.execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < ?1)
         INSERT INTO audit (at_ms, resident, tool, args_hash, duration_ms, outcome)
         SELECT 1764979200000 + i, 'r' || (i % 10000), 'add', printf('%064x', i * 2654435761),
                0.05, 'ok' FROM n",
        [lines as i64],
    )
    .expect("the audit lines");
    drop(conn);
    std::fs::metadata(&file).map(|m| m.len()).unwrap_or(0) - before
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let only: Vec<&str> = args[1..]
        .iter()
        .filter(|a| !a.starts_with('-'))
        .map(String::as_str)
        .collect();
    let wanted = |s: &str| only.is_empty() || only.contains(&s);
    let (started, load_before) = (Instant::now(), load());
    let sync_ms = wanted("fsync").then(fsync_section);
    if wanted("steps") {
        let rt = runtime();
        steps_section(&rt, sync_ms);
    }
    if wanted("resume") {
        resume_section();
    }
    println!(
        "(bench took {:.1} s; load average {:.2} before, {:.2} after: figures from a busy machine \
         are low)",
        started.elapsed().as_secs_f64(),
        load_before,
        load()
    );
}
