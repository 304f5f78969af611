//! The crash test (the durable store's promise): a program with two persisted residents serving
//! a stream of mail through a tool that writes to the store is killed with SIGKILL at 20 points
//! chosen by a fixed seed (during a tool call, while the model call after a tool result is in
//! flight, or after a short random wait) and started again each time against the fake provider.
//! After the last start drains everything:
//! - every mail acknowledged as posted was answered exactly once (it is in its resident's
//!   conversation once, and a final reply follows it);
//! - no tool call ran twice (each call counts its own runs in the store), and every call the
//!   conversation shows as finished ran exactly once;
//! - every persisted conversation is a valid transcript (each call has exactly one result);
//! - the audit log agrees with the run counts.
//!
//! It runs twice: with the state in SQLite (the state directory) and in PostgreSQL (`--store`).

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use colony::store::select::ProgramStore;
use serde_json::{Value, json};
use support::fake::{FakeProvider, Reply};
use support::styled;

const MAILS: usize = 24;
const KILLS: usize = 20;
const SEED: u64 = 0x5eed_c0de;

const PROGRAM: &str = r#"
local N, markers = tonumber(arg[1]), arg[2]
local work = ai.tool{ name = "work", description = "Does the work a mail asks for",
  parameters = { mail = "integer" },
  handler = function(args, ctx)
    fs.write(markers .. "/" .. ctx.call_id, "started")
    store.update("runs/" .. ctx.call_id, function(n) return (n or 0) + 1 end)
    ai.sleep(15)
    store.update("worked/" .. args.mail, function(n) return (n or 0) + 1 end)
    return "worked on mail " .. args.mail
  end }
local function feeder()
  local fed = store.get("fed") or 0
  for i = fed + 1, N do
    local to = (i % 2 == 1) and "a" or "b"
    assert(ai.mail{ to = to, source = "feeder", content = "mail " .. i, hop = 0, id = "m" .. i })
    store.set("acked/" .. string.format("%03d", i), true)
    store.set("fed", i)
    ai.sleep(10)
  end
  -- Drained: every mail worked on, nobody busy, nothing waiting.
  while true do
    local done = true
    for i = 1, N do if not store.get("worked/" .. i) then done = false end end
    for _, r in ipairs(ai.residents()) do
      if r.state ~= "idle" or r.held > 0 then done = false end
    end
    if done then ai.stop("drained") return end
    ai.sleep(10)
  end
end
for _, name in ipairs({ "a", "b" }) do
  ai.spawn{ name = name, provider = "openai", model = "m", persist_conversation = true,
    tools = { work }, sources = name == "a" and { feeder } or nil,
    deliver_to = function() end }
end
print(ai.watch{ grace_ms = 0 })
"#;

/// The mails a request's trailing user turns carry, and the calls still to answer.
fn respond(body: &Value) -> Reply {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let last = messages.last().cloned().unwrap_or(Value::Null);
    if last["role"] == "tool" {
        // The results of the last step: call `work` again for an interrupted one, else answer.
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
                let id = format!("{}r", call["id"].as_str()?);
                Some((id, "work".to_string(), args))
            })
            .collect();
        if !again.is_empty() {
            return Reply::tool_calls(again).delay(5);
        }
        return Reply::text("answered").delay(5);
    }
    let mut mails = Vec::new();
    for m in messages.iter().rev() {
        if m["role"] != "user" {
            break;
        }
        if let Some(n) = m["content"]
            .as_str()
            .and_then(|t| t.strip_prefix("[mail from feeder] mail "))
        {
            mails.push(n.parse::<u64>().unwrap());
        }
    }
    mails.reverse();
    if mails.is_empty() {
        return Reply::text("nothing to do");
    }
    let calls = mails
        .iter()
        .map(|n| (format!("w{n}"), "work".to_string(), json!({ "mail": n })))
        .collect();
    Reply::tool_calls(calls).delay(5)
}

/// A small deterministic generator (splitmix64).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

fn wait_until(what: &str, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    eprintln!("not reached before the kill: {what}");
    false
}

fn count_files(dir: &Path) -> usize {
    std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0)
}

#[test]
fn killed_twenty_times_nothing_is_lost_or_done_twice() {
    killed_twenty_times(None);
}

/// The same, the program's state in PostgreSQL (`--store URL`) instead of its state directory.
#[test]
fn killed_twenty_times_on_postgres_nothing_is_lost_or_done_twice() {
    killed_twenty_times(Some(support::postgres::database()));
}

fn killed_twenty_times(store_url: Option<String>) {
    let fake = FakeProvider::start();
    fake.set_responder(|body, _| respond(body));
    let sb = styled(&fake, "openai");
    let state = sb.path("state");
    let markers = sb.path("markers");
    std::fs::create_dir_all(&markers).unwrap();
    let script = sb.write("crash.lua", PROGRAM);
    let args = |state: &Path| {
        vec![
            "run".to_string(),
            "--state".into(),
            state.display().to_string(),
            script.display().to_string(),
            MAILS.to_string(),
            markers.display().to_string(),
        ]
    };
    let mut args = args(&state);
    if let Some(url) = &store_url {
        args.splice(1..1, ["--store".to_string(), url.clone()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let mut rng = Rng(SEED);
    let mut kinds = BTreeMap::new();
    for _ in 0..KILLS {
        let mut child = sb.spawn(&args);
        let kind = match rng.next() % 3 {
            0 => {
                let before = count_files(&markers);
                wait_until("a tool call", || count_files(&markers) > before);
                std::thread::sleep(Duration::from_millis(rng.next() % 12));
                "during a tool call"
            }
            1 => {
                let seen = |fake: &FakeProvider| {
                    fake.requests()
                        .iter()
                        .filter(|r| {
                            r.body["messages"]
                                .as_array()
                                .and_then(|m| m.last())
                                .is_some_and(|m| m["role"] == "tool")
                        })
                        .count()
                };
                let before = seen(&fake);
                wait_until("a model call after tool results", || seen(&fake) > before);
                "after a tool result, the next model call in flight"
            }
            _ => {
                std::thread::sleep(Duration::from_millis(20 + rng.next() % 150));
                "after a random wait"
            }
        };
        *kinds.entry(kind).or_insert(0) += 1;
        child.kill().expect("SIGKILL");
        child.wait().unwrap();
    }
    eprintln!("kill points: {kinds:?}");
    // The last start runs until everything is drained.
    let last = sb.colony(&args).ok();
    assert_eq!(last.stdout, "drained\n", "{}", last.stderr);

    let store = ProgramStore::open(&state, store_url.as_deref(), &script).expect("the store opens");
    let store = store.dyn_store();
    let acked: Vec<usize> = store
        .list("", "acked/")
        .unwrap()
        .iter()
        .map(|k| k["acked/".len()..].parse().unwrap())
        .collect();
    assert_eq!(acked, (1..=MAILS).collect::<Vec<_>>());
    let mut finished_results = 0usize;
    let mut answered = BTreeMap::new();
    for name in ["a", "b"] {
        let cell = store.load_cell(name).unwrap().expect("a saved cell");
        assert!(
            cell.backlog.is_empty() && cell.journal.is_empty(),
            "{name} drained"
        );
        finished_results +=
            support::transcript::check(name, "feeder", &cell.messages, &mut answered);
    }
    for n in &acked {
        assert_eq!(
            answered.get(n),
            Some(&1),
            "mail {n} answered exactly once: {answered:?}"
        );
    }
    // No call ran twice; each call the transcripts show as finished ran once.
    let mut runs_total = 0;
    for key in store.list("", "runs/").unwrap() {
        let n = store.get("", &key).unwrap().unwrap().as_u64().unwrap();
        assert_eq!(n, 1, "{key} ran {n} times");
        runs_total += 1;
    }
    assert!(runs_total >= finished_results);
    // The audit log agrees: one `ok` line per call that finished running, and every run that
    // was cut off shows as `interrupted` (or left no result at all).
    let audit = store.audit_log(&Default::default()).unwrap();
    let ok = audit.iter().filter(|e| e.outcome == "ok").count();
    let interrupted = audit.iter().filter(|e| e.outcome == "interrupted").count();
    assert!(
        ok >= finished_results,
        "ok {ok} < finished {finished_results}"
    );
    assert!(
        ok <= runs_total && runs_total <= ok + interrupted,
        "runs {runs_total}, ok {ok}, interrupted {interrupted}"
    );
}
