//! Several `colony serve` nodes sharing one program (`--cluster nats://... --store postgres://...`),
//! against a real PostgreSQL and a real NATS server with JetStream on loopback.
//!
//! The three-node test: a program of 60 persisted residents and a tool that counts each of its
//! runs by call id in the store (one call per turn, for the mails it serves). Three nodes start and spread the residents; 10,000 mails with
//! ids are sent through the nodes' APIs (each retried on another node until one accepts it);
//! midway one node is SIGKILLed, later another is SIGTERMed and a fourth joins, and then one
//! is paused with SIGSTOP past its leases and resumed (its writes after the pause must be
//! refused: another node has taken its residents over). At the end:
//! - every acknowledged mail is in its resident's conversation exactly once, a reply after it;
//! - no tool call ran twice, and every call a conversation shows as finished ran;
//! - every conversation is a valid transcript (each call answered once);
//! - every resident is owned by exactly one live node (the nodes' APIs and the lease table),
//!   and each node names, for a resident it does not run, the node that does.
//!
//! `COLONY_CLUSTER_DEBUG=1` prints, while it drains, the residents with mail or calls waiting.

mod support;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use colony::store::postgres::{PostgresStore, schema_for};
use colony::store::{SavedResident, Store};
use colony::vocab::{Message, Role};
use serde_json::{Value, json};
use support::fake::{FakeProvider, Reply};
use support::serve::Served;
use support::styled;

const RESIDENTS: usize = 60;
const MAILS: usize = 10_000;
/// How many clients send at once.
const SENDERS: usize = 16;
/// Short leases, so a node that dies is taken over within the test's patience.
const LEASE: &str = "2s";

const PROGRAM: &str = r#"
local work = ai.tool{ name = "work", description = "Does the work the mails ask for",
  parameters = { mails = "string" },
  handler = function(args, ctx)
    store.update("runs/" .. ctx.call_id, function(n) return (n or 0) + 1 end)
    return "worked on mails " .. args.mails
  end }
for i = 1, 60 do
  ai.spawn{ name = string.format("r%02d", i), provider = "openai", model = "m",
    persist_conversation = true, tools = { work }, deliver_to = function() end }
end
ai.watch{}
"#;

fn resident_of(n: usize) -> String {
    format!("r{:02}", n % RESIDENTS + 1)
}

/// One call of `work` for the mails of the trailing user turns; after its result, a reply (or
/// the call again, under a new id, when a takeover interrupted it).
fn respond(body: &Value) -> Reply {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let last = messages.last().cloned().unwrap_or(Value::Null);
    if last["role"] == "tool" {
        let mut tail = Vec::new();
        for m in messages.iter().rev() {
            if m["role"] != "tool" {
                break;
            }
            tail.push(m.clone());
        }
        let calls = messages
            .iter()
            .rev()
            .find(|m| m["role"] == "assistant")
            .map(|m| m["tool_calls"].as_array().cloned().unwrap_or_default())
            .unwrap_or_default();
        let again: Vec<(String, String, Value)> = tail
            .iter()
            .filter(|r| r["content"].as_str().unwrap_or("").contains("interrupted"))
            .filter_map(|r| {
                let call = calls.iter().find(|c| c["id"] == r["tool_call_id"])?;
                let args: Value =
                    serde_json::from_str(call["function"]["arguments"].as_str()?).ok()?;
                Some((format!("{}r", call["id"].as_str()?), "work".into(), args))
            })
            .collect();
        if !again.is_empty() {
            return Reply::tool_calls(again);
        }
        return Reply::text("answered");
    }
    let mut mails = Vec::new();
    for m in messages.iter().rev() {
        if m["role"] != "user" {
            break;
        }
        if let Some(n) = m["content"]
            .as_str()
            .and_then(|t| t.strip_prefix("[mail from sender] mail "))
        {
            mails.push(n.parse::<u64>().unwrap());
        }
    }
    mails.reverse();
    let Some(first) = mails.first() else {
        return Reply::text("nothing to do");
    };
    // One call for the mails a turn serves (up to 24), named by the first.
    let list: Vec<String> = mails.iter().map(u64::to_string).collect();
    Reply::tool_call(
        format!("w{first}"),
        "work",
        json!({ "mails": list.join(",") }),
    )
}

struct Cluster<'a> {
    sb: &'a support::script::Sandbox,
    script: String,
    store: String,
    nats: String,
}

impl Cluster<'_> {
    fn node(&self, name: &str) -> Served {
        Served::start(
            self.sb,
            &[
                "--store",
                &self.store,
                "--cluster",
                &self.nats,
                "--node",
                name,
                "--lease",
                LEASE,
                &self.script,
            ],
        )
    }
}

/// The residents each node runs itself (not `elsewhere`), by node name.
fn local(nodes: &[(&str, &Served)]) -> BTreeMap<String, Vec<String>> {
    local_in("desk", nodes)
}

/// [`local`] for the program `program` (the file's stem).
fn local_in(program: &str, nodes: &[(&str, &Served)]) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    for (name, served) in nodes {
        let a = served.get(&format!("/api/programs/{program}/residents?limit=1000"));
        let list = a.json["residents"].as_array().cloned().unwrap_or_default();
        let mine: Vec<String> = list
            .iter()
            .filter(|r| {
                // One that no node runs says so, not "elsewhere" on no node.
                assert!(
                    r["state"] != "elsewhere" || r["node"].is_string(),
                    "elsewhere, but on no node: {r}"
                );
                !["elsewhere", "pending", "unplaced"].contains(&r["state"].as_str().unwrap_or(""))
            })
            .map(|r| {
                assert_eq!(r["node"], *name, "a resident here names its node: {r}");
                r["name"].as_str().unwrap().to_string()
            })
            .collect();
        out.insert(name.to_string(), mine);
    }
    out
}

/// Waits until every resident runs on exactly one of `nodes`, each node running some.
fn wait_spread(nodes: &[(&str, &Served)]) -> BTreeMap<String, Vec<String>> {
    wait_spread_in("desk", nodes)
}

/// [`wait_spread`] for the program `program`.
fn wait_spread_in(program: &str, nodes: &[(&str, &Served)]) -> BTreeMap<String, Vec<String>> {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let now = local_in(program, nodes);
        let all: Vec<&String> = now.values().flatten().collect();
        let distinct: HashSet<&&String> = all.iter().collect();
        if all.len() == RESIDENTS
            && distinct.len() == RESIDENTS
            && now.values().all(|v| !v.is_empty())
        {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "the residents were never spread over {:?}: {now:?}",
            nodes.iter().map(|n| n.0).collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Waits (a minute at most) until `program` on `node` is in `state`: its view then.
fn program_in_state(node: &Served, program: &str, state: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let p = node.get(&format!("/api/programs/{program}")).json;
        if p["state"] == state {
            return p;
        }
        assert!(Instant::now() < deadline, "never {state}: {p}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Sends mail `n` through `nodes` (starting at one chosen by `n`) until one accepts it.
fn send(nodes: &[&Served], n: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    let body = json!({
        "to": resident_of(n), "source": "sender", "content": format!("mail {n}"),
        "id": format!("m{n}"),
    });
    let mut i = n;
    loop {
        let a = nodes[i % nodes.len()].mail("desk", body.clone());
        if a.status == 202 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "mail {n} was never accepted: {} {}",
            a.status,
            a.text
        );
        i += 1;
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Sends mails `from..=to`, sixteen senders at a time (as many clients would).
fn send_range(nodes: &[&Served], from: usize, to: usize, fake: &FakeProvider) {
    let next = AtomicUsize::new(from);
    std::thread::scope(|s| {
        for _ in 0..SENDERS {
            s.spawn(|| {
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n > to {
                        return;
                    }
                    send(nodes, n);
                    if n.is_multiple_of(500) {
                        // The fake keeps every request it saw: let them go.
                        fake.take_requests();
                    }
                }
            });
        }
    });
}

fn signal(served: &Served, sig: &str) {
    let pid = served.child.as_ref().unwrap().id().to_string();
    let ok = std::process::Command::new("kill")
        .args([sig, &pid])
        .status()
        .unwrap()
        .success();
    assert!(ok, "kill {sig} {pid}");
}

#[test]
fn three_nodes_share_sixty_residents_and_lose_nothing() {
    let store_url = support::postgres::database();
    let nats = support::nats::server().url();
    let fake = FakeProvider::start();
    fake.set_responder(|body, _| respond(body));
    let sb = styled(&fake, "openai");
    let script = sb.write("desk.lua", PROGRAM);
    let cluster = Cluster {
        sb: &sb,
        script: script.display().to_string(),
        store: store_url.clone(),
        nats,
    };
    let started = Instant::now();
    let mut n1 = cluster.node("n1");
    let mut n2 = cluster.node("n2");
    let n3 = cluster.node("n3");
    let spread = wait_spread(&[("n1", &n1), ("n2", &n2), ("n3", &n3)]);
    eprintln!(
        "spread over three nodes after {:?}: {:?}",
        started.elapsed(),
        spread.iter().map(|(k, v)| (k, v.len())).collect::<Vec<_>>()
    );

    send_range(&[&n1, &n2, &n3], 1, 3000, &fake);
    eprintln!(
        "3,000 mails accepted after {:?}; SIGKILL n1",
        started.elapsed()
    );
    let mut c1 = n1.child.take().unwrap();
    c1.kill().unwrap();
    c1.wait().unwrap();

    send_range(&[&n2, &n3], 3001, 6000, &fake);
    eprintln!("6,000 accepted after {:?}; SIGTERM n2", started.elapsed());
    signal(&n2, "-TERM");
    let status = n2.child.take().unwrap().wait().unwrap();
    assert!(
        status.success(),
        "n2 drained and ended: {status:?}\n{}",
        n2.stderr()
    );
    let n4 = cluster.node("n4");

    send_range(&[&n3, &n4], 6001, 8000, &fake);
    eprintln!("8,000 accepted after {:?}; SIGSTOP n3", started.elapsed());
    signal(&n3, "-STOP");
    // Past its leases: n4 takes its residents over while it sleeps.
    let paused = Instant::now();
    send_range(&[&n4], 8001, 9000, &fake);
    while paused.elapsed() < Duration::from_secs(6) {
        std::thread::sleep(Duration::from_millis(100));
    }
    signal(&n3, "-CONT");
    send_range(&[&n3, &n4], 9001, MAILS, &fake);
    eprintln!("10,000 accepted after {:?}", started.elapsed());

    // Drained: every mail answered, nothing waiting, read from the shared store itself.
    let pg = PostgresStore::open_in(&store_url, Some(&schema_for(&script))).unwrap();
    let names: Vec<String> = (0..RESIDENTS).map(resident_of).collect();
    let deadline = Instant::now() + Duration::from_secs(300);
    let cells = loop {
        let cells: Vec<(String, SavedResident)> = names
            .iter()
            .map(|n| (n.clone(), pg.load_cell(n).unwrap().unwrap_or_default()))
            .collect();
        let answered = cells
            .iter()
            .map(|(_, c)| c.messages.iter().filter(|m| is_reply(m)).count())
            .sum::<usize>();
        let waiting = cells
            .iter()
            .any(|(_, c)| !c.backlog.is_empty() || !c.journal.is_empty());
        if !waiting && all_answered(&cells) {
            eprintln!("drained after {:?} ({answered} replies)", started.elapsed());
            break cells;
        }
        if std::env::var_os("COLONY_CLUSTER_DEBUG").is_some() {
            let busy: Vec<String> = cells
                .iter()
                .filter(|(_, c)| !c.backlog.is_empty() || !c.journal.is_empty())
                .map(|(n, c)| format!("{n}:{}/{}", c.backlog.len(), c.journal.len()))
                .collect();
            eprintln!("{:?} waiting: {busy:?}", started.elapsed());
        }
        assert!(
            Instant::now() < deadline,
            "not drained: {answered} replies so far\nn3:\n{}\nn4:\n{}",
            tail(&n3.stderr()),
            tail(&n4.stderr())
        );
        std::thread::sleep(Duration::from_secs(1));
    };

    let mut answered = BTreeMap::new();
    let mut finished = 0;
    for (name, cell) in &cells {
        finished += support::transcript::check(name, "sender", &cell.messages, &mut answered);
    }
    for n in 1..=MAILS {
        assert_eq!(
            answered.get(&n),
            Some(&1),
            "mail {n} answered exactly once (to {})",
            resident_of(n)
        );
        assert_eq!(answered.len(), MAILS, "answered only the mails sent");
    }
    let mut runs = 0;
    for key in pg.list("", "runs/").unwrap() {
        let count = pg.get("", &key).unwrap().unwrap().as_u64().unwrap();
        assert_eq!(count, 1, "{key} ran {count} times");
        runs += 1;
    }
    assert!(runs >= finished, "{runs} runs, {finished} finished calls");

    // Every resident owned by exactly one live node, and the lease table agrees.
    let now = wait_spread(&[("n3", &n3), ("n4", &n4)]);
    let leases = pg.leases().unwrap();
    assert_eq!(leases.len(), RESIDENTS, "{leases:?}");
    for lease in &leases {
        assert!(
            now[&lease.owner].contains(&lease.name),
            "{} is leased to {} but runs elsewhere: {now:?}",
            lease.name,
            lease.owner
        );
    }
    // Each node names, for a resident it does not run, the node that does.
    let deadline = Instant::now() + Duration::from_secs(60);
    for (name, served, other) in [("n3", &n3, "n4"), ("n4", &n4, "n3")] {
        loop {
            let list = served.get("/api/programs/desk/residents?limit=1000").json["residents"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let elsewhere: Vec<&Value> =
                list.iter().filter(|r| r["state"] == "elsewhere").collect();
            let right = elsewhere.len() == now[other].len()
                && elsewhere
                    .iter()
                    .all(|r| r["node"] == other && now[other].iter().any(|n| r["name"] == *n));
            if right {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{name} does not say where its other residents run: {elsewhere:?} vs {now:?}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let fenced = n3.stderr().matches("was refused: its lease").count();
    eprintln!(
        "done after {:?}: {runs} tool runs, {finished} finished calls; n3's writes refused \
         after its pause: {fenced}",
        started.elapsed()
    );
}

fn is_reply(m: &Message) -> bool {
    m.role == Role::Assistant && m.tool_calls().next().is_none()
}

/// Whether every mail sent has a reply after it (counted loosely, to know when to look
/// closely).
fn all_answered(cells: &[(String, SavedResident)]) -> bool {
    let mut answered = HashSet::new();
    for (_, cell) in cells {
        let mut open = Vec::new();
        for m in &cell.messages {
            if m.role == Role::User
                && let Some(n) = m.text().strip_prefix("[mail from sender] mail ")
            {
                open.push(n.to_string());
            }
            if is_reply(m) {
                answered.extend(open.drain(..));
            }
        }
    }
    answered.len() >= MAILS
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(40)..].join("\n")
}

/// `--cluster` without a store every node shares is refused at once, naming what is missing.
#[test]
fn a_cluster_needs_a_shared_store() {
    let fake = FakeProvider::start();
    let sb = styled(&fake, "openai");
    let script = sb.write("desk.lua", PROGRAM);
    let run = sb.colony(&[
        "serve",
        "--cluster",
        "nats://127.0.0.1:4222",
        &script.display().to_string(),
    ]);
    assert_ne!(run.code, 0);
    assert!(
        run.stderr
            .contains("--cluster needs a store every node shares"),
        "{}",
        run.stderr
    );
    // Mistakes on the line are refused before anything starts, and a password in the
    // --cluster URL is never shown (it was, when the URL was not a NATS one).
    let script = script.display().to_string();
    for (args, says) in [
        (
            [
                "--cluster",
                "http://user:NatsPW77@127.0.0.1:4222",
                "--node",
                "a",
            ],
            "--cluster \"http://user:***@127.0.0.1:4222/\" is not a NATS server's URL",
        ),
        (
            ["--cluster", "nats://127.0.0.1:4222", "--node", ""],
            "--node \"\" is not a node name",
        ),
    ] {
        let mut all = vec!["serve", "--store", "postgres://colony@127.0.0.1:9/colony"];
        all.extend_from_slice(&args);
        all.push(&script);
        let run = sb.colony(&all);
        assert_eq!(run.code, 2, "{args:?}: {}", run.stderr);
        assert!(run.stderr.contains(says), "{args:?}: {}", run.stderr);
        assert!(!run.stderr.contains("NatsPW77"), "{}", run.stderr);
    }
    // A lease past ten minutes (a dead node's residents unserved, its name taken, that long),
    // and a store URL of another kind (found only as the program started, which then failed
    // while the process served on), likewise.
    for (args, says) in [
        (
            [
                "--store",
                "postgres://colony@127.0.0.1:9/colony",
                "--lease",
                "300d",
            ],
            "--lease \"300d\" is not a duration from 300ms to 10m",
        ),
        (
            [
                "--store",
                "mysql://colony:SecretPW9@127.0.0.1:9/colony",
                "--lease",
                "10s",
            ],
            "--store mysql://colony@127.0.0.1:9/colony is not a PostgreSQL URL",
        ),
    ] {
        let mut all = vec![
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--cluster",
            "nats://127.0.0.1:4222",
        ];
        all.extend_from_slice(&args);
        all.push(&script);
        // Taken, the service would serve on: bounded, so the test fails rather than hangs.
        let mut child = sb.spawn(&all);
        let status = support::exits_within_a_minute(&mut child, &format!("{args:?} was taken"));
        let mut stderr = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
        assert_eq!(status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(!stderr.contains("SecretPW9"), "{stderr}");
    }
}

/// A NATS server that cannot be reached: the program fails to start, saying which server and
/// why, and the service goes on (its API answers).
#[test]
fn an_unreachable_nats_server_fails_the_program_loudly() {
    let store_url = support::postgres::database();
    let fake = FakeProvider::start();
    let sb = styled(&fake, "openai");
    let script = sb.write("desk.lua", PROGRAM);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let nats = format!("nats://127.0.0.1:{port}");
    let served = Served::start(
        &sb,
        &[
            "--store",
            &store_url,
            "--cluster",
            &nats,
            &script.display().to_string(),
        ],
    );
    let p = program_in_state(&served, "desk", "failed");
    let error = p["error"].as_str().unwrap_or("");
    assert!(
        error.contains(&format!("cannot reach the NATS server at {nats}")),
        "{p}"
    );
    // Its start is tried again: mail is told when (it was a bare 503, which a client cannot
    // tell from a program that will never run).
    let sent = served.mail("desk", json!({ "to": "r01", "content": "hello" }));
    assert_eq!(sent.status, 503, "{}", sent.text);
    assert!(
        sent.text.contains("its start is tried again in"),
        "{}",
        sent.text
    );
    assert!(
        sent.headers.contains_key("retry-after"),
        "{:?}",
        sent.headers
    );
}

/// A file attached to mail sent through one node reaches the resident on another with its
/// bytes (they go through the shared store; only the reference crosses NATS); and one id sent
/// to two residents is two mails (an id names a mail to one resident).
#[test]
fn a_file_crosses_nodes_with_its_bytes() {
    let store_url = support::postgres::database();
    let nats = support::nats::server().url();
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("seen"));
    let sb = styled(&fake, "openai");
    let script = sb.write(
        "desk.lua",
        r#"
for i = 1, 12 do
  ai.spawn{ name = "f" .. i, provider = "openai", model = "m", persist_conversation = true,
    deliver_to = function() end }
end
ai.watch{}
"#,
    );
    let cluster = Cluster {
        sb: &sb,
        script: script.display().to_string(),
        store: store_url,
        nats,
    };
    let a = cluster.node("a");
    let b = cluster.node("b");
    let deadline = Instant::now() + Duration::from_secs(120);
    let on_b = loop {
        let here = local(&[("a", &a), ("b", &b)]);
        if here.values().map(Vec::len).sum::<usize>() == 12 && here["b"].len() >= 2 {
            break here["b"].clone();
        }
        assert!(Instant::now() < deadline, "never spread: {here:?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let (on_b, other) = (on_b[0].clone(), on_b[1].clone());
    for to in [&on_b, &other] {
        let sent = a.mail(
            "desk",
            json!({ "to": to, "content": format!("same id to {to}"), "id": "ticket-41" }),
        );
        assert_eq!(sent.status, 202, "{}", sent.text);
    }
    let sent = a.mail(
        "desk",
        json!({
            "to": on_b, "content": "look at this", "id": "with-a-file",
            "files": [{ "name": "note.txt", "content_type": "text/plain",
                        "data": "aGVsbG8gYWNyb3NzIG5vZGVz" }],
        }),
    );
    assert_eq!(sent.status, 202, "{}", sent.text);
    loop {
        let bodies: Vec<String> = fake.requests().iter().map(|r| r.body.to_string()).collect();
        let both = [&on_b, &other].iter().all(|to| {
            bodies
                .iter()
                .any(|b| b.contains(&format!("same id to {to}")))
        });
        if let Some(body) = bodies.iter().find(|b| b.contains("look at this"))
            && both
        {
            assert!(body.contains("hello across nodes"), "{body}");
            assert!(!body.contains("not available"), "{body}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the mail never reached {on_b} on b"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A NATS server that asks for a user and password, given in the `--cluster` URL as a user
/// writes it: the node logs in and mail crosses (the URL's credentials were not passed on, and
/// the server refused the node), and the password appears nowhere in its log, even with the
/// NATS client's own debug logging on (it printed the URL whole at each connection attempt).
#[test]
fn a_nats_server_with_a_password_is_logged_in_to_and_the_password_is_not_shown() {
    let store_url = support::postgres::database();
    let nats = support::nats::server_with_password().url();
    let password = support::nats::LOGIN.1;
    assert!(nats.contains(password), "{nats}");
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("seen"));
    let sb = styled(&fake, "openai").env("RUST_LOG", "warn,async_nats=trace");
    let script = sb.write("desk.lua", PROGRAM);
    let cluster = Cluster {
        sb: &sb,
        script: script.display().to_string(),
        store: store_url,
        nats,
    };
    let a = cluster.node("a");
    let b = cluster.node("b");
    program_in_state(&a, "desk", "running");
    program_in_state(&b, "desk", "running");
    let spread = wait_spread(&[("a", &a), ("b", &b)]);
    let on_b = spread["b"][0].clone();
    let sent = a.mail("desk", json!({ "to": on_b, "content": "across a login" }));
    assert_eq!(sent.status, 202, "{}", sent.text);
    support::serve::eventually("the mail never reached b", || {
        fake.requests()
            .iter()
            .any(|r| r.body.to_string().contains("across a login"))
    });
    for (name, node) in [("a", &a), ("b", &b)] {
        let log = node.stderr();
        assert!(
            log.contains("async_nats"),
            "{name} logged nothing of NATS: {log}"
        );
        assert!(
            !log.contains(password),
            "{name} showed the password:\n{}",
            tail(&log)
        );
    }
}

/// A second node started with a name a running node has is refused, saying so (the two took
/// each other's leases for their own, in turn, restarting the residents each time), and the
/// first runs on with every resident. Its program is started again later, by itself (as one
/// whose store or NATS server could not be reached is): once the first node has stopped, the
/// second runs in its place.
#[test]
fn a_second_node_with_a_running_nodes_name_is_refused() {
    let store_url = support::postgres::database();
    let nats = support::nats::server().url();
    let fake = FakeProvider::start();
    let sb = styled(&fake, "openai");
    // A program of its own: the tests of this file share one NATS server, whose streams and
    // consumers are named after the program and its residents.
    let script = sb.write("names.lua", PROGRAM);
    let cluster = Cluster {
        sb: &sb,
        script: script.display().to_string(),
        store: store_url,
        nats,
    };
    let mut first = cluster.node("a");
    wait_spread_in("names", &[("a", &first)]);
    let second = cluster.node("a");
    let p = program_in_state(&second, "names", "failed");
    let error = p["error"].as_str().unwrap_or("");
    assert!(
        error.contains("another node named \"a\" is running")
            && error.contains("give each node its own --node"),
        "{p}"
    );
    assert_eq!(local_in("names", &[("a", &first)])["a"].len(), RESIDENTS);
    first.signal("TERM");
    assert_eq!(first.wait(), Some(0));
    wait_spread_in("names", &[("a", &second)]);
    assert_eq!(second.get("/api/programs/names").json["state"], "running");
}

/// A resident only one node's program has (a file changed on one node, mid-deploy) is run by
/// that node once no other takes it, and its mail is served: it was placed by hashing over
/// every live node, the node it fell to did not have it, and mail to it was accepted
/// (`202`, durable) and never served.
#[test]
fn a_resident_only_one_node_has_runs_there() {
    let store_url = support::postgres::database();
    let nats = support::nats::server().url();
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("seen"));
    let sb = styled(&fake, "openai");
    let program = |n: usize| {
        format!(
            r#"
for i = 1, {n} do
  ai.spawn{{ name = "f" .. i, provider = "openai", model = "m", persist_conversation = true,
    deliver_to = function() end }}
end
ai.watch{{}}
"#
        )
    };
    // The same file name (the same schema) in two folders, as on two machines; a program of
    // its own (the tests of this file share one NATS server).
    let older = sb.path("older");
    let newer = sb.path("newer");
    std::fs::create_dir_all(&older).unwrap();
    std::fs::create_dir_all(&newer).unwrap();
    std::fs::write(older.join("deploy.lua"), program(3)).unwrap();
    std::fs::write(newer.join("deploy.lua"), program(12)).unwrap();
    let node = |name: &str, dir: &std::path::Path| {
        Cluster {
            sb: &sb,
            script: dir.join("deploy.lua").display().to_string(),
            store: store_url.clone(),
            nats: nats.clone(),
        }
        .node(name)
    };
    let a = node("a", &older);
    let b = node("b", &newer);
    // Hashing over a and b places about half of f4..f12 on a, which has none of them.
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let here = local_in("deploy", &[("a", &a), ("b", &b)]);
        let on_b: HashSet<&str> = here["b"].iter().map(String::as_str).collect();
        if (4..=12).all(|i| on_b.contains(format!("f{i}").as_str())) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "f4..f12 never all ran on b: {here:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    for i in 4..=12 {
        let sent = b.mail(
            "deploy",
            json!({ "to": format!("f{i}"), "content": "hello" }),
        );
        assert_eq!(sent.status, 202, "{}", sent.text);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let list = b.get("/api/programs/deploy/residents?limit=100").json;
        let served: u64 = list["residents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["name"].as_str().unwrap()[1..].parse::<u32>().unwrap() >= 4)
            .map(|r| r["served"].as_u64().unwrap_or(0))
            .sum();
        if served == 9 {
            break;
        }
        assert!(Instant::now() < deadline, "not served: {list}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Two clusters (two databases) on one NATS server, each with a program of the same name:
/// mail through one cluster is served by that cluster only. The mail streams were named after
/// the program alone, so the other cluster's nodes read a share of it (staging serving
/// production's mail) and the cluster it was sent to never saw it.
#[test]
fn two_clusters_on_one_nats_server_keep_their_mail_apart() {
    let nats = support::nats::server().url();
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("seen"));
    let sb = styled(&fake, "openai");
    let script = sb.write(
        "twin.lua",
        r#"
for i = 1, 6 do
  ai.spawn{ name = "t" .. i, provider = "openai", model = "m", persist_conversation = true,
    deliver_to = function() end }
end
ai.watch{}
"#,
    );
    let cluster = |store: String| Cluster {
        sb: &sb,
        script: script.display().to_string(),
        store,
        nats: nats.clone(),
    };
    let (ours, theirs) = (
        cluster(support::postgres::database()),
        cluster(support::postgres::database()),
    );
    let a1 = ours.node("a1");
    let a2 = ours.node("a2");
    let b1 = theirs.node("b1");
    let served = |node: &Served| -> u64 {
        let list = node.get("/api/programs/twin/residents?limit=100").json;
        list["residents"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["state"] != "elsewhere")
            .map(|r| r["served"].as_u64().unwrap_or(0))
            .sum()
    };
    // Every resident placed in ours, a2 running some; b1 runs all of its own.
    let deadline = Instant::now() + Duration::from_secs(120);
    let on_a2 = loop {
        let here = local_in("twin", &[("a1", &a1), ("a2", &a2)]);
        let theirs = local_in("twin", &[("b1", &b1)]);
        if here.values().map(Vec::len).sum::<usize>() == 6
            && !here["a2"].is_empty()
            && theirs["b1"].len() == 6
        {
            break here["a2"].clone();
        }
        assert!(
            Instant::now() < deadline,
            "never placed: {here:?} {theirs:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    // Through a1, to residents a2 runs: over NATS.
    for n in 0..12 {
        let to = &on_a2[n % on_a2.len()];
        let sent = a1.mail("twin", json!({ "to": to, "content": format!("m{n}") }));
        assert_eq!(sent.status, 202, "{}", sent.text);
    }
    let deadline = Instant::now() + Duration::from_secs(60);
    while served(&a2) < 12 {
        assert!(
            Instant::now() < deadline,
            "a2 served {} of 12, the other cluster's b1 {}",
            served(&a2),
            served(&b1)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(served(&b1), 0, "the other cluster served ours");
}

/// A node paused past its heartbeat, whose name another process took meanwhile, stops its
/// program when it wakes: it said it placed nothing, yet stayed ready, and took every resident
/// back from under the other once that one stopped.
#[test]
fn a_node_whose_name_was_taken_while_it_was_paused_stops_its_program() {
    let store_url = support::postgres::database();
    let nats = support::nats::server().url();
    let fake = FakeProvider::start();
    let sb = styled(&fake, "openai");
    let script = sb.write("paused.lua", PROGRAM);
    let cluster = Cluster {
        sb: &sb,
        script: script.display().to_string(),
        store: store_url,
        nats,
    };
    let paused = cluster.node("x");
    wait_spread_in("paused", &[("x", &paused)]);
    paused.signal("STOP");
    // The second takes the name once the paused one's heartbeat has expired (its start is
    // refused until then, and tried again).
    let second = cluster.node("x");
    wait_spread_in("paused", &[("x", &second)]);
    paused.signal("CONT");
    let p = program_in_state(&paused, "paused", "stopped");
    assert!(
        p["stop_reason"]
            .as_str()
            .is_some_and(|r| r.contains("another process joined as node \"x\"")),
        "{p}"
    );
    assert_eq!(local_in("paused", &[("x", &second)])["x"].len(), RESIDENTS);
}

/// A node stopped with SIGTERM mid-turn keeps its resident's lease until the turn ends within
/// the grace, so the turn runs once: the node stopped renewing its leases with the stop,
/// another node took the resident over after the lease (2 s here) and asked the model again,
/// and the first node's result was refused. On the way: a node asked for the conversation of a
/// resident another runs names that node, and `colony conversations clear` refuses one a node
/// runs.
#[test]
fn a_node_stopped_mid_turn_keeps_its_lease_until_the_turn_ends() {
    let store_url = support::postgres::database();
    let nats = support::nats::server().url();
    let fake = FakeProvider::start();
    // Longer than a lease, shorter than the grace.
    fake.set_default(Reply::text("done").delay(6_000));
    let sb = styled(&fake, "openai");
    let dir = sb.path("drain");
    std::fs::create_dir_all(&dir).unwrap();
    let script = dir.join("drain.lua");
    std::fs::write(
        &script,
        r#"ai.spawn{ name = "solo", provider = "openai", model = "m", persist_conversation = true,
  deliver_to = function() end }
ai.watch{ grace_ms = 20000 }
"#,
    )
    .unwrap();
    let cluster = Cluster {
        sb: &sb,
        script: script.display().to_string(),
        store: store_url.clone(),
        nats,
    };
    let a = cluster.node("a");
    let b = cluster.node("b");
    let deadline = Instant::now() + Duration::from_secs(120);
    let (mut owner, other) = loop {
        let here = local_in("drain", &[("a", &a), ("b", &b)]);
        if here["a"].len() == 1 {
            break (a, b);
        }
        if here["b"].len() == 1 {
            break (b, a);
        }
        assert!(Instant::now() < deadline, "solo never ran: {here:?}");
        std::thread::sleep(Duration::from_millis(200));
    };
    // Asked of the other node, its conversation names where it runs (it was the 404 of a
    // name nobody has).
    let owner_name = owner.get("/api/programs/drain/residents/solo").json["node"]
        .as_str()
        .unwrap()
        .to_string();
    let deadline = Instant::now() + Duration::from_secs(60);
    while other.get("/api/programs/drain/residents/solo").json["state"] != "elsewhere" {
        assert!(
            Instant::now() < deadline,
            "the other node never saw where solo runs"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let asked = other.get("/api/programs/drain/residents/solo/conversation");
    assert_eq!(asked.status, 409, "{}", asked.text);
    assert_eq!(asked.json["error"], "elsewhere");
    assert_eq!(
        asked.json["message"],
        format!("\"solo\" runs on node {owner_name:?}: ask that node")
    );
    let sent = owner.mail(
        "drain",
        json!({ "to": "solo", "content": "work", "id": "w1" }),
    );
    assert_eq!(sent.status, 202, "{}", sent.text);
    let deadline = Instant::now() + Duration::from_secs(60);
    while fake.requests().is_empty() {
        assert!(Instant::now() < deadline, "the turn never began");
        std::thread::sleep(Duration::from_millis(50));
    }
    owner.signal("TERM");
    assert_eq!(owner.wait(), Some(0), "{}", owner.stderr());
    // The other node runs it now, idle: the turn it finished is saved, nothing asked again.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = other.get("/api/programs/drain/residents/solo").json;
        if r["state"] == "idle" {
            break;
        }
        assert!(Instant::now() < deadline, "solo never came back: {r}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let pg = PostgresStore::open_in(&store_url, Some(&schema_for(&script))).unwrap();
    let cell = pg.load_cell("solo").unwrap().unwrap();
    let texts: Vec<String> = cell.messages.iter().map(Message::text).collect();
    assert_eq!(texts, ["[mail from api] work", "done"]);
    assert_eq!(
        fake.requests().len(),
        1,
        "the turn ran again on the other node"
    );
    // Its conversation is not cleared from under the node that runs it (which wrote it all
    // back at its next step after a "removed").
    let script = script.display().to_string();
    let run = sb.colony(&[
        "conversations",
        &script,
        "clear",
        "solo",
        "--store",
        &store_url,
    ]);
    assert_ne!(run.code, 0, "{}", run.stdout);
    assert!(
        run.stderr.contains("\"solo\" runs on node"),
        "{}",
        run.stderr
    );
    // Nor is its held mail dropped (that node would write it back too).
    let run = sb.colony(&[
        "conversations",
        &script,
        "drop",
        "solo",
        "1",
        "--store",
        &store_url,
    ]);
    assert_ne!(run.code, 0, "{}", run.stdout);
    assert!(
        run.stderr.contains("\"solo\" runs on node")
            && run
                .stderr
                .contains("which would write it back: stop the program on every node, first"),
        "{}",
        run.stderr
    );
    assert_eq!(pg.load_cell("solo").unwrap().unwrap().messages.len(), 2);
}

/// The NATS server goes away and comes back. While it is away, mail to a resident on another
/// node is refused at once, and is never served later: handed to the client, it was answered
/// 503 after the publish's patience and then sent from the client's buffer once the server
/// was back (a sender that tried again without an id had it served twice). When it comes back
/// without its data (a lost disk, a fresh server at the same address), the program's stream
/// is made again: mail between nodes was refused ("no stream found") until a program
/// restarted.
#[test]
fn mail_crosses_nodes_again_after_the_nats_server_comes_back_even_without_its_data() {
    let store_url = support::postgres::database();
    let mut nats = support::nats::Private::start();
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("seen"));
    let sb = styled(&fake, "openai");
    let script = sb.write(
        "desk.lua",
        r#"
for i = 1, 6 do
  ai.spawn{ name = "n" .. i, provider = "openai", model = "m", persist_conversation = true,
    deliver_to = function() end }
end
ai.watch{}
"#,
    );
    let cluster = Cluster {
        sb: &sb,
        script: script.display().to_string(),
        store: store_url,
        nats: nats.url(),
    };
    let a = cluster.node("a");
    let b = cluster.node("b");
    let deadline = Instant::now() + Duration::from_secs(120);
    let to = loop {
        let here = local(&[("a", &a), ("b", &b)]);
        if here.values().map(Vec::len).sum::<usize>() == 6 && !here["b"].is_empty() {
            break here["b"][0].clone();
        }
        assert!(Instant::now() < deadline, "never spread: {here:?}");
        std::thread::sleep(Duration::from_millis(100));
    };
    let seen = |text: &str| {
        fake.requests()
            .iter()
            .any(|r| r.body.to_string().contains(text))
    };
    // Sends `content` to `to` through a until it is accepted; then waits for b to serve it.
    let delivered = |content: &str| {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let sent = a.mail(
                "desk",
                json!({ "to": to, "source": "sender", "content": content, "id": content }),
            );
            if sent.status == 202 {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{content}: {} {}",
                sent.status,
                sent.text
            );
            std::thread::sleep(Duration::from_millis(200));
        }
        while !seen(content) {
            assert!(Instant::now() < deadline, "{content} was never served");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    delivered("before");
    for (round, fresh) in [(1, false), (2, true)] {
        nats.stop();
        support::serve::eventually("a never noticed the NATS server gone", || {
            a.stderr().matches("lost the NATS server").count() == round
        });
        let away = format!("while away {round}");
        let refused = a.mail(
            "desk",
            json!({ "to": to, "source": "sender", "content": away, "id": away }),
        );
        assert_eq!(refused.status, 503, "{}", refused.text);
        assert_eq!(refused.json["error"], "not_saved", "{}", refused.text);
        nats.start_again(fresh);
        delivered(&format!("back {round}"));
        assert!(
            !seen(&away),
            "a mail refused while the server was away was served"
        );
    }
}
