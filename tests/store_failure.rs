//! A persisted resident whose store cannot write: the step's reply cannot be saved, so its
//! tool calls do not run (a restart could not know they had), and the turn takes the outage
//! path until the store writes again; then the calls run once. A call whose start cannot be
//! journaled (in a cluster: the node lost the resident's lease) does not run either.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use colony::config::Config;
use colony::core::{Ask, Core};
use colony::infer::SharedInfer;
use colony::infer::clock::ManualClock;
use colony::infer::scripted::Scripted;
use colony::lua::bridge::LuaBridge;
use colony::providers::Providers;
use colony::providers::replay::Cassette;
use colony::residents::resident::DEFAULT_MAX_HOP;
use colony::residents::{Deliver, DeliveryKind, Mail, ResidentSpec, Restart, RestartPolicy, Route};
use colony::store::memory::MemoryStore;
use colony::store::{
    AuditEntry, AuditFilter, JournalEntry, SavedResident, Store, StoreError, StoreResult,
};
use colony::turn::{Compaction, ToolDef};
use colony::vocab::{Inferred, Message, Part, Role, Stop, ToolCall, Usage};
use serde_json::{Value, json};

/// A store whose `commit_step` fails while `broken` is set, whose `journal` fails while
/// `journal_broken` is, and whose `push_backlog` saves but answers an error while
/// `answer_lost` is (PostgreSQL stopped as the commit went through: the row is there, its
/// answer never came).
#[derive(Default)]
struct Flaky {
    inner: MemoryStore,
    broken: AtomicBool,
    journal_broken: AtomicBool,
    answer_lost: AtomicBool,
    /// `journal` fails as a full disk does.
    disk_full: AtomicBool,
    /// How many `commit_step`s `broken` refused.
    refused: AtomicUsize,
    /// `update` (how usage is counted) fails as a full disk does.
    update_broken: AtomicBool,
}

impl Store for Flaky {
    fn get(&self, s: &str, k: &str) -> StoreResult<Option<Value>> {
        self.inner.get(s, k)
    }
    fn set(&self, s: &str, k: &str, v: &Value) -> StoreResult<()> {
        self.inner.set(s, k, v)
    }
    fn delete(&self, s: &str, k: &str) -> StoreResult<bool> {
        self.inner.delete(s, k)
    }
    fn list(&self, s: &str, p: &str) -> StoreResult<Vec<String>> {
        self.inner.list(s, p)
    }
    fn update(
        &self,
        s: &str,
        k: &str,
        f: &mut dyn FnMut(Option<Value>) -> Result<Option<Value>, String>,
    ) -> StoreResult<Option<Value>> {
        if self.update_broken.load(Ordering::SeqCst) {
            return Err(StoreError::Io("database or disk is full".into()));
        }
        self.inner.update(s, k, f)
    }
    fn conversations(&self) -> StoreResult<Vec<String>> {
        self.inner.conversations()
    }
    fn load_cell(&self, n: &str) -> StoreResult<Option<SavedResident>> {
        self.inner.load_cell(n)
    }
    fn push_backlog(&self, n: &str, m: &Mail) -> StoreResult<Option<i64>> {
        let saved = self.inner.push_backlog(n, m)?;
        if self.answer_lost.load(Ordering::SeqCst) {
            return Err(StoreError::Io("the connection was closed".into()));
        }
        Ok(saved)
    }
    fn commit_step(&self, n: &str, m: &[Message], served: &[i64], d: u64) -> StoreResult<()> {
        if self.broken.load(Ordering::SeqCst) {
            self.refused.fetch_add(1, Ordering::SeqCst);
            return Err(StoreError::Io("the disk is full".into()));
        }
        self.inner.commit_step(n, m, served, d)
    }
    fn journal(&self, n: &str, e: &JournalEntry) -> StoreResult<()> {
        if self.journal_broken.load(Ordering::SeqCst) {
            return Err(StoreError::Fenced("its lease was taken over".into()));
        }
        if self.disk_full.load(Ordering::SeqCst) {
            return Err(StoreError::Io("database or disk is full".into()));
        }
        self.inner.journal(n, e)
    }
    fn drop_backlog(&self, n: &str, rows: &[i64]) -> StoreResult<usize> {
        self.inner.drop_backlog(n, rows)
    }
    fn clear_cell(&self, n: &str) -> StoreResult<bool> {
        self.inner.clear_cell(n)
    }
    fn breaker(&self, k: &str) -> StoreResult<Option<colony::infer::breaker::BreakerState>> {
        self.inner.breaker(k)
    }
    fn save_breaker(&self, k: &str, s: &colony::infer::breaker::BreakerState) -> StoreResult<()> {
        self.inner.save_breaker(k, s)
    }
    fn audit(&self, e: &AuditEntry) -> StoreResult<()> {
        self.inner.audit(e)
    }
    fn audit_log(&self, f: &AuditFilter) -> StoreResult<Vec<AuditEntry>> {
        self.inner.audit_log(f)
    }
}

/// A test's runtime, its store and the route over it (the cassette the providers replay, empty:
/// every model call here is scripted).
struct Setup {
    rt: tokio::runtime::Runtime,
    store: Arc<Flaky>,
    route: Route,
    _cassette: tempfile::NamedTempFile,
}

fn setup(store: Flaky) -> Setup {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let file = tempfile::NamedTempFile::new().unwrap();
    let cassette = Cassette::load(file.path()).unwrap();
    let core = Core::new(
        Config::default(),
        Providers::new(Some(Arc::new(cassette)), None),
        rt.handle().clone(),
    );
    let store = Arc::new(store);
    let route = Route::with_store(core, LuaBridge::detached(), Some(store.clone()));
    Setup {
        rt,
        store,
        route,
        _cassette: file,
    }
}

/// The tool `work`, and how many times it ran.
fn counted_work() -> (ToolDef, Arc<AtomicUsize>) {
    let runs = Arc::new(AtomicUsize::new(0));
    let counted = runs.clone();
    let work = ToolDef::native("work", "Works", json!({}), move |_| {
        let counted = counted.clone();
        async move {
            counted.fetch_add(1, Ordering::SeqCst);
            Ok(json!("worked"))
        }
    })
    .unwrap();
    (work, runs)
}

fn call() -> Inferred {
    Inferred {
        message: Message::new(
            Role::Assistant,
            vec![Part::ToolCall(ToolCall {
                id: "c1".into(),
                name: "work".into(),
                arguments: "{}".into(),
                opaque: None,
            })],
        ),
        stop: Stop::ToolUse,
        usage: Usage::default(),
        model: None,
    }
}

#[test]
fn a_step_that_cannot_be_saved_runs_no_tool() {
    let Setup {
        rt,
        store,
        route,
        _cassette,
    } = setup(Flaky {
        inner: MemoryStore::new(),
        broken: AtomicBool::new(true),
        ..Flaky::default()
    });
    let (work, runs) = counted_work();
    // The model asks for `work` (that answer cannot be saved); once the store writes again the
    // resident runs the call it kept and the model answers.
    let mut rx = spawn_r(&route, vec![work], vec![call(), text("done")]);
    route.mail(Mail::new("r", "t", "go", 0)).unwrap();
    rt.block_on(async {
        let first = rx.recv().await.unwrap();
        assert_eq!(first.kind, DeliveryKind::Outage);
        assert!(first.text.contains("the disk is full"), "{}", first.text);
        assert_eq!(
            runs.load(Ordering::SeqCst),
            0,
            "no tool ran with its call unsaved"
        );
        store.broken.store(false, Ordering::SeqCst);
        let mut kinds = Vec::new();
        while let Ok(Some(d)) = tokio::time::timeout(Duration::from_secs(30), rx.recv()).await {
            kinds.push(d.kind);
            if d.kind == DeliveryKind::Reply {
                assert_eq!(d.text, "done");
                break;
            }
        }
        assert_eq!(kinds, [DeliveryKind::Recovered, DeliveryKind::Reply]);
    });
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the call ran once, after the save"
    );
    let cell = store.load_cell("r").unwrap().unwrap();
    let roles: Vec<Role> = cell.messages.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [Role::User, Role::Assistant, Role::Tool, Role::Assistant]
    );
    // The mail is in the conversation, so not in the backlog: the first commit of its turn
    // (which would have removed it) failed, and the turn's later commits saved the conversation
    // and left its row, which a restart or another node then served a second time.
    assert!(cell.backlog.is_empty(), "{:?}", cell.backlog);
}

/// A final answer that cannot be saved is not delivered: it was handed on, and its mail, still in
/// the saved backlog, was served and delivered a second time after a restart. The turn waits
/// for the store (its notice names the store, not the model) and asks the model again.
#[test]
fn a_final_answer_that_cannot_be_saved_is_not_delivered() {
    let Setup {
        rt,
        store,
        route,
        _cassette,
    } = setup(Flaky {
        broken: AtomicBool::new(true),
        ..Flaky::default()
    });
    let mut rx = spawn_r(&route, vec![], vec![text("unsaved"), text("saved")]);
    route.mail(Mail::new("r", "t", "go", 0)).unwrap();
    rt.block_on(async {
        let first = rx.recv().await.unwrap();
        assert_eq!(first.kind, DeliveryKind::Outage, "{}", first.text);
        assert!(
            first
                .text
                .contains("cannot save its progress to its store (cannot save the conversation"),
            "{}",
            first.text
        );
        store.broken.store(false, Ordering::SeqCst);
        let recovered = rx.recv().await.unwrap();
        assert_eq!(recovered.kind, DeliveryKind::Recovered);
        assert!(
            recovered
                .text
                .starts_with("[colony] r saves its progress again after"),
            "{}",
            recovered.text
        );
        let reply = rx.recv().await.unwrap();
        assert_eq!(
            (reply.kind, reply.text.as_str()),
            (DeliveryKind::Reply, "saved")
        );
    });
    let cell = store.load_cell("r").unwrap().unwrap();
    let texts: Vec<String> = cell.messages.iter().map(Message::text).collect();
    assert_eq!(texts, ["[mail from t] go", "saved"]);
    assert!(cell.backlog.is_empty(), "{:?}", cell.backlog);
}

/// A step's results whose save failed are saved before a model reads them: the turn taken up
/// again after the outage's wait asked the model with them while the store still refused.
#[test]
fn results_that_could_not_be_saved_reach_the_model_only_once_saved() {
    let Setup {
        rt,
        store,
        route,
        _cassette,
    } = setup(Flaky::default());
    // The tool fills the disk: its result cannot be saved.
    let breaks = store.clone();
    let work = ToolDef::native("work", "Works", json!({}), move |_| {
        breaks.broken.store(true, Ordering::SeqCst);
        async move { Ok(json!("worked")) }
    })
    .unwrap();
    let (mut rx, model) = spawn_scripted(&route, vec![work], vec![call(), text("done")]);
    route.mail(Mail::new("r", "t", "go", 0)).unwrap();
    rt.block_on(async {
        let first = rx.recv().await.unwrap();
        assert_eq!(first.kind, DeliveryKind::Outage, "{}", first.text);
        // Two tries after the outage's first wait, the store still refusing.
        tokio::time::timeout(Duration::from_secs(60), async {
            while store.refused.load(Ordering::SeqCst) < 3 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await
        .expect("the turn is tried again");
        assert_eq!(
            model.calls().len(),
            1,
            "the model was asked with unsaved results"
        );
        store.broken.store(false, Ordering::SeqCst);
        assert_eq!(rx.recv().await.unwrap().kind, DeliveryKind::Recovered);
        let reply = rx.recv().await.unwrap();
        assert_eq!(
            (reply.kind, reply.text.as_str()),
            (DeliveryKind::Reply, "done")
        );
    });
    assert_eq!(model.calls().len(), 2);
}

/// The call's start cannot be journaled (a cluster node whose lease was taken over): the tool
/// does not run, its result says why, and the turn goes on to the model's answer.
#[test]
fn a_call_whose_start_cannot_be_journaled_does_not_run() {
    let Setup {
        rt,
        store,
        route,
        _cassette,
    } = setup(Flaky {
        inner: MemoryStore::new(),
        journal_broken: AtomicBool::new(true),
        ..Flaky::default()
    });
    let (work, runs) = counted_work();
    let mut rx = spawn_r(&route, vec![work], vec![call(), text("done")]);
    route.mail(Mail::new("r", "t", "go", 0)).unwrap();
    rt.block_on(async {
        let d = tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .expect("a delivery")
            .unwrap();
        assert_eq!(d.kind, DeliveryKind::Reply, "{}", d.text);
    });
    assert_eq!(runs.load(Ordering::SeqCst), 0, "the call did not run");
    let cell = store.load_cell("r").unwrap().unwrap();
    let result = cell.messages[2]
        .tool_results()
        .next()
        .expect("the call's result");
    assert!(result.is_error, "{result:?}");
    assert!(
        result.content.contains("not run: cannot journal the call")
            && result.content.contains("its lease was taken over"),
        "{}",
        result.content
    );
}

fn text(reply: &str) -> Inferred {
    Inferred {
        message: Message::assistant(reply),
        stop: Stop::EndTurn,
        usage: Usage::default(),
        model: None,
    }
}

/// `r`, keeping its conversation in `route`'s store, with `tools`, answered by `answers`.
fn spawn_r(
    route: &Route,
    tools: Vec<ToolDef>,
    answers: Vec<Inferred>,
) -> tokio::sync::mpsc::UnboundedReceiver<colony::residents::Delivery> {
    spawn_scripted(route, tools, answers).0
}

/// [`spawn_r`], and the model behind it (to count its calls).
fn spawn_scripted(
    route: &Route,
    tools: Vec<ToolDef>,
    answers: Vec<Inferred>,
) -> (
    tokio::sync::mpsc::UnboundedReceiver<colony::residents::Delivery>,
    Arc<Scripted>,
) {
    let (rx, model, _) = spawn_budgeted(route, tools, answers, Default::default());
    (rx, model)
}

/// [`spawn_scripted`] held to `budgets`, and the resident itself.
fn spawn_budgeted(
    route: &Route,
    tools: Vec<ToolDef>,
    answers: Vec<Inferred>,
    budgets: colony::residents::budget::Budgets,
) -> (
    tokio::sync::mpsc::UnboundedReceiver<colony::residents::Delivery>,
    Arc<Scripted>,
    Arc<colony::residents::resident::Resident>,
) {
    let model = Arc::new(Scripted::new(
        ManualClock::new(0),
        answers.into_iter().map(Ok),
    ));
    let stack: SharedInfer = model.clone();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let resident = route
        .spawn(ResidentSpec {
            name: "r".into(),
            ask: Ask::default(),
            tools,
            changing_tools: None,
            max_steps: 8,
            max_hop: DEFAULT_MAX_HOP,
            mailbox: colony::residents::mail::CAPACITY,
            compaction: Compaction {
                enabled: false,
                ..Compaction::default()
            },
            deliver: Deliver::Channel(tx),
            restart: RestartPolicy::new(Restart::Permanent),
            stack,
            persist: true,
            workspace: None,
            budgets,
        })
        .unwrap();
    route.open();
    (rx, model, resident)
}

/// A mail whose save landed but whose answer was lost (the sender was told "not saved" and
/// retried, or gave up) has a backlog row no queue holds. The turns after it removed "the first
/// N rows", its row in place of their own: the last mail served stayed in the backlog, and the
/// next owner (a restart, another node's takeover) served it a second time, its tools with it.
/// And the mail itself waited for that restart. Each turn now removes its own rows, and the
/// resident compares the saved backlog with its queue after a failed save: the mail is served
/// in this run, once, and nothing is left for a restart to serve again.
#[test]
fn a_mail_saved_whose_answer_was_lost_is_served_once_in_this_run() {
    let Setup {
        rt,
        store,
        route,
        _cassette,
    } = setup(Flaky::default());
    let mut rx = spawn_r(
        &route,
        Vec::new(),
        vec![text("zero"), text("one"), text("two")],
    );
    let mail = |content: &str| Mail {
        id: Some(content.into()),
        ..Mail::new("r", "t", content, 0)
    };
    let reply = |rx: &mut tokio::sync::mpsc::UnboundedReceiver<_>| -> String {
        let d: colony::residents::Delivery = rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(30), rx.recv()).await })
            .expect("a reply")
            .unwrap();
        d.text
    };
    store.answer_lost.store(true, Ordering::SeqCst);
    assert!(route.mail(mail("lost answer")).is_err(), "said not saved");
    store.answer_lost.store(false, Ordering::SeqCst);
    assert_eq!(
        reply(&mut rx),
        "zero",
        "the kept mail is served without a restart"
    );
    for (sent, answer) in [("first", "one"), ("second", "two")] {
        route.mail(mail(sent)).unwrap();
        assert_eq!(reply(&mut rx), answer);
    }
    route.stop("done");
    let cell = store.load_cell("r").unwrap().unwrap();
    assert!(
        cell.backlog.is_empty(),
        "nothing left to serve again: {:?}",
        cell.backlog
    );
    let served: Vec<String> = cell
        .messages
        .iter()
        .filter(|m| m.role == Role::User)
        .map(|m| m.text())
        .collect();
    assert_eq!(
        served,
        [
            "[mail from t] lost answer",
            "[mail from t] first",
            "[mail from t] second"
        ]
    );
}

/// The calls' start cannot be journaled because the disk is full: none runs, and the turn
/// waits as one whose step could not be saved; once the disk has room the calls run, once, and
/// the model answers. They were answered "not run: cannot journal the call", the model read
/// that, the turn ended and its mail counted as served: the work was never done.
#[test]
fn a_step_whose_calls_cannot_be_journaled_waits_for_the_disk() {
    let Setup {
        rt,
        store,
        route,
        _cassette,
    } = setup(Flaky {
        disk_full: AtomicBool::new(true),
        ..Flaky::default()
    });
    let (work, runs) = counted_work();
    let mut rx = spawn_r(&route, vec![work], vec![call(), text("done")]);
    route.mail(Mail::new("r", "t", "go", 0)).unwrap();
    rt.block_on(async {
        let first = tokio::time::timeout(Duration::from_secs(30), rx.recv())
            .await
            .expect("a delivery")
            .unwrap();
        assert_eq!(first.kind, DeliveryKind::Outage, "{}", first.text);
        assert!(first.text.contains("disk is full"), "{}", first.text);
        assert_eq!(runs.load(Ordering::SeqCst), 0, "nothing ran unjournaled");
        store.disk_full.store(false, Ordering::SeqCst);
        let mut kinds = Vec::new();
        while let Ok(Some(d)) = tokio::time::timeout(Duration::from_secs(30), rx.recv()).await {
            kinds.push(d.kind);
            if d.kind == DeliveryKind::Reply {
                assert_eq!(d.text, "done");
                break;
            }
        }
        assert_eq!(kinds, [DeliveryKind::Recovered, DeliveryKind::Reply]);
    });
    assert_eq!(runs.load(Ordering::SeqCst), 1, "the call ran once");
    let cell = store.load_cell("r").unwrap().unwrap();
    let result = cell.messages[2].tool_results().next().expect("its result");
    assert_eq!(result.content, "worked");
    assert!(cell.backlog.is_empty());
}

/// Usage the store cannot record (a full disk) is kept and recorded with the next, and a
/// budgeted resident does not start a turn while some is unrecorded: it went on spending past
/// its budget, uncounted (three times its budget in a user's run on a full disk).
#[test]
fn usage_that_cannot_be_recorded_holds_a_budgeted_resident_until_it_is() {
    let Setup {
        rt,
        store,
        route,
        _cassette,
    } = setup(Flaky::default());
    let spent = |reply: &str| Inferred {
        usage: Usage {
            input: 40,
            output: 20,
            ..Usage::default()
        },
        ..text(reply)
    };
    let budgets = colony::residents::budget::Budgets {
        own: Some(colony::residents::budget::Budget {
            tokens: Some(100),
            cost: None,
            per: colony::residents::budget::Window::Day,
        }),
        program: None,
    };
    let (mut rx, model, resident) = spawn_budgeted(
        &route,
        Vec::new(),
        vec![spent("one"), spent("two"), spent("three")],
        budgets,
    );
    store.update_broken.store(true, Ordering::SeqCst);
    rt.block_on(async {
        route.mail(Mail::new("r", "t", "a", 0)).unwrap();
        assert_eq!(next(&mut rx).await.text, "one");
        // Its 60 tokens are not counted yet: no turn until they are.
        route.mail(Mail::new("r", "t", "b", 0)).unwrap();
        let held = next(&mut rx).await;
        assert_eq!(held.kind, DeliveryKind::Blocked, "{}", held.text);
        assert!(
            held.text.contains("its usage could not be recorded"),
            "{}",
            held.text
        );
        // The store writes again: the 60 are recorded, under the 100 it serves "b"; the next
        // turn's 60 bring it over.
        store.update_broken.store(false, Ordering::SeqCst);
        // The notice is delivered, then the resident marked blocked: an unblock between the
        // two found it not blocked yet (seen once under the full run's load).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while resident.blocked_by().is_none() {
            assert!(std::time::Instant::now() < deadline, "never blocked");
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        assert!(resident.unblock());
        assert_eq!(next(&mut rx).await.text, "two");
        route.mail(Mail::new("r", "t", "c", 0)).unwrap();
        let over = next(&mut rx).await;
        assert_eq!(over.kind, DeliveryKind::Blocked, "{}", over.text);
        assert!(over.text.contains("(120 used)"), "{}", over.text);
    });
    assert_eq!(model.calls().len(), 2);
}

/// The next delivery, within a generous bound (a hang fails rather than waits for ever).
async fn next(
    rx: &mut tokio::sync::mpsc::UnboundedReceiver<colony::residents::Delivery>,
) -> colony::residents::Delivery {
    tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .expect("a delivery within 30 s")
        .expect("the resident's channel open")
}

/// The notice of a recovery counts the arrivals held, also when the turn that recovers finishes
/// one cut short and serves no mail itself: it said "0 held arrivals were served", and the one
/// that arrived during the outage was then served.
#[test]
fn a_recovery_counts_the_arrivals_held_behind_a_turn_cut_short() {
    let Setup {
        rt,
        store,
        route,
        _cassette,
    } = setup(Flaky {
        inner: MemoryStore::new(),
        broken: AtomicBool::new(true),
        ..Flaky::default()
    });
    let (work, _runs) = counted_work();
    let mut rx = spawn_r(
        &route,
        vec![work],
        vec![call(), text("done"), text("and done")],
    );
    route.mail(Mail::new("r", "t", "go", 0)).unwrap();
    rt.block_on(async {
        assert_eq!(next(&mut rx).await.kind, DeliveryKind::Outage);
        route.mail(Mail::new("r", "t", "and this", 0)).unwrap();
        store.broken.store(false, Ordering::SeqCst);
        let recovered = next(&mut rx).await;
        assert_eq!(recovered.kind, DeliveryKind::Recovered);
        assert!(
            recovered.text.ends_with("; 1 held arrival is served."),
            "{}",
            recovered.text
        );
        assert_eq!(next(&mut rx).await.text, "done");
        assert_eq!(next(&mut rx).await.text, "and done");
    });
}
