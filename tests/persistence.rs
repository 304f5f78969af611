//! Persisted residents across restarts of the program: the conversation carries on, accepted
//! mail that was not served is served after the restart, a step cut off mid-way reuses the
//! results that finished, and `ai.dismiss` clears the cell. Each run is a fresh `colony run`
//! process on the same `--state` directory.

mod support;

use serde_json::{Value, json};
use support::fake::{FakeProvider, Reply};
use support::styled;

fn texts(body: &Value) -> Vec<String> {
    body["messages"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|m| m["content"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

const PROGRAM: &str = r#"
local word = ...
ai.spawn{ name = "keeper", provider = "openai", model = "m", persist_conversation = true,
  deliver_to = function(reply, info)
    if info.kind == "reply" then print("reply: " .. reply) ; ai.stop("done") end
  end,
  sources = { function(self)
    if word ~= "none" then assert(ai.mail{ to = self, source = "t", content = word, hop = 0 }) end
  end } }
print(ai.watch{})
"#;

#[test]
fn a_persisted_conversation_carries_on_after_a_restart() {
    let fake = FakeProvider::start();
    fake.set_responder(|body, _| Reply::text(format!("heard {}", texts(body).len())));
    let sb = styled(&fake, "openai");
    let state = sb.path("state-dir");
    let state = state.display().to_string();
    let script = sb.write("keeper.lua", PROGRAM);
    let script = script.display().to_string();
    let run = sb.colony(&["run", "--state", &state, &script, "one"]).ok();
    assert_eq!(run.stdout, "reply: heard 1\ndone\n");
    let run = sb.colony(&["run", "--state", &state, &script, "two"]).ok();
    assert_eq!(run.stdout, "reply: heard 3\ndone\n");
    let calls = support::model_calls(&fake);
    assert_eq!(
        texts(&calls[1]),
        ["[mail from t] one", "heard 1", "[mail from t] two"]
    );
    // The inspection commands see it once the program has ended.
    let out = sb
        .colony(&[
            "conversations",
            &script,
            "--state",
            &state,
            "show",
            "keeper",
        ])
        .ok();
    assert!(out.stdout.contains("heard 3"), "{}", out.stdout);
    let out = sb.colony(&["audit", &script, "--state", &state]).ok();
    assert!(
        !out.stdout.contains("keeper"),
        "no tools ran: {}",
        out.stdout
    );
}

#[test]
fn mail_accepted_during_an_outage_is_served_after_a_restart() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let fake = FakeProvider::start();
    // Down for the first run, up for the second.
    let up = Arc::new(AtomicBool::new(false));
    let is_up = up.clone();
    fake.set_responder(move |_, _| {
        if is_up.load(Ordering::SeqCst) {
            Reply::text("served everything")
        } else {
            Reply::status(529).header("retry-after-ms", "5")
        }
    });
    let sb = styled(&fake, "openai");
    let state = sb.path("state-dir").display().to_string();
    let script = sb
        .write(
            "held.lua",
            r#"
local run = ...
ai.spawn{ name = "r", provider = "openai", model = "m", persist_conversation = true,
  deliver_to = function(text, info)
    print(info.kind)
    if info.kind == "outage" then ai.stop("down") end
    if info.kind == "reply" then print(text) ; ai.stop("up") end
  end,
  sources = { function(self)
    if run == "second" then return end
    for i = 1, 3 do assert(ai.mail{ to = self, source = "t", content = run .. " run " .. i, hop = 0 }) end
  end } }
print(ai.watch{})
"#,
        )
        .display()
        .to_string();
    let first = sb
        .colony(&["run", "--state", &state, &script, "first"])
        .ok();
    assert_eq!(first.stdout, "outage\ndown\n");
    up.store(true, Ordering::SeqCst);
    let second = sb
        .colony(&["run", "--state", &state, &script, "second"])
        .ok();
    assert_eq!(second.stdout, "reply\nserved everything\nup\n");
    let calls = support::model_calls(&fake);
    let last = texts(calls.last().unwrap());
    // The held mail was on disk: the second run served it without being told again.
    let expected: Vec<String> = ["first run 1", "first run 2", "first run 3"]
        .iter()
        .map(|t| format!("[mail from t] {t}"))
        .collect();
    assert_eq!(last, expected);
}

#[test]
fn a_step_cut_off_by_a_restart_reuses_finished_results() {
    cut_off_then_resumed(false);
}

/// The same, with the first model call after the resumed step failing once (an outage right
/// after the restart): the resumed results stay committed and no tool runs again.
#[test]
fn a_resumed_step_survives_an_outage_after_the_restart() {
    cut_off_then_resumed(true);
}

fn cut_off_then_resumed(blip: bool) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let fake = FakeProvider::start();
    let failed_once = Arc::new(AtomicBool::new(!blip));
    fake.set_responder(move |body, _| {
        let last = body["messages"].as_array().unwrap().last().unwrap().clone();
        if last["role"] == "tool" {
            if !failed_once.swap(true, Ordering::SeqCst) {
                return Reply::status(529).header("retry-after-ms", "5");
            }
            Reply::text("all done")
        } else {
            Reply::tool_calls(vec![
                ("quick", "quick", json!({})),
                ("slow", "slow", json!({})),
                ("again", "again", json!({})),
            ])
        }
    });
    let sb = styled(&fake, "openai");
    let state = sb.path("state-dir").display().to_string();
    // First run: `quick` finishes, `slow` and `again` are still running when the program stops
    // (the grace period is 0, so the turn is cut off as a kill would).
    let script = sb
        .write(
            "cut.lua",
            r#"
local run = ...
local function counted(name)
  return function()
    local n = store.update("runs/" .. name, function(old) return (old or 0) + 1 end)
    if run == "first" and name ~= "quick" then
      -- quick has run; give its result time to reach the journal before the stop.
      while store.get("runs/quick") == nil do ai.sleep(2) end
      ai.sleep(100)
      ai.stop("cut")
      ai.sleep(60000)
    end
    return name .. " run " .. n
  end
end
local tools = {
  ai.tool{ name = "quick", description = "q", parameters = {}, handler = counted("quick") },
  ai.tool{ name = "slow", description = "s", parameters = {}, handler = counted("slow") },
  ai.tool{ name = "again", description = "a", parameters = {}, handler = counted("again"), idempotent = true },
}
ai.spawn{ name = "r", provider = "openai", model = "m", persist_conversation = true, tools = tools,
  deliver_to = function(text, info) if info.kind == "reply" then print(text) ; ai.stop("done") end end,
  sources = { function(self)
    if run == "first" then ai.mail{ to = self, source = "t", content = "go", hop = 0 } end
  end } }
print(ai.watch{ grace_ms = 0 })
"#,
        )
        .display()
        .to_string();
    let first = sb
        .colony(&["run", "--state", &state, &script, "first"])
        .ok();
    assert_eq!(first.stdout, "cut\n");
    let second = sb
        .colony(&["run", "--state", &state, &script, "second"])
        .ok();
    assert_eq!(second.stdout, "all done\ndone\n");
    let calls = support::model_calls(&fake);
    let expected = if blip { 3 } else { 2 };
    assert_eq!(
        calls.len(),
        expected,
        "the step was resumed, not inferred again"
    );
    let results: Vec<(String, String)> = calls[calls.len() - 1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| {
            (
                m["tool_call_id"].as_str().unwrap().to_string(),
                m["content"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    assert_eq!(results.len(), 3, "{results:?}");
    assert_eq!(
        results[0],
        ("quick".into(), "quick run 1".into()),
        "reused from the journal"
    );
    assert_eq!(results[1].0, "slow");
    assert!(
        results[1].1.contains("interrupted by a restart"),
        "{:?}",
        results[1]
    );
    assert_eq!(
        results[2],
        ("again".into(), "again run 2".into()),
        "idempotent: run again"
    );
    let store = sb
        .colony(&["store", &script, "--state", &state, "list", "runs/"])
        .ok();
    assert_eq!(store.stdout, "runs/again\nruns/quick\nruns/slow\n");
    let quick = sb
        .colony(&["store", &script, "--state", &state, "get", "runs/quick"])
        .ok();
    assert_eq!(quick.stdout.trim(), "1", "quick never ran twice");
    for (tool, runs) in [("slow", "1"), ("again", "2")] {
        let got = sb
            .colony(&[
                "store",
                &script,
                "--state",
                &state,
                "get",
                &format!("runs/{tool}"),
            ])
            .ok();
        assert_eq!(got.stdout.trim(), runs, "{tool}");
    }
    // The audit log: quick ok once (first run), slow interrupted once and again ok once (second
    // run); nothing else.
    let audit = sb.colony(&["audit", &script, "--state", &state]).ok();
    let mut rows: Vec<String> = audit
        .stdout
        .lines()
        .skip(1)
        .map(|l| {
            let tool = ["quick", "slow", "again"]
                .into_iter()
                .find(|t| l.split_whitespace().any(|w| w == *t))
                .unwrap_or("?");
            let outcome = ["ok", "interrupted", "error"]
                .into_iter()
                .find(|o| l.split_whitespace().any(|w| w == *o))
                .unwrap_or("?");
            format!("{tool} {outcome}")
        })
        .collect();
    rows.sort();
    assert_eq!(
        rows,
        ["again ok", "quick ok", "slow interrupted"],
        "{}",
        audit.stdout
    );
}

#[test]
fn dismiss_clears_the_cell_and_a_second_process_is_refused() {
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("ok"));
    let sb = styled(&fake, "openai");
    let state = sb.path("state-dir").display().to_string();
    let script = sb.write("keeper.lua", PROGRAM).display().to_string();
    sb.colony(&["run", "--state", &state, &script, "one"]).ok();
    let list = sb
        .colony(&["conversations", &script, "--state", &state, "list"])
        .ok();
    assert!(list.stdout.contains("keeper"), "{}", list.stdout);
    let dismiss = sb.write(
        "dismiss.lua",
        r#"
ai.spawn{ name = "keeper", provider = "openai", model = "m", persist_conversation = true }
ai.spawn{ name = "other", provider = "openai", model = "m", sources = { function()
  print(ai.residents()[1].conversation)
  print(ai.dismiss("keeper"))
  ai.stop("done")
end } }
ai.watch{}
"#,
    );
    let out = sb
        .colony(&["run", "--state", &state, &dismiss.display().to_string()])
        .ok();
    assert_eq!(out.stdout, "2\ttrue\n".replace('\t', "\n"));
    let list = sb
        .colony(&["conversations", &script, "--state", &state, "list"])
        .ok();
    assert!(!list.stdout.contains("keeper"), "{}", list.stdout);
    // A second process on the same directory is refused, naming the first.
    let holder = sb.write("hold.lua", "ai.sleep(3000)");
    let child = sb.spawn(&["run", "--state", &state, &holder.display().to_string()]);
    let lock = std::path::Path::new(&state).join("lock");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let text = std::fs::read_to_string(&lock).unwrap_or_default();
        if text.contains(&child.id().to_string()) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the first process never locked"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let second = sb
        .colony(&["run", "--state", &state, &script, "one"])
        .failed();
    assert!(
        second
            .stderr
            .contains(&format!("is in use by process {}", child.id())),
        "{}",
        second.stderr
    );
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
}

#[test]
fn an_open_breaker_stays_open_across_a_restart() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let fake = FakeProvider::start();
    let up = Arc::new(AtomicBool::new(false));
    let is_up = up.clone();
    fake.set_responder(move |_, _| {
        if is_up.load(Ordering::SeqCst) {
            Reply::text("fine")
        } else {
            Reply::status(529).header("retry-after-ms", "1")
        }
    });
    let sb = styled(&fake, "openai");
    let state = sb.path("state-dir").display().to_string();
    // The breaker opens after one failed step and its first probe fails too: the next probe is
    // a minute away. The second run must not call the provider before then.
    let script = sb
        .write(
            "breaker.lua",
            r#"
local run = ...
ai.route{ provider = "openai", model = "m", middleware = {
  ai.with_breaker{ threshold = 1, first_probe_ms = 60000, on_transition = function(from, to)
    print(from .. " -> " .. to)
    if to == "open" and from == "half_open" then ai.stop("open") end
  end } } }
ai.spawn{ name = "r", deliver_to = function(text, info)
    if info.kind == "outage" then print("outage: " .. (info.error:find("circuit open", 1, true) and "circuit open" or "provider")) end
    if info.kind == "outage" and run == "second" then ai.stop("refused") end
  end,
  sources = { function(self) ai.mail{ to = self, source = "t", content = "hi", hop = 0 } end } }
print(ai.watch{ grace_ms = 0 })
"#,
        )
        .display()
        .to_string();
    let first = sb
        .colony(&["run", "--state", &state, &script, "first"])
        .ok();
    assert_eq!(
        first.lines(),
        [
            "closed -> open",
            "outage: provider",
            "open -> half_open",
            "half_open -> open",
            "open"
        ]
    );
    let calls_before = fake.calls();
    up.store(true, Ordering::SeqCst);
    let second = sb
        .colony(&["run", "--state", &state, &script, "second"])
        .ok();
    assert_eq!(second.lines(), ["outage: circuit open", "refused"]);
    assert_eq!(
        fake.calls(),
        calls_before,
        "the open breaker refused without calling"
    );
}

#[test]
fn held_mail_of_a_resident_the_program_no_longer_spawns_is_named_at_the_start() {
    let fake = FakeProvider::start();
    fake.set_responder(|_, _| Reply::status(529).header("retry-after-ms", "5"));
    let sb = styled(&fake, "openai");
    let state = sb.path("state-dir").display().to_string();
    let script = sb
        .write(
            "renamed.lua",
            r#"
local name = ...
ai.spawn{ name = name, provider = "openai", model = "m", persist_conversation = true,
  deliver_to = function(text, info) if info.kind == "outage" then ai.stop("down") end end,
  sources = { function(self)
    if name ~= "a" then return end
    for i = 1, 2 do assert(ai.mail{ to = self, source = "t", content = "m" .. i, hop = 0 }) end
  end } }
print(ai.watch{})
"#,
        )
        .display()
        .to_string();
    let first = sb.colony(&["run", "--state", &state, &script, "a"]).ok();
    assert!(
        !first.stderr.contains("no resident of this run"),
        "{}",
        first.stderr
    );
    // The resident is renamed: its accepted mail would never be served, and nothing said so.
    let second = sb.colony(&["run", "--state", &state, &script, "b"]);
    assert!(
        second.stderr.contains(
            "a saved conversation \"a\" holds 2 accepted mail(s) that no resident of this run serves"
        ),
        "{}",
        second.stderr
    );
}

/// A script's own turns in flight together each leave their audit line: lines whose calls end
/// together are queued and written in one transaction by the first call to wait
/// (`store::audit_batch`), and none is left behind in the queue.
#[test]
fn a_script_s_turns_in_flight_together_each_leave_their_audit_line() {
    let fake = FakeProvider::start();
    fake.set_responder(|body, _| {
        let last = body["messages"].as_array().and_then(|m| m.last()).cloned();
        match last {
            Some(m) if m["role"] == "tool" => Reply::text("done"),
            _ => Reply::tool_call("c1", "add", serde_json::json!({"a": 2, "b": 3})),
        }
    });
    let sb = styled(&fake, "openai");
    let state = sb.path("state-dir").display().to_string();
    let script = sb.write(
        "many.lua",
        r#"
local add = ai.tool{ name = "add", description = "adds", parameters = {
  type = "object", properties = { a = { type = "integer" }, b = { type = "integer" } } },
  handler = function(args) return args.a + args.b end }
local done = 0
local function turn()
  local r = ai.run{ prompt = "2+3?", tools = { add }, provider = "openai", model = "m" }
  assert(not r.error, tostring(r.error))
  done = done + 1
end
local turns = {}
for i = 1, 30 do turns[i] = turn end
ai.parallel(table.unpack(turns))
print(done)
"#,
    );
    let script = script.display().to_string();
    let run = sb.colony(&["run", "--state", &state, &script]).ok();
    assert_eq!(run.stdout, "30\n");
    let audit = sb.colony(&["audit", &script, "--state", &state]).ok();
    let lines: Vec<&str> = audit.stdout.lines().skip(1).collect();
    assert_eq!(lines.len(), 30, "{}", audit.stdout);
    assert!(
        lines
            .iter()
            .all(|l| l.split_whitespace().any(|w| w == "script")
                && l.split_whitespace().any(|w| w == "add")
                && l.split_whitespace().any(|w| w == "ok")),
        "{}",
        audit.stdout
    );
}

/// A turn cut off mid-step and resumed by the next run serves the same mail, and its tools are
/// told where that mail came from: `ai.inbound_provenance()` answered nil after a restart (the
/// mail was no longer at hand), and the README's relaying tool (`p.ai`, `p.hop + 1`) raised,
/// its relay lost.
#[test]
fn a_resumed_turn_knows_where_its_mail_came_from() {
    let fake = FakeProvider::start();
    fake.set_responder(|body, _| {
        let last = body["messages"].as_array().unwrap().last().unwrap().clone();
        if last["role"] == "tool" {
            Reply::text("relayed")
        } else {
            Reply::tool_calls(vec![("c1", "relay", json!({}))])
        }
    });
    let sb = styled(&fake, "openai");
    let state = sb.path("state-dir").display().to_string();
    let script = sb
        .write(
            "relay.lua",
            r#"
local run = ...
local relay = ai.tool{ name = "relay", description = "r", parameters = {}, idempotent = true,
  handler = function()
    local p = ai.inbound_provenance()
    store.set("seen/" .. run, p and (p.origin .. " hop " .. p.hop .. " to " .. p.ai) or "nil")
    if run == "first" then ai.stop("cut") ai.sleep(60000) end
    return "relayed"
  end }
ai.spawn{ name = "r", provider = "openai", model = "m", persist_conversation = true,
  tools = { relay },
  deliver_to = function(text, info) if info.kind == "reply" then print(text) ; ai.stop("done") end end,
  sources = { function(self)
    if run == "first" then ai.mail{ to = self, source = "desk", content = "go", hop = 2 } end
  end } }
print(ai.watch{ grace_ms = 0 })
"#,
        )
        .display()
        .to_string();
    let first = sb
        .colony(&["run", "--state", &state, &script, "first"])
        .ok();
    assert_eq!(first.stdout, "cut\n");
    let second = sb
        .colony(&["run", "--state", &state, &script, "second"])
        .ok();
    assert_eq!(second.stdout, "relayed\ndone\n");
    for run in ["first", "second"] {
        let seen = sb
            .colony(&[
                "store",
                &script,
                "--state",
                &state,
                "get",
                &format!("seen/{run}"),
            ])
            .ok();
        assert_eq!(seen.stdout.trim(), "\"desk hop 2 to r\"", "{run}");
    }
}
