//! A resident that cannot succeed is blocked, and `colony run` ends instead of hanging: through
//! the binary, against the fake provider on loopback (or a cassette). Every run carries
//! `--max-time` only as a guard against hanging: the tests assert that it did not fire (exit
//! status 3 or 0, not 124), except the one about `--max-time` itself.

mod support;

use std::io::{BufRead, BufReader};
use std::sync::mpsc;
use std::time::Duration;

use support::fake::{FakeProvider, Reply};
use support::script::{Run, Sandbox};
use support::styled;

/// Longer than any of these runs needs; a run still going then is a hang.
const GUARD: &str = "120";

/// A resident that keeps its conversation, mailed once by a source that then ends. Its notices
/// and replies, `on_blocked` and `ai.residents()` are printed; then what the watch returned.
const ONE_MAIL: &str = r#"
ai.route{ model = "m" }
ai.spawn{ name = "worker", persist_conversation = true,
  deliver_to = function(reply, info)
    if info.kind == "blocked" then
      print(("notice: blocked, %s, status %s, transient %s, %d held"):format(info.error.kind, tostring(info.error.status), tostring(info.error.transient), info.held))
    else
      print(info.kind .. ": " .. reply)
    end
  end,
  sources = { function(self) assert(ai.mail{ to = self, source = "desk", content = "first", hop = 0 }) end } }
local reason = ai.watch{ on_blocked = function(name, err)
  print(("on_blocked: %s %s"):format(name, err.kind))
  for _, r in ipairs(ai.residents()) do
    print(("residents: %s %s %s, %d held"):format(r.name, r.state, r.error and r.error.kind or "-", r.held))
  end
end }
print("watch ended: " .. reason)
"#;

/// Runs `source` with `--state DIR --max-time GUARD` (and `extra`), in `sandbox`.
fn run(sandbox: &Sandbox, source: &str, extra: &[&str]) -> Run {
    let state = sandbox.path("state-dir").display().to_string();
    let mut args = vec!["--state", state.as_str(), "--max-time", GUARD];
    args.extend_from_slice(extra);
    sandbox.lua(source, &args)
}

/// The mail the resident was sent is still in its saved backlog.
fn assert_mail_kept(sandbox: &Sandbox) {
    let state = sandbox.path("state-dir").display().to_string();
    let script = sandbox.path("script.lua").display().to_string();
    let shown = sandbox
        .colony(&["conversations", "--state", &state, &script, "list"])
        .ok();
    assert_eq!(shown.stdout.trim(), "worker  0 messages, 1 in backlog");
    let shown = sandbox
        .colony(&[
            "conversations",
            "--state",
            &state,
            &script,
            "show",
            "worker",
        ])
        .ok();
    assert_eq!(
        shown.lines(),
        ["held mail, not yet served:", "  1. [mail from desk] first"]
    );
}

/// Asserts a blocked run: exit status 3, the notice, the hook and `ai.residents()` in that
/// order, the watch's reason, and stderr naming the resident and the error.
#[track_caller]
fn assert_blocked(run: &Run, kind: &str, status: &str, error: &str) {
    assert_eq!(
        run.code, 3,
        "stdout:\n{}\nstderr:\n{}",
        run.stdout, run.stderr
    );
    assert_eq!(
        run.lines(),
        [
            format!("notice: blocked, {kind}, status {status}, transient false, 1 held").as_str(),
            &format!("on_blocked: worker {kind}"),
            &format!("residents: worker blocked {kind}, 1 held"),
            &format!("watch ended: blocked: worker: {kind}: {error}"),
        ]
    );
    assert!(
        run.stderr
            .contains(&format!("\ncolony: blocked: worker: {kind}: {error}\n")),
        "stderr:\n{}",
        run.stderr
    );
}

#[test]
fn a_refused_key_blocks_the_resident_and_the_run_exits_3_with_its_mail_kept() {
    let fake = FakeProvider::start();
    fake.set_default(Reply::status(401));
    let sandbox = styled(&fake, "openai");
    let run = run(&sandbox, ONE_MAIL, &[]);
    // Whose key, and where: with use-types on several providers, which one was refused was
    // not said.
    let host = fake.base_url("openai");
    let host = host
        .trim_start_matches("http://")
        .split('/')
        .next()
        .unwrap();
    assert_blocked(
        &run,
        "auth_error",
        "401",
        &format!(
            "authentication failed (401): fake provider: scripted status 401 (invalid_api_key) \
             (the key sent to openai at {host})"
        ),
    );
    // Tried once: a refused key is not retried until something changes.
    assert_eq!(fake.calls(), 1);
    assert_mail_kept(&sandbox);
}

#[test]
fn a_refused_request_blocks_the_resident() {
    let fake = FakeProvider::start();
    fake.set_default(Reply::status(400));
    let sandbox = styled(&fake, "openai");
    let run = run(&sandbox, ONE_MAIL, &[]);
    assert_blocked(
        &run,
        "api_error",
        "400",
        "API error 400: fake provider: scripted status 400 (invalid_request_error)",
    );
    assert_eq!(fake.calls(), 1);
    assert_mail_kept(&sandbox);
}

/// Two mails, the first of which the model refuses (too large for it): sent by the first run,
/// held by every later one until it is dropped.
const TWO_MAILS: &str = r#"
ai.route{ model = "m" }
ai.spawn{ name = "worker", persist_conversation = true,
  deliver_to = function(reply, info) print(info.kind .. ": " .. tostring(reply)) end,
  sources = { function(self)
    if not store.get("sent") then
      store.set("sent", true)
      assert(ai.mail{ to = self, source = "desk", hop = 0, content = "HUGE scan" })
      assert(ai.mail{ to = self, source = "desk", hop = 0, content = "second" })
    end
  end } }
print("watch ended: " .. ai.watch{})
"#;

/// A held mail the provider refuses blocked its resident at every start, and the only way on
/// was to clear the whole conversation: `conversations drop` removes that mail, the blocked
/// run says how, and the next run serves the rest.
#[test]
fn a_held_mail_the_provider_refuses_can_be_dropped_and_the_rest_is_served() {
    let fake = FakeProvider::start();
    fake.set_responder(|body, _| {
        if body.to_string().contains("HUGE") {
            Reply::status(400)
        } else {
            Reply::text("served")
        }
    });
    let sandbox = styled(&fake, "openai");
    let state = sandbox.path("state-dir").display().to_string();
    let script = sandbox.path("script.lua").display().to_string();
    let first = run(&sandbox, TWO_MAILS, &[]);
    assert_eq!(first.code, 3, "{}{}", first.stdout, first.stderr);
    let conversations = format!("colony conversations --state {state} {script}");
    assert!(
        first.stderr.ends_with(&format!(
            "colony: if what the provider refuses is a held mail (too large, say), \
             `{conversations} show worker` numbers the held mail and `{conversations} drop \
             worker N` removes one.\n"
        )),
        "{}",
        first.stderr
    );
    // Held, and refused again at the next start.
    let again = run(&sandbox, TWO_MAILS, &[]);
    assert_eq!(again.code, 3, "{}{}", again.stdout, again.stderr);

    let conversations = |args: &[&str]| {
        let mut all = vec!["conversations", "--state", &state, &script];
        all.extend_from_slice(args);
        sandbox.colony(&all)
    };
    let shown = conversations(&["show", "worker"]).ok();
    assert_eq!(
        shown.lines(),
        [
            "held mail, not yet served:",
            "  1. [mail from desk] HUGE scan",
            "  2. [mail from desk] second"
        ]
    );
    // A number it does not hold is bad input, and nothing is dropped.
    let wrong = conversations(&["drop", "worker", "3"]);
    assert_eq!(wrong.code, 2, "{}", wrong.stderr);
    assert_eq!(
        wrong.stderr,
        "colony conversations: \"worker\" holds 2 mails: there is no mail 3 (`show worker` \
         numbers them)\n"
    );
    let dropped = conversations(&["drop", "worker", "1"]).ok();
    assert_eq!(
        dropped.stdout,
        "dropped held mail 1 of worker: [mail from desk] HUGE scan\n"
    );
    let shown = conversations(&["show", "worker"]).ok();
    assert_eq!(
        shown.lines(),
        ["held mail, not yet served:", "  1. [mail from desk] second"]
    );

    let served = run(&sandbox, TWO_MAILS, &[]);
    assert_eq!(served.code, 0, "{}{}", served.stdout, served.stderr);
    assert_eq!(served.lines(), ["reply: served", "watch ended: idle"]);
    let last = support::model_calls(&fake).pop().unwrap().to_string();
    assert!(last.contains("second") && !last.contains("HUGE"), "{last}");
}

/// A resident that keeps no conversation has no held mail to drop: its blocked run does not
/// send the user to `colony conversations`, which would answer that it has none.
#[test]
fn a_refused_request_of_a_resident_without_a_conversation_points_nowhere() {
    let fake = FakeProvider::start();
    fake.set_default(Reply::status(400));
    let sandbox = styled(&fake, "openai");
    let run = run(
        &sandbox,
        &ONE_MAIL.replace("persist_conversation = true,", ""),
        &[],
    );
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert!(
        !run.stderr.contains("colony conversations"),
        "{}",
        run.stderr
    );
}

/// A 200 whose body is not the API's (a base URL pointing at a web page) cannot be waited
/// out. It used to be taken for an outage: the resident retried it forever, and the run never
/// ended. The error names the page and where it came from (it was the JSON parser's "expected
/// value at line 1 column 1").
#[test]
fn an_answer_that_is_not_the_api_s_blocks_the_resident() {
    let fake = FakeProvider::start();
    fake.set_default(Reply::status(200).body("<html><title>Welcome to nginx!</title></html>"));
    let sandbox = styled(&fake, "openai");
    let run = run(&sandbox, ONE_MAIL, &[]);
    assert_blocked(
        &run,
        "api_error",
        "200",
        "API error 200: the server answered with a page, not the API's JSON (a proxy or a \
         wrong base_url?): Welcome to nginx! (at /openai/v1/chat/completions)",
    );
    assert_eq!(fake.calls(), 1);
    assert_mail_kept(&sandbox);
}

/// A resident that does not keep its conversation, blocked with its mail: the run ends, and
/// stderr says that mail is dropped (it used to go without a word).
#[test]
fn mail_a_resident_without_a_conversation_drops_at_the_end_is_named() {
    let fake = FakeProvider::start();
    fake.set_default(Reply::status(401));
    let sandbox = styled(&fake, "openai");
    let source = ONE_MAIL.replace(
        "persist_conversation = true",
        "persist_conversation = false",
    );
    let run = run(&sandbox, &source, &[]);
    assert_eq!(run.code, 3, "{}", run.stderr);
    assert!(
        run.stderr.contains(
            "[worker] stopped with 1 mail(s) not served; it does not keep its conversation \
             (persist_conversation), so they are dropped"
        ),
        "{}",
        run.stderr
    );
    // The run's last word agrees (it said the blocked residents' mail is kept).
    assert!(
        run.stderr.contains(
            "keeps its mail in the state directory for the next run; the others' is dropped"
        ),
        "{}",
        run.stderr
    );
    assert!(
        !run.stderr.contains("The blocked residents' mail is kept"),
        "{}",
        run.stderr
    );
}

#[test]
fn no_provider_configured_blocks_the_resident() {
    let sandbox = Sandbox::new();
    let run = run(&sandbox, ONE_MAIL, &[]);
    assert_blocked(
        &run,
        "config_error",
        "nil",
        "no provider for use-type \"general\": set one with `colony config set general provider \
         NAME` (known: anthropic, openai, groq, ollama, kimi, gemini, replay), pass one \
         (`provider = ...` in a script, `colony ask --provider`), or set a key such as \
         ANTHROPIC_API_KEY",
    );
    assert_mail_kept(&sandbox);
}

#[test]
fn a_cassette_without_the_request_ends_the_run_at_once_even_with_a_source_alive() {
    let sandbox = Sandbox::new();
    let cassette = sandbox.write("empty.jsonl", "");
    let cassette = cassette.display().to_string();
    // The source never ends: only the cassette miss can end this run before the guard.
    let source = ONE_MAIL.replace(
        "content = \"first\", hop = 0 }) end",
        "content = \"first\", hop = 0 }) while true do ai.sleep(50) end end",
    );
    let run = run(&sandbox, &source, &["--replay", &cassette]);
    let error = format!(
        "cassette {cassette} has no answer for request 1 (fingerprint \
         ef5a7b04e331130a726ddc14c265d097: 1 message(s), 0 tool(s), last text \"[mail from desk] \
         first\")"
    );
    assert_blocked(&run, "cassette_miss", "nil", &error);
    assert!(
        run.stderr.contains("record it again with --record"),
        "{}",
        run.stderr
    );
    assert_mail_kept(&sandbox);
}

/// A resident blocked because no provider is configured; its source waits for the reply, so the
/// program runs on. Once the test writes a config, the running program serves the mail.
#[test]
fn a_config_fixed_on_disk_is_served_by_the_running_program() {
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("served at last"));
    let sandbox = Sandbox::new().env("COLONY_TEST_KEY", "test-key-0123456789");
    let script = sandbox.write(
        "script.lua",
        r#"
local served = false
ai.spawn{ name = "worker",
  deliver_to = function(reply, info)
    print(info.kind .. ": " .. reply:gsub(" Its.*", ""))
    if info.kind == "reply" then served = true end
  end,
  sources = { function(self)
    assert(ai.mail{ to = self, source = "desk", content = "first", hop = 0 })
    while not served do ai.sleep(20) end
  end } }
print("watch ended: " .. ai.watch{ on_blocked = function(name, err) print("on_blocked: " .. name .. " " .. err.kind) end })
"#,
    );
    let script = script.display().to_string();
    let mut child = sandbox.spawn(&["run", "--max-time", GUARD, &script]);
    let (tx, lines) = mpsc::channel();
    let stdout = child.stdout.take().expect("piped stdout");
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let next = || {
        lines
            .recv_timeout(Duration::from_secs(60))
            .expect("the program prints its next line")
    };
    assert!(next().starts_with("blocked: [colony] worker is blocked: config_error: no provider"));
    assert_eq!(next(), "on_blocked: worker config_error");
    std::fs::write(
        sandbox.path("config.toml"),
        format!(
            "[use.general]\nprovider = \"openai\"\nmodel = \"m\"\nbase_url = \"{}\"\nkey_env = \"COLONY_TEST_KEY\"\n",
            fake.base_url("openai")
        ),
    )
    .expect("write the config");
    let status = child.wait().expect("colony ends");
    let rest: Vec<String> = lines.iter().collect();
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    assert_eq!(status.code(), Some(0), "{rest:?}\nstderr:\n{stderr}");
    assert_eq!(rest.len(), 3, "{rest:?}");
    assert!(
        rest[0].starts_with("recovered: [colony] worker reaches its model again after "),
        "{rest:?}"
    );
    assert_eq!(&rest[1..], ["reply: served at last", "watch ended: idle"]);
    let bodies = support::model_calls(&fake);
    assert_eq!(bodies.len(), 1);
    assert_eq!(
        bodies[0]["messages"][0]["content"],
        "[mail from desk] first"
    );
}

#[test]
fn ai_unblock_lets_a_blocked_resident_try_again() {
    let fake = FakeProvider::start();
    fake.push(Reply::status(401));
    fake.set_default(Reply::text("served"));
    let run = run(
        &styled(&fake, "openai"),
        r#"
ai.route{ model = "m" }
ai.spawn{ name = "worker",
  deliver_to = function(reply, info) print(info.kind) end,
  sources = { function(self) assert(ai.mail{ to = self, source = "desk", content = "first", hop = 0 }) end } }
print("before the watch:", ai.unblock("worker"))
print("watch ended: " .. ai.watch{ on_blocked = function(name, err)
  print("unknown:", ai.unblock("nobody"))
  print("unblock:", ai.unblock(name))
  print("again:", ai.unblock(name))
end })
"#,
        &[],
    )
    .ok();
    assert_eq!(
        run.lines(),
        [
            "before the watch:\tnil\tno_recipient",
            "blocked",
            "unknown:\tnil\tno_recipient",
            "unblock:\ttrue",
            "again:\tfalse",
            "recovered",
            "reply",
            "watch ended: idle",
        ]
    );
    assert_eq!(fake.calls(), 2);
}

/// An `on_blocked` that unblocks at once (as the API invites) tried a refused key again at once,
/// blocked again, and was called again: a request every few milliseconds, for as long as the
/// program ran. The second unblock in a row waits a second before its try, the next two, and so
/// on; a turn that goes through starts the count again.
#[test]
fn unblocking_again_and_again_waits_longer_each_time() {
    let fake = FakeProvider::start();
    for _ in 0..3 {
        fake.push(Reply::status(401));
    }
    fake.set_default(Reply::text("served"));
    let run = run(
        &styled(&fake, "openai"),
        r#"
ai.route{ model = "m" }
ai.spawn{ name = "worker",
  deliver_to = function(reply, info) print(info.kind) end,
  sources = { function(self) assert(ai.mail{ to = self, source = "desk", content = "first", hop = 0 }) end } }
print("watch ended: " .. ai.watch{ on_blocked = function(name) ai.unblock(name) end })
"#,
        &[],
    )
    .ok();
    assert_eq!(
        run.lines(),
        [
            "blocked",
            "blocked",
            "blocked",
            "recovered",
            "reply",
            "watch ended: idle"
        ]
    );
    assert_eq!(fake.calls(), 4);
    let waits: Vec<&str> = run
        .stderr
        .lines()
        .filter_map(|l| l.split_once("unblocked: ").map(|(_, w)| w))
        .collect();
    assert_eq!(
        waits,
        [
            "trying again in 1 s (blocked 2 times in a row) ai=worker",
            "trying again in 2 s (blocked 3 times in a row) ai=worker",
        ],
        "{}",
        run.stderr
    );
}

#[test]
fn an_overloaded_provider_still_takes_the_outage_path() {
    let fake = FakeProvider::start();
    fake.push(Reply::status(529).header("retry-after-ms", "20"));
    fake.set_default(Reply::text("served"));
    let run = run(
        &styled(&fake, "anthropic"),
        r#"
ai.route{ provider = "anthropic", model = "m" }
ai.spawn{ name = "worker",
  deliver_to = function(reply, info) print(info.kind, info.error and type(info.error) or "-") end,
  sources = { function(self) assert(ai.mail{ to = self, source = "desk", content = "first", hop = 0 }) end } }
print("watch ended: " .. ai.watch{ on_blocked = function() print("on_blocked") end })
"#,
        &[],
    )
    .ok();
    assert_eq!(
        run.lines(),
        [
            "outage\tstring",
            "recovered\t-",
            "reply\t-",
            "watch ended: idle"
        ]
    );
    assert_eq!(fake.calls(), 2);
}

/// One garbled answer (JSON that is not the API's: a proxy's hiccup) is an outage, and the mail
/// is served by the next try: it blocked the resident until the config changed, and the run
/// ended with every later mail unserved. The same three times in a row blocks (each is a paid
/// call).
#[test]
fn a_garbled_answer_is_an_outage_until_it_comes_three_times_in_a_row() {
    let garbled = || Reply::status(200).body(r#"{"id":"x","choices":[]}"#);
    let fake = FakeProvider::start();
    fake.push(garbled());
    fake.set_default(Reply::text("served"));
    let sandbox = styled(&fake, "openai");
    let once = run(&sandbox, ONE_MAIL, &[]).ok();
    let lines = once.lines();
    assert!(
        lines[0].starts_with("outage: [colony] worker cannot reach its model (could not parse"),
        "{}",
        once.stdout
    );
    assert!(lines[1].starts_with("recovered: "), "{}", once.stdout);
    assert_eq!(lines[2], "reply: served");
    assert_eq!(fake.calls(), 2);

    let fake = FakeProvider::start();
    fake.set_default(garbled());
    let sandbox = styled(&fake, "openai");
    let always = run(&sandbox, ONE_MAIL, &[]);
    assert_eq!(always.code, 3, "{}\n{}", always.stdout, always.stderr);
    assert!(
        always
            .stdout
            .contains("notice: blocked, parse_error, status nil, transient false, 1 held"),
        "{}",
        always.stdout
    );
    assert_eq!(fake.calls(), 3);
    assert_mail_kept(&sandbox);
}

/// A provider's long retry-after is waited up to ten minutes, and said: the resident sat silent
/// that long, its notice naming the failure but not when it would try again.
#[test]
fn an_outage_says_when_it_tries_again() {
    let fake = FakeProvider::start();
    fake.set_default(Reply::status(429).header("retry-after", "86400"));
    let sandbox = styled(&fake, "openai");
    let run = sandbox.lua(ONE_MAIL, &["--max-time", "3"]);
    assert_eq!(run.code, 124, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr.contains(
            "outage: holding arrivals; trying again in 600 s (the provider asked for 86400 s)"
        ),
        "{}",
        run.stderr
    );
    // And the notice the program reads says so too.
    assert!(
        run.stdout
            .contains("until it can (trying again in 600 s (the provider asked for 86400 s))."),
        "{}",
        run.stdout
    );
    assert_eq!(fake.calls(), 1);

    // Past the longest duration (read as a year): not misquoted as "asked for 31536000 s".
    let fake = FakeProvider::start();
    fake.set_default(Reply::status(429).header("retry-after", "99999999"));
    let sandbox = styled(&fake, "openai");
    let run = sandbox.lua(ONE_MAIL, &["--max-time", "3"]);
    assert_eq!(run.code, 124, "{}\n{}", run.stdout, run.stderr);
    assert!(
        run.stderr
            .contains("trying again in 600 s (the provider asked for a year or more)"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_program_whose_sources_finished_and_residents_went_idle_exits_0() {
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("noted"));
    let run = run(
        &styled(&fake, "openai"),
        r#"
ai.route{ provider = "openai", model = "m" }
for _, name in ipairs{ "a", "b" } do
  ai.spawn{ name = name,
    deliver_to = function(reply, info) print(info.ai .. ": " .. reply) end,
    sources = { function(self)
      for i = 1, 2 do
        assert(ai.mail{ to = self, source = "desk", content = "note " .. i, hop = 0 })
        ai.sleep(10)
      end
    end } }
end
print("watch ended: " .. ai.watch{})
"#,
        &[],
    )
    .ok();
    let mut lines = run.lines();
    assert_eq!(lines.pop(), Some("watch ended: idle"));
    lines.sort();
    // Each AI served its two mails, in one turn or two.
    assert!(lines.iter().all(|l| *l == "a: noted" || *l == "b: noted"));
    assert!(lines.contains(&"a: noted") && lines.contains(&"b: noted"));
    assert!(run.stderr.is_empty(), "{}", run.stderr);
}

#[test]
fn max_time_ends_a_run_with_status_124() {
    let sandbox = Sandbox::new();
    // Nothing to do, but until_idle = false keeps the watch running (as for an embedder).
    let run = sandbox.lua(
        r#"
ai.spawn{ name = "worker" }
print("watch ended: " .. ai.watch{ until_idle = false })
"#,
        &["--max-time", "1"],
    );
    assert_eq!(run.code, 124, "{}", run.stderr);
    assert_eq!(run.lines(), ["watch ended: max-time"]);
    assert!(
        run.stderr
            .ends_with("colony: the run was ended by --max-time (1.0 s)\n"),
        "{}",
        run.stderr
    );
    // A source that never ends keeps a program from settling: --max-time ends it too.
    let run = sandbox.lua(
        r#"
ai.spawn{ name = "worker", sources = { function() while true do ai.sleep(20) end end } }
print("watch ended: " .. ai.watch{})
"#,
        &["--max-time", "500ms"],
    );
    assert_eq!(run.code, 124, "{}", run.stderr);
    assert_eq!(run.lines(), ["watch ended: max-time"]);
    // Before ai.watch nothing hears a stop: the run ends at the limit, as a signal ends it
    // then (it waited out the grace too, and said the program did not end).
    let run = sandbox.lua(
        "print('waiting') ai.sleep(60000) print('woke')",
        &["--max-time", "1"],
    );
    assert_eq!(run.code, 124, "{}", run.stderr);
    assert_eq!(run.lines(), ["waiting"]);
    assert_eq!(
        run.stderr, "colony: the run was ended by --max-time (1.0 s)\n",
        "{}",
        run.stderr
    );
    // Ended where it waited, the run closed its store as any run does: its log copied into
    // the file and removed (ending the process at the limit left both beside it).
    let state = sandbox.path("st");
    let run = sandbox.lua(
        "store.set('k', 'kept') ai.sleep(60000)",
        &["--max-time", "1", "--state", &state.display().to_string()],
    );
    assert_eq!(run.code, 124, "{}", run.stderr);
    let left = support::left_open(&state);
    assert!(left.is_empty(), "left beside the store: {left:?}");
    let opened = colony::store::state_dir::StateDir::open(&state).unwrap();
    assert_eq!(
        colony::store::Store::get(&*opened.store(), "", "k").unwrap(),
        Some(serde_json::json!("kept"))
    );
    let bad = sandbox.lua("print(1)", &["--max-time", "soon"]);
    assert_eq!(bad.code, 2, "{}", bad.stderr);
    assert!(
        bad.stderr.contains("\"soon\" is not a duration"),
        "{}",
        bad.stderr
    );
}

/// A model that answers nothing (no text, no tool call: Anthropic's empty `content`, Gemini's
/// empty answer) is said in the log: the mail was served without a word anyone could see.
#[test]
fn a_model_that_answers_nothing_is_said() {
    for style in ["anthropic", "gemini"] {
        let fake = FakeProvider::start();
        fake.set_default(Reply::text(""));
        let sandbox = styled(&fake, style);
        let run = run(&sandbox, ONE_MAIL, &[]);
        assert_eq!(run.code, 0, "{style}: {}\n{}", run.stdout, run.stderr);
        assert!(
            run.stderr.contains(
                "its model answered nothing (no text, no tool call; stop: end_turn): 1 mail(s) \
                 served without a reply"
            ),
            "{style}: {}",
            run.stderr
        );
    }
}
