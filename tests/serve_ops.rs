//! `colony serve` as an operator runs it, through the binary against the fake provider: what
//! each program may reach (denied by default, granted per program in the config or by flags),
//! the breaker of a resident's model calls in the API, the events and the scrape, tool calls
//! told as they end (not at the turn's end), and SIGHUP starting the programs added to the
//! config and stopping those removed.

mod support;

use serde_json::{Value, json};
use support::fake::{FakeProvider, Reply};
use support::script::Sandbox;
use support::serve::Served;

const KEY: &str = "test-key-good-0123456789";

fn config(fake: &FakeProvider) -> String {
    format!(
        "[use.general]\nprovider = \"openai\"\nmodel = \"m\"\nkey = \"{KEY}\"\nbase_url = \"{}\"\n",
        fake.base_url("openai")
    )
}

fn wait_ready(served: &Served) {
    support::serve::eventually("the service never became ready", || {
        served.get("/readyz").status == 200
    });
}

/// The role and text of the last message of a model call.
fn last(body: &Value) -> (String, String) {
    let m = body["messages"]
        .as_array()
        .and_then(|m| m.last())
        .cloned()
        .unwrap_or_default();
    (
        m["role"].as_str().unwrap_or_default().to_string(),
        m["content"].as_str().unwrap_or_default().to_string(),
    )
}

/// A program whose one tool writes the file it is given as `arg[1]`.
const WRITER: &str = r#"
local target = arg[1]
local save = ai.tool{
  name = "save",
  description = "Saves a note",
  parameters = { text = "string" },
  handler = function(args)
    fs.write(target, args.text)
    return "saved"
  end,
}
ai.spawn{ name = "writer", tools = { save }, deliver_to = "host" }
ai.watch{}
"#;

/// Calls `save` for a mail, then answers with the tool's result as it read it.
fn save_then_say(fake: &FakeProvider) {
    fake.set_responder(|body, _| {
        let (role, text) = last(body);
        if role == "user" {
            Reply::tool_call("c1", "save", json!({ "text": "a note" }))
        } else {
            Reply::text(format!("tool said: {text}"))
        }
    });
}

#[test]
fn a_program_reaches_only_what_its_entry_in_the_config_allows() {
    let fake = FakeProvider::start();
    save_then_say(&fake);
    let sb = Sandbox::new();
    let file = sb.write("writer.lua", WRITER);
    let denied = sb.path("denied.txt");
    let allowed = sb.path("allowed.txt");
    sb.write(
        "config.toml",
        &format!(
            "{}\n[serve]\n[[serve.programs]]\nfile = \"{f}\"\nargs = [\"{d}\"]\nstate = \"one\"\n\
             [[serve.programs]]\nfile = \"{f}\"\nargs = [\"{a}\"]\nstate = \"two\"\nallow_write = [\"{a}\"]\n",
            config(&fake),
            f = file.display(),
            d = denied.display(),
            a = allowed.display(),
        ),
    );
    let served = Served::start(&sb, &[]);
    wait_ready(&served);
    let events = served.events(None);
    // The same file twice: the second is named `writer-2`.
    for program in ["writer", "writer-2"] {
        let m = served.mail(program, json!({ "to": "writer", "content": "note this" }));
        assert_eq!(m.status, 202, "{}", m.text);
        let (d, _) = events.until("a delivery", |e| {
            e.kind == "delivery" && e.data["program"] == program
        });
        let text = d.data["text"].as_str().unwrap_or_default().to_string();
        if program == "writer" {
            // Nothing granted: the tool's write is refused, naming the flag that grants it.
            assert!(
                text.contains(&format!(
                    "fs.write: writing {} needs --allow-write={}",
                    denied.display(),
                    denied.display()
                )),
                "{text}"
            );
        } else {
            assert_eq!(text, "tool said: saved");
        }
    }
    assert!(!denied.exists());
    assert_eq!(std::fs::read_to_string(&allowed).unwrap(), "a note");
}

#[test]
fn the_files_given_reach_what_the_flags_allow_and_nothing_without_them() {
    let fake = FakeProvider::start();
    save_then_say(&fake);
    let sb = Sandbox::new();
    // Relative to the script's folder, as `fs` reads it.
    let file = sb.write("writer.lua", &WRITER.replace("arg[1]", "\"out.txt\""));
    sb.write("config.toml", &config(&fake));
    let out = sb.path("out.txt");
    let flag = format!("--allow-write={}", out.display());
    for (flags, written) in [(vec![], false), (vec![flag.as_str()], true)] {
        let mut args = flags.clone();
        let file = file.display().to_string();
        args.push(&file);
        let mut served = Served::start(&sb, &args);
        wait_ready(&served);
        let events = served.events(None);
        assert_eq!(
            served
                .mail("writer", json!({ "to": "writer", "content": "note" }))
                .status,
            202
        );
        let d = events.next_of("delivery", "writer");
        let text = d.data["text"].as_str().unwrap_or_default();
        if written {
            assert_eq!(text, "tool said: saved");
        } else {
            assert!(text.contains("needs --allow-write="), "{text}");
        }
        assert_eq!(out.exists(), written, "{flags:?}");
        served.signal("TERM");
        assert_eq!(served.wait(), Some(0), "{}", served.stderr());
    }
}

/// A resident behind the route's breaker, which opens on the first failed step and waits a
/// minute before its second probe.
const GUARDED: &str = r#"
ai.route{ middleware = { ai.with_breaker{ threshold = 1, first_probe_ms = 60000 } } }
ai.spawn{ name = "guarded", deliver_to = "host" }
ai.spawn{ name = "other", deliver_to = "host" }
ai.watch{}
"#;

#[test]
fn a_breaker_shows_in_the_api_the_events_and_the_scrape_and_a_dismissed_resident_leaves_it() {
    let fake = FakeProvider::start();
    fake.set_default(Reply::status(503));
    let sb = Sandbox::new();
    let file = sb.write("guarded.lua", GUARDED);
    sb.write("config.toml", &config(&fake));
    let served = Served::start(&sb, &[&file.display().to_string()]);
    wait_ready(&served);
    let view = served.get("/api/programs/guarded/residents/guarded").json;
    assert_eq!(view["breaker"], Value::Null, "{view}");
    let events = served.events(None);
    assert_eq!(
        served
            .mail("guarded", json!({ "to": "guarded", "content": "hello" }))
            .status,
        202
    );
    // Closed → open on the failed step; the first probe goes at once and fails: open again,
    // for a minute.
    let (reopened, passed) = events.until("the breaker reopening", |e| {
        e.kind == "breaker" && e.data["from"] == "half_open" && e.data["to"] == "open"
    });
    let seen: Vec<(Value, Value)> = passed
        .iter()
        .filter(|e| e.kind == "breaker")
        .map(|e| (e.data["from"].clone(), e.data["to"].clone()))
        .collect();
    assert_eq!(
        seen,
        [
            (json!("closed"), json!("open")),
            (json!("open"), json!("half_open"))
        ],
        "{seen:?}"
    );
    assert_eq!(reopened.data["owner"], "route");
    assert_eq!(reopened.data["program"], "guarded");
    assert_eq!(reopened.data["breaker"]["failures"], 2);
    assert!(
        reopened.data["breaker"]["last_error"]
            .as_str()
            .is_some_and(|e| e.contains("503")),
        "{}",
        reopened.data
    );
    let probe_at = reopened.data["breaker"]["next_probe_ms"]
        .as_u64()
        .expect("when the next probe goes");
    // Both residents share the route's breaker: the API shows it on each.
    for name in ["guarded", "other"] {
        let view = served.get(&format!("/api/programs/guarded/residents/{name}"));
        assert_eq!(view.status, 200);
        let b = &view.json["breaker"];
        assert_eq!(b["status"], "open", "{}", view.json);
        assert_eq!(b["next_probe_ms"].as_u64(), Some(probe_at));
        assert!(
            b["next_probe_in_ms"]
                .as_u64()
                .is_some_and(|ms| ms <= 60_000),
            "{b}"
        );
    }
    let listed = served.get("/api/programs/guarded/residents").json;
    assert_eq!(listed["residents"][0]["breaker"]["status"], "open");

    let scrape = served.get("/metrics").text;
    let parsed = prometheus_parse::Scrape::parse(scrape.lines().map(|l| Ok(l.to_string())))
        .expect("the scrape parses");
    let sample = |metric: &str, labels: &[(&str, &str)]| -> Option<f64> {
        parsed
            .samples
            .iter()
            .find(|s| s.metric == metric && labels.iter().all(|(k, v)| s.labels.get(k) == Some(*v)))
            .map(|s| match &s.value {
                prometheus_parse::Value::Gauge(v)
                | prometheus_parse::Value::Counter(v)
                | prometheus_parse::Value::Untyped(v) => *v,
                other => panic!("{metric}: {other:?}"),
            })
    };
    let guarded = [("program", "guarded"), ("resident", "guarded")];
    let state = |s: &'static str| {
        let mut l = guarded.to_vec();
        l.push(("state", s));
        sample("colony_breaker_state", &l)
    };
    assert_eq!(
        (state("open"), state("closed"), state("half_open")),
        (Some(1.0), Some(0.0), Some(0.0)),
        "{scrape}"
    );
    assert_eq!(
        sample("colony_breaker_next_probe_timestamp_seconds", &guarded),
        Some(probe_at as f64 / 1000.0)
    );
    // Two model steps left (the failed one and the probe), each timed.
    assert_eq!(
        sample(
            "colony_model_calls_total",
            &[("resident", "guarded"), ("outcome", "error")]
        ),
        Some(2.0),
        "{scrape}"
    );
    assert_eq!(
        sample("colony_model_call_seconds_count", &guarded),
        Some(2.0),
        "{scrape}"
    );

    // Dismissed: its series leave the scrape.
    let dismissed = served.post("/api/programs/guarded/residents/guarded/dismiss", json!({}));
    assert_eq!(dismissed.status, 200, "{}", dismissed.text);
    events.next_of("gone", "guarded");
    let scrape = served.get("/metrics").text;
    assert!(
        !scrape.contains("resident=\"guarded\""),
        "the dismissed resident is still labelled:\n{scrape}"
    );
    assert!(scrape.contains("resident=\"other\""), "{scrape}");
}

/// A resident whose model notes first (a quick tool), then waits at a gate (a tool that ends
/// once the gate file exists), then answers.
const GATED: &str = r#"
local gate = arg[1] or "gate"
local note = ai.tool{
  name = "note", description = "Notes something", parameters = { text = "string" },
  handler = function() return "noted" end,
}
local wait = ai.tool{
  name = "wait", description = "Waits at the gate", parameters = {}, timeout = 120,
  handler = function()
    while not fs.exists(gate) do ai.sleep(20) end
    return "through"
  end,
}
ai.spawn{ name = "gated", tools = { note, wait }, deliver_to = "host" }
ai.watch{}
"#;

#[test]
fn a_tool_call_is_an_event_as_it_ends_while_its_turn_goes_on() {
    let fake = FakeProvider::start();
    fake.set_responder(|body, _| match last(body) {
        (role, _) if role == "user" => Reply::tool_call("c1", "note", json!({ "text": "x" })),
        (_, text) if text == "noted" => Reply::tool_call("c2", "wait", json!({})),
        _ => Reply::text("done"),
    });
    let sb = Sandbox::new();
    let file = sb.write("gated.lua", GATED);
    sb.write("config.toml", &config(&fake));
    let gate = sb.path("gate");
    let allow = format!("--allow-read={}", sb.path("").display());
    let served = Served::start(&sb, &[&allow, &file.display().to_string()]);
    wait_ready(&served);
    let events = served.events(None);
    assert_eq!(
        served
            .mail("gated", json!({ "to": "gated", "content": "go" }))
            .status,
        202
    );
    let (noted, passed) = events.until("the note's call", |e| {
        e.kind == "tool_call" && e.data["tool"] == "note"
    });
    assert_eq!(
        (noted.data["kind"].as_str(), noted.data["call_id"].as_str()),
        (Some("ok"), Some("c1"))
    );
    // The gate is shut, so the turn cannot have ended: the event came while it went on.
    assert!(!gate.exists());
    assert!(passed.iter().all(|e| e.kind != "turn_ended"), "{passed:?}");
    assert_eq!(
        served.get("/api/programs/gated/residents/gated").json["state"],
        "busy"
    );
    std::fs::write(&gate, "").unwrap();
    let (waited, passed) = events.until("the wait's call", |e| {
        e.kind == "tool_call" && e.data["tool"] == "wait"
    });
    assert_eq!(waited.data["kind"], "ok");
    assert!(passed.iter().all(|e| e.kind != "turn_ended"), "{passed:?}");
    let (ended, _) = events.until("the turn's end", |e| e.kind == "turn_ended");
    assert_eq!(ended.data["steps"], 3);
}

/// A program of one resident named for its file.
fn desk(name: &str) -> String {
    format!("ai.spawn{{ name = \"{name}\", deliver_to = \"host\" }}\nai.watch{{}}\n")
}

fn programs_config(fake: &FakeProvider, files: &[&std::path::Path]) -> String {
    let mut text = format!("{}\n[serve]\n", config(fake));
    for f in files {
        text.push_str(&format!("[[serve.programs]]\nfile = \"{}\"\n", f.display()));
    }
    text
}

/// `[serve] listen` changed and SIGHUP sent: the listener cannot move, and the log says so (the
/// edit seemed taken, and went unapplied without a word); the service serves on where it was.
#[test]
fn sighup_says_a_changed_listen_address_waits_for_a_restart() {
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("ok"));
    let sb = Sandbox::new();
    let a = sb.write("alpha.lua", &desk("alpha"));
    let at = |listen: &str| {
        programs_config(&fake, &[&a])
            .replace("[serve]\n", &format!("[serve]\nlisten = \"{listen}\"\n"))
    };
    sb.write("config.toml", &at("127.0.0.1:0"));
    let mut served = Served::start_exact(&sb, &["serve"]);
    wait_ready(&served);
    let events = served.events(None);
    sb.write("config.toml", &at("127.0.0.1:7999"));
    served.signal("HUP");
    events.until("reloaded", |e| e.kind == "reloaded");
    let said = "[serve] listen is now 127.0.0.1:7999: the service still listens on 127.0.0.1:";
    support::serve::eventually("the changed listen was not said", || {
        served.stderr().contains(said)
    });
    assert_eq!(served.get("/healthz").status, 200);
    served.signal("TERM");
    assert_eq!(served.wait(), Some(0), "{}", served.stderr());
}

/// SIGHUP starts again a program that failed, whatever made it fail (here a file it reads,
/// missing, then put back): only a program whose own file changed was tried again, so one that
/// failed on something outside its file stayed failed until `/restart`.
#[test]
fn sighup_starts_a_failed_program_again() {
    let fake = FakeProvider::start();
    fake.set_responder(|body, _| Reply::text(format!("re: {}", last(body).1)));
    let sb = Sandbox::new();
    let a = sb.write(
        "alpha.lua",
        &format!("assert(fs.read(\"greeting.txt\"))\n{}", desk("alpha")),
    );
    let config = programs_config(&fake, &[&a]) + "allow_read = [\"greeting.txt\"]\n";
    sb.write("config.toml", &config);
    let served = Served::start(&sb, &[]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while served.get("/api/programs/alpha").json["state"] != "failed" {
        assert!(std::time::Instant::now() < deadline, "alpha never failed");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let events = served.events(None);
    sb.write("greeting.txt", "hello");
    served.signal("HUP");
    let (restarted, seen) = events.until("alpha started again", |e| {
        e.kind == "program_restarted" || e.kind == "program_failed"
    });
    assert_eq!(
        restarted.kind, "program_restarted",
        "{restarted:?} after {seen:?}"
    );
    wait_ready(&served);
    assert_eq!(served.get("/api/programs/alpha").json["state"], "running");
}

/// SIGHUP restarts a program whose file changed, and the new run serves. The reload used to hold
/// the old run while it restarted it, so the new run found the state directory "in use by
/// process N" (the service itself) and the program was left failed.
#[test]
fn sighup_restarts_a_program_whose_file_changed() {
    let fake = FakeProvider::start();
    fake.set_responder(|body, _| Reply::text(format!("re: {}", last(body).1)));
    let sb = Sandbox::new();
    let a = sb.write("alpha.lua", &desk("alpha"));
    sb.write("config.toml", &programs_config(&fake, &[&a]));
    let mut served = Served::start(&sb, &[]);
    wait_ready(&served);
    let events = served.events(None);
    sb.write(
        "alpha.lua",
        &format!("-- the second version\n{}", desk("alpha")),
    );
    served.signal("HUP");
    let (restarted, seen) = events.until("alpha restarted", |e| {
        e.kind == "program_restarted" || e.kind == "program_failed"
    });
    assert_eq!(
        restarted.kind, "program_restarted",
        "{restarted:?} after {seen:?}"
    );
    wait_ready(&served);
    let view = served.get("/api/programs/alpha").json;
    assert_eq!(view["state"], "running", "{view}");
    assert_eq!(
        served
            .mail("alpha", json!({ "to": "alpha", "content": "after" }))
            .status,
        202
    );
    let reply = events.next_of("delivery", "alpha");
    assert_eq!(reply.data["text"], "re: [mail from api] after");
    // Saved with a mistake: the run that works goes on, and says why it was kept.
    sb.write(
        "alpha.lua",
        &format!(
            "{}
ai.spawn{{ name = ",
            desk("alpha")
        ),
    );
    served.signal("HUP");
    let (kept, seen) = events.until("alpha kept", |e| {
        matches!(
            e.kind.as_str(),
            "program_kept" | "program_restarted" | "program_failed"
        )
    });
    assert_eq!(kept.kind, "program_kept", "{kept:?} after {seen:?}");
    assert!(
        kept.data["error"]
            .as_str()
            .is_some_and(|e| e.contains("alpha.lua:4: unexpected symbol")),
        "{kept:?}"
    );
    // The API shows it too, beside the run that goes on: it showed running and no error, and
    // who missed the event could not tell the file on disk was broken.
    let view = served.get("/api/programs/alpha").json;
    assert_eq!(view["state"], "running", "{view}");
    assert!(
        view["file_error"]
            .as_str()
            .is_some_and(|e| e.contains("alpha.lua:4: unexpected symbol")),
        "{view}"
    );
    assert_eq!(
        served
            .mail("alpha", json!({ "to": "alpha", "content": "still" }))
            .status,
        202
    );
    let reply = events.next_of("delivery", "alpha");
    assert_eq!(reply.data["text"], "re: [mail from api] still");
    // A restart through the API keeps it too: it answers why, and the run goes on.
    let refused = served.post("/api/programs/alpha/restart", json!({}));
    assert_eq!(refused.status, 422, "{}", refused.text);
    assert_eq!(refused.json["error"], "does_not_load", "{}", refused.text);
    assert!(
        refused.text.contains("alpha.lua:4: unexpected symbol"),
        "{}",
        refused.text
    );
    assert_eq!(served.get("/api/programs/alpha").json["state"], "running");
    assert_eq!(
        served
            .mail("alpha", json!({ "to": "alpha", "content": "kept" }))
            .status,
        202
    );
    let reply = events.next_of("delivery", "alpha");
    assert_eq!(reply.data["text"], "re: [mail from api] kept");
    // Stopped, its restart is its start, which fails: not a 200 (`curl -f` took it for done).
    assert_eq!(
        served.post("/api/programs/alpha/stop", json!({})).status,
        200
    );
    let failed = served.post("/api/programs/alpha/restart", json!({}));
    assert_eq!(failed.status, 500, "{}", failed.text);
    assert_eq!(failed.json["error"], "start_failed", "{}", failed.text);
    assert!(
        failed.text.contains("alpha.lua:4: unexpected symbol"),
        "{}",
        failed.text
    );
    assert_eq!(served.get("/api/programs/alpha").json["state"], "failed");
    served.signal("TERM");
    assert_eq!(served.wait(), Some(0), "{}", served.stderr());
}

#[test]
fn sighup_starts_the_programs_added_to_the_config_and_stops_those_removed() {
    let fake = FakeProvider::start();
    fake.set_responder(|body, _| Reply::text(format!("re: {}", last(body).1)));
    let sb = Sandbox::new();
    let a = sb.write("alpha.lua", &desk("alpha"));
    let b = sb.write("beta.lua", &desk("beta"));
    sb.write("config.toml", &programs_config(&fake, &[&a]));
    let mut served = Served::start(&sb, &[]);
    wait_ready(&served);
    let events = served.events(None);
    let names = |served: &Served| -> Vec<String> {
        served.get("/api/programs").json["programs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(names(&served), ["alpha"]);
    assert_eq!(
        served
            .mail("alpha", json!({ "to": "alpha", "content": "one" }))
            .status,
        202
    );
    events.next_of("delivery", "alpha");
    assert!(served.get("/metrics").text.contains("program=\"alpha\""));

    sb.write("config.toml", &programs_config(&fake, &[&b]));
    served.signal("HUP");
    events.until("alpha removed", |e| {
        e.kind == "program_removed" && e.data["program"] == "alpha"
    });
    events.until("beta added", |e| {
        e.kind == "program_added" && e.data["program"] == "beta"
    });
    assert_eq!(names(&served), ["beta"]);
    assert_eq!(served.get("/api/programs/alpha").status, 404);
    // The operator who sent the signal reads what it did (each step is logged below the
    // default level).
    let said = "colony serve: SIGHUP: reloaded: 1 program started (new in the config), \
                1 program stopped (removed from the config)";
    support::serve::eventually("the reload was not said", || served.stdout().contains(said));
    wait_ready(&served);
    assert_eq!(
        served
            .mail("beta", json!({ "to": "beta", "content": "two" }))
            .status,
        202
    );
    let reply = events.next_of("delivery", "beta");
    assert_eq!(reply.data["text"], "re: [mail from api] two");
    // The program that left took its series with it.
    let scrape = served.get("/metrics").text;
    assert!(!scrape.contains("program=\"alpha\""), "{scrape}");

    // A config that no longer reads keeps the programs as they are.
    sb.write(
        "config.toml",
        &format!(
            "{}[[serve.programs]]\nfile = \"{}\"\nallow_read = []\n",
            programs_config(&fake, &[&b]),
            a.display()
        ),
    );
    served.signal("HUP");
    events.until("reloaded", |e| e.kind == "reloaded");
    assert_eq!(names(&served), ["beta"]);
    // Logged before the event, but read from the pipe by another thread: it may come after.
    support::serve::eventually("the unreadable config was not said", || {
        served.stderr().contains("allow_read = [] allows nothing")
    });
    support::serve::eventually("the kept programs were not said", || {
        served
            .stdout()
            .contains("reloaded: the config's programs kept (it does not read, or lists none)")
    });

    // A config moved away, then one emptied: the programs and the settings they run with stay
    // (every program was stopped, and the service answered ready with none).
    let config_file = sb.path("config.toml");
    let kept = "reloaded: the config's programs kept";
    // A file that does not read says so on the SIGHUP's line: it said "nothing changed".
    let unread = "reloaded: the config file does not read: its settings and programs before it \
                  stay";
    // Then one that holds the settings and lists no programs, then one that does not parse.
    for step in 2..=5 {
        match step {
            2 => std::fs::rename(&config_file, sb.path("config.toml.new")).unwrap(),
            3 => std::fs::write(&config_file, "").unwrap(),
            4 => std::fs::write(&config_file, config(&fake)).unwrap(),
            _ => std::fs::write(&config_file, config(&fake) + "\n[[serve.programs\n").unwrap(),
        }
        served.signal("HUP");
        support::serve::eventually("the reload was not said", || {
            let (kept, unread) = (
                served.stdout().matches(kept).count(),
                served.stdout().matches(unread).count(),
            );
            match step {
                2 | 3 => (kept, unread) == (1, step - 1),
                4 => (kept, unread) == (2, 2),
                _ => (kept, unread) == (2, 3),
            }
        });
        assert_eq!(names(&served), ["beta"]);
        // Each step's own line: the count, since the earlier steps' lines are there too.
        let (said, times) = match step {
            4 => (
                "the config lists no programs ([[serve.programs]]): the programs stay",
                1,
            ),
            5 => ("the config file changed but cannot be used", 1),
            _ => (
                "config.toml is gone or empty: the settings read from it stay",
                step - 1,
            ),
        };
        support::serve::eventually("the step's line", || {
            served.stderr().matches(said).count() == times
        });
        assert_eq!(served.get("/readyz").status, 200);
        assert_eq!(
            served
                .mail(
                    "beta",
                    json!({ "to": "beta", "content": format!("after {step}") })
                )
                .status,
            202
        );
        let reply = events.next_of("delivery", "beta");
        assert_eq!(
            reply.data["text"],
            format!("re: [mail from api] after {step}")
        );
    }
    served.signal("TERM");
    assert_eq!(served.wait(), Some(0), "{}", served.stderr());
}

/// A config's program whose file is missing at start fails alone, shown as failed with why, as
/// when a reload adds it: it kept every other program from starting (status 2), which under
/// systemd's Restart=on-failure is a loop with nothing served. A file named on the command line
/// is still checked before anything starts.
#[test]
fn a_configs_program_whose_file_is_missing_fails_alone() {
    let fake = FakeProvider::start();
    let sb = Sandbox::new();
    let here = sb.write("here.lua", &desk("desk"));
    let gone = sb.path("gone.lua");
    sb.write("config.toml", &programs_config(&fake, &[&here, &gone]));
    let served = Served::start(&sb, &[]);
    support::serve::eventually("the missing program was never failed", || {
        served.get("/api/programs/gone").json["state"] == "failed"
    });
    let view = served.get("/api/programs/gone").json;
    let error = view["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("cannot read") && error.contains("gone.lua"),
        "{view}"
    );
    support::serve::eventually("the other program never ran", || {
        served.get("/api/programs/here").json["state"] == "running"
    });
    let mail = served.mail("here", json!({ "to": "desk", "content": "hi" }));
    assert_eq!(mail.status, 202, "{}", mail.text);

    let named = sb.colony(&["serve", &gone.display().to_string()]);
    assert_eq!(named.code, 2, "{}", named.stderr);
    assert!(named.stderr.contains("no such file"), "{}", named.stderr);
}

/// A program whose script runs on after its watch (here it sleeps forever) is ended by a stop
/// from the API once the watch's grace and `AFTER_STOP` have passed, and its end says why. The
/// stop used to wait for it forever, the program stayed "running" with no residents, and mail
/// to it was answered "stopping: try again in a moment" for good.
#[test]
fn a_stop_ends_a_program_whose_script_runs_on_after_its_watch() {
    let fake = FakeProvider::start();
    let sb = Sandbox::new();
    let p = sb.write(
        "linger.lua",
        "ai.spawn{ name = \"desk\", deliver_to = \"host\" }\n\
         print(\"the watch returned: \" .. ai.watch{})\n\
         while true do ai.sleep(1000) end\n",
    );
    sb.write("config.toml", &programs_config(&fake, &[&p]));
    let served = Served::start(&sb, &[]);
    wait_ready(&served);
    // Far longer than the grace and AFTER_STOP (20 s): without the end the request never
    // returns, and the test fails here instead of hanging.
    let stop = served
        .client()
        .post(format!("{}/api/programs/linger/stop", served.url));
    let stopped = served.send(stop.timeout(std::time::Duration::from_secs(120)));
    assert_eq!(stopped.status, 200, "{}", stopped.text);
    let view = served.get("/api/programs/linger").json;
    assert_eq!(view["state"], "failed", "{view}");
    let error = view["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("ended by its host after the stop (stopped through the API)")
            && error.contains("the script was still running 20 s after it"),
        "{view}"
    );
    let mail = served.mail("linger", json!({ "to": "desk", "content": "hello?" }));
    assert_eq!(mail.status, 503, "{}", mail.text);
    assert_eq!(mail.json["error"], "not_running", "{}", mail.text);
    assert!(
        served
            .stdout()
            .contains("the watch returned: stopped through the API"),
        "{}",
        served.stdout()
    );
    // A restart starts it afresh.
    let restarted = served.post("/api/programs/linger/restart", json!({}));
    assert_eq!(restarted.status, 200, "{}", restarted.text);
    support::serve::eventually("the program runs again", || {
        served.get("/api/programs/linger").json["state"] == "running"
    });
}

/// A program blocked outside Lua (here opening a FIFO nobody writes, before its watch) cannot
/// be ended where it waits: once the drain has had what a stop allows (the grace, `AFTER_STOP`
/// and a moment), the service ends the process, naming the program, instead of waiting for
/// ever (it did: SIGTERM, three Ctrl-C, nothing ended it). The other program was drained.
#[test]
fn a_drain_ends_the_process_when_a_program_is_blocked_outside_lua() {
    let fake = FakeProvider::start();
    let sb = Sandbox::new();
    let fifo = sb.path("nobody-writes");
    let made = std::ffi::CString::new(fifo.display().to_string()).unwrap();
    // Safety: a NUL-terminated path and a mode.
    assert_eq!(unsafe { libc::mkfifo(made.as_ptr(), 0o600) }, 0);
    let blocked = sb.write(
        "blocked.lua",
        &format!(
            "io.stderr:write('blocking\\n') local f = io.open({:?}) ai.watch{{}}",
            fifo.display().to_string()
        ),
    );
    let fine = sb.write("fine.lua", "ai.spawn{ name = \"desk\" } ai.watch{}");
    let config = programs_config(&fake, &[&blocked, &fine]).replacen(
        "[[serve.programs]]\n",
        "[[serve.programs]]\nallow_read = true\n",
        1,
    );
    sb.write("config.toml", &config);
    let mut served = Served::start(&sb, &[]);
    support::serve::eventually("the program blocks", || {
        served.stderr().contains("blocking")
    });
    served.signal("TERM");
    assert_eq!(served.wait(), Some(1), "{}", served.stderr());
    let stderr = served.stderr();
    assert!(
        stderr.contains(
            "colony serve: the drain outlasted its grace; still running: blocked (blocked \
             outside Lua?): ending the process"
        ),
        "{stderr}"
    );
}

/// A second signal during the drain ends every program now, where it waits: a program whose
/// main chunk spins before its watch is stopped at once rather than after the stop's 20 s, and
/// colony exits with the signal's status.
#[test]
fn a_second_signal_during_the_drain_ends_every_program_now() {
    let fake = FakeProvider::start();
    let sb = Sandbox::new();
    let spin = sb.write(
        "spin.lua",
        "io.stderr:write('spinning\\n') while true do end ai.watch{}",
    );
    sb.write("config.toml", &programs_config(&fake, &[&spin]));
    let mut served = Served::start(&sb, &[]);
    support::serve::eventually("the program spins", || served.stderr().contains("spinning"));
    served.signal("TERM");
    support::serve::eventually("the drain starts", || {
        served.stderr().contains("SIGTERM: draining")
    });
    served.signal("TERM");
    // Not a clean drain: the status of the signal (it was 0), and a word.
    assert_eq!(served.wait(), Some(143), "{}", served.stderr());
    let stderr = served.stderr();
    assert!(
        stderr.contains("SIGTERM again: ending every program now, where it waits"),
        "{stderr}"
    );
    assert!(
        stderr.contains("colony serve: the programs were ended at SIGTERM, where they waited"),
        "{stderr}"
    );
    assert!(!stderr.contains("still running 20 s after it"), "{stderr}");
}

/// Every turn the events say started has an end: a turn the program's restart cut short ended
/// with no `turn_ended`, and a client following the events saw it run for good.
#[test]
fn a_turn_cut_short_by_a_restart_ends_in_the_events() {
    let fake = FakeProvider::start();
    fake.push(Reply::text("too late").delay(60_000));
    let sb = Sandbox::new();
    let slow = sb.write(
        "slow.lua",
        "ai.spawn{ name = \"slow\", deliver_to = \"host\" }\nai.watch{ grace_ms = 100 }\n",
    );
    sb.write("config.toml", &programs_config(&fake, &[&slow]));
    let served = Served::start(&sb, &[]);
    wait_ready(&served);
    let events = served.events(None);
    assert_eq!(
        served
            .mail("slow", json!({ "to": "slow", "content": "hello" }))
            .status,
        202
    );
    events.until("the turn's start", |e| e.kind == "turn_started");
    assert_eq!(
        served.post("/api/programs/slow/restart", json!({})).status,
        200
    );
    let (ended, passed) = events.until("the cut turn's end", |e| e.kind == "turn_ended");
    assert_eq!(ended.data["resident"], "slow");
    assert_eq!(ended.data["stop"], "cut", "{:?}", ended.data);
    assert_eq!(ended.data["error"]["kind"], "cut");
    assert!(
        passed.iter().all(|e| e.kind != "program_restarted"),
        "the end comes before the run after it: {passed:?}"
    );
}

/// A turn a SIGTERM's drain cut short ends in the events too, before their stream closes: the
/// observer ended only once the run's route let go of it, and at a drain the stream closed
/// first (`program_stopped`, then nothing).
#[test]
fn a_turn_cut_short_by_a_drain_ends_in_the_events() {
    let fake = FakeProvider::start();
    fake.push(Reply::text("too late").delay(60_000));
    let sb = Sandbox::new();
    let slow = sb.write(
        "slow.lua",
        "ai.spawn{ name = \"slow\", deliver_to = \"host\", persist_conversation = true }\n\
         ai.watch{ grace_ms = 100 }\n",
    );
    sb.write("config.toml", &programs_config(&fake, &[&slow]));
    let mut served = Served::start(&sb, &[]);
    wait_ready(&served);
    let events = served.events(None);
    assert_eq!(
        served
            .mail("slow", json!({ "to": "slow", "content": "hello" }))
            .status,
        202
    );
    events.until("the turn's start", |e| e.kind == "turn_started");
    served.signal("TERM");
    let (ended, _) = events.until("the cut turn's end", |e| e.kind == "turn_ended");
    assert_eq!(ended.data["resident"], "slow");
    assert_eq!(ended.data["stop"], "cut", "{:?}", ended.data);
    assert_eq!(served.wait(), Some(0), "{}", served.stderr());
    // The drain's line names the program (with several, they read alike).
    let stderr = served.stderr();
    assert!(
        stderr.contains("[slow] SIGTERM: stopping; 1 turn(s) in flight get up to 0.1 s"),
        "{stderr}"
    );
}

/// Mail to a program whose start waits for its state directory (held by another process: a
/// run of the same file, the service before it still draining) is told that, as the start
/// says it: it read "its store or cluster could not be reached", which sent people looking at
/// a database they do not have.
#[test]
fn mail_to_a_program_waiting_for_its_state_directory_says_who_holds_it() {
    use std::io::BufRead;
    let fake = FakeProvider::start();
    let sb = Sandbox::new();
    sb.write("config.toml", &config(&fake));
    let file = sb.write(
        "desk.lua",
        &format!(
            "if arg[1] == 'hold' then print('holding') io.stdout:flush() ai.sleep(600000) end\n{}",
            desk("desk")
        ),
    );
    let file = file.display().to_string();
    let mut holder = sb.spawn(&["run", &file, "hold"]);
    let mut lines = std::io::BufReader::new(holder.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "holding");
    let mut served = Served::start(&sb, &[&file]);
    support::serve::eventually("the program to wait for its state directory", || {
        served.get("/api/programs/desk").json["state"] == "failed"
    });
    let refused = served.mail("desk", json!({ "to": "desk", "content": "hi" }));
    assert_eq!(refused.status, 503, "{}", refused.text);
    assert_eq!(refused.json["error"], "not_running", "{}", refused.text);
    let message = refused.json["message"].as_str().unwrap_or_default();
    assert!(
        message.contains(&format!("is in use by process {}", holder.id()))
            && message.contains("its start is tried again in"),
        "{message}"
    );
    let _ = holder.kill();
    let _ = holder.wait();
    support::serve::eventually("the program to start once the holder is gone", || {
        served
            .mail("desk", json!({ "to": "desk", "content": "hi" }))
            .status
            == 202
    });
    served.signal("TERM");
    assert_eq!(served.wait(), Some(0), "{}", served.stderr());
}

/// A program a SIGHUP adds whose start fails is said as failed, not as started: the line said
/// "1 program started" for a program that was not running.
#[test]
fn sighup_says_a_start_that_failed() {
    let fake = FakeProvider::start();
    let sb = Sandbox::new();
    let a = sb.write("alpha.lua", &desk("alpha"));
    sb.write("config.toml", &programs_config(&fake, &[&a]));
    let mut served = Served::start(&sb, &[]);
    wait_ready(&served);
    let gone = sb.path("gone.lua");
    sb.write("config.toml", &programs_config(&fake, &[&a, &gone]));
    served.signal("HUP");
    support::serve::eventually("the reload was not said", || {
        served.stdout().contains(
            "colony serve: SIGHUP: reloaded: 1 program failed to start (see /api/programs)",
        )
    });
    assert_eq!(served.get("/api/programs/gone").json["state"], "failed");
    served.signal("TERM");
    assert_eq!(served.wait(), Some(0), "{}", served.stderr());
}
