//! Nodes of a cluster (`colony serve --cluster nats://... --store postgres://...`): the release
//! binary against a real PostgreSQL and a real NATS server on loopback (the tests' harness
//! starts them), and the fake provider answering at once, so the figures are colony's with its
//! engines.
//!
//! 1. **Mails/s, one node and three**: 60 persisted residents; 16 clients post 3,000 mails with
//!    ids (round robin over the nodes), the clock stopping once every mail is served (the user
//!    turns in the residents' conversations, read from the shared store). With three nodes, two thirds of the mails
//!    reach their resident over NATS.
//! 2. **Takeover after SIGKILL**: one of the three nodes is killed; one mail is sent through
//!    the others to each resident it ran, and the clock stops when every one of them has served
//!    it on a node that took it over. With the default lease (10 s) and with `--lease 2s`.
//!
//! Run: `cargo bench --bench cluster` (about two minutes).

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use std::path::Path;

use colony::store::Store;
use colony::store::postgres::{PostgresStore, schema_for};
use colony::vocab::Role;
use serde_json::{Value, json};
use support::fake::{FakeProvider, Reply};
use support::script::Sandbox;
use support::serve::Served;

const RESIDENTS: usize = 60;
const MAILS: usize = 3_000;
const CLIENTS: usize = 16;

const PROGRAM: &str = r#"
for i = 1, 60 do
  ai.spawn{ name = string.format("r%02d", i), persist_conversation = true,
    deliver_to = function() end }
end
ai.watch{}
"#;

struct Bench {
    sb: Sandbox,
    nats: String,
    script: String,
}

impl Bench {
    /// The program's tables in the database `db`, read directly.
    fn store(&self, db: &str) -> PostgresStore {
        PostgresStore::open_in(db, Some(&schema_for(Path::new(&self.script)))).expect("the store")
    }

    /// A node of a fresh cluster (`db` names the store: each run has a database of its own).
    fn node(&self, db: &str, name: &str, lease: &str) -> Served {
        Served::start(
            &self.sb,
            &[
                "--store",
                db,
                "--cluster",
                &self.nats,
                "--node",
                name,
                "--lease",
                lease,
                &self.script,
            ],
        )
    }
}

fn residents(node: &Served) -> Vec<Value> {
    node.get("/api/programs/desk/residents?limit=1000").json["residents"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// The residents `node` runs itself, with what each has served.
fn local(node: &Served) -> Vec<(String, u64)> {
    residents(node)
        .iter()
        .filter(|r| r["state"] != "elsewhere" && r["state"] != "pending")
        .map(|r| {
            (
                r["name"].as_str().unwrap_or("").to_string(),
                r["served"].as_u64().unwrap_or(0),
            )
        })
        .collect()
}

/// Waits until every resident runs on exactly one of `nodes`.
fn placed(nodes: &[&Served]) {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let mut names: Vec<String> = nodes
            .iter()
            .flat_map(|n| local(n))
            .map(|(n, _)| n)
            .collect();
        let count = names.len();
        names.sort();
        names.dedup();
        if count == RESIDENTS && names.len() == RESIDENTS {
            return;
        }
        assert!(Instant::now() < deadline, "the residents were never placed");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The mails served so far, as the shared store has them: the user turns in the residents'
/// conversations (a node's `served` counts start again when a resident moves to it).
fn served(pg: &PostgresStore) -> u64 {
    (1..=RESIDENTS)
        .map(|i| {
            pg.load_cell(&format!("r{i:02}"))
                .ok()
                .flatten()
                .map_or(0, |c| {
                    c.messages.iter().filter(|m| m.role == Role::User).count()
                }) as u64
        })
        .sum()
}

/// Posts `MAILS` mails from `CLIENTS` clients over `nodes`; the time until all are served.
fn throughput(nodes: &[&Served], pg: &PostgresStore, tag: &str) -> (f64, f64) {
    let next = AtomicUsize::new(0);
    let start = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..CLIENTS {
            s.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= MAILS {
                        return;
                    }
                    let body = json!({
                        "to": format!("r{:02}", i % RESIDENTS + 1), "content": "x",
                        "id": format!("{tag}-{i}"),
                    });
                    let a = nodes[i % nodes.len()].mail("desk", body);
                    assert_eq!(a.status, 202, "{}", a.text);
                }
            });
        }
    });
    let accepted = start.elapsed();
    while served(pg) < MAILS as u64 {
        assert!(
            start.elapsed() < Duration::from_secs(600),
            "mail never all served"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let all = start.elapsed();
    (
        MAILS as f64 / accepted.as_secs_f64(),
        MAILS as f64 / all.as_secs_f64(),
    )
}

/// Three nodes with `lease`; SIGKILL one, mail each of its residents through the others, and
/// the time until every one has served its mail elsewhere.
fn takeover(bench: &Bench, lease: &str) -> (Duration, usize) {
    let db = support::postgres::database();
    let mut a = bench.node(&db, "a", lease);
    let b = bench.node(&db, "b", lease);
    let c = bench.node(&db, "c", lease);
    placed(&[&a, &b, &c]);
    let victims: Vec<String> = local(&a).into_iter().map(|(n, _)| n).collect();
    let mut child = a.child.take().expect("a runs");
    let killed = Instant::now();
    child.kill().expect("SIGKILL");
    child.wait().unwrap();
    for (i, name) in victims.iter().enumerate() {
        // Ids of this run's own: the NATS server (and its duplicate window) outlives the run.
        let body = json!({ "to": name, "content": "after", "id": format!("after-{lease}-{i}") });
        let via = if i % 2 == 0 { &b } else { &c };
        let r = via.mail("desk", body);
        assert_eq!(r.status, 202, "{}", r.text);
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let now: Vec<(String, u64)> = local(&b).into_iter().chain(local(&c)).collect();
        let done = victims
            .iter()
            .all(|v| now.iter().any(|(n, s)| n == v && *s >= 1));
        if done {
            return (killed.elapsed(), victims.len());
        }
        assert!(Instant::now() < deadline, "never taken over");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn main() {
    let nats = support::nats::server().url();
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("ok"));
    let sb = Sandbox::new();
    sb.write(
        "config.toml",
        &format!(
            "[use.general]\nprovider = \"openai\"\nmodel = \"m\"\nkey = \"bench-key-0123456789\"\nbase_url = \"{}\"\n",
            fake.base_url("openai")
        ),
    );
    let script = sb.write("desk.lua", PROGRAM).display().to_string();
    let bench = Bench { sb, nats, script };

    let db = support::postgres::database();
    let one = bench.node(&db, "solo", "10s");
    placed(&[&one]);
    let pg = bench.store(&db);
    let (acc1, srv1) = throughput(&[&one], &pg, "one");
    drop(one);
    println!(
        "cluster: {MAILS} mails from {CLIENTS} clients to {RESIDENTS} persisted residents, one node: \
         {acc1:.0} accepted/s, {srv1:.0} served/s"
    );
    fake.take_requests();

    let db = support::postgres::database();
    let nodes: Vec<Served> = ["a", "b", "c"]
        .iter()
        .map(|n| bench.node(&db, n, "10s"))
        .collect();
    let refs: Vec<&Served> = nodes.iter().collect();
    placed(&refs);
    let pg = bench.store(&db);
    let (acc3, srv3) = throughput(&refs, &pg, "three");
    drop(nodes);
    println!(
        "cluster: the same over three nodes (2/3 of the mails over NATS): {acc3:.0} accepted/s, \
         {srv3:.0} served/s ({:.2}x one node)",
        srv3 / srv1
    );
    fake.take_requests();

    for lease in ["10s", "2s"] {
        let (took, n) = takeover(&bench, lease);
        println!(
            "cluster: SIGKILL of a node, --lease {lease}: its {n} residents serve again on the \
             others {:.2} s after the kill",
            took.as_secs_f64()
        );
    }
}
