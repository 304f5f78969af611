//! Residents through the binary: the route, mail with hop counts, sources under supervision,
//! delivery, the outage path and stopping. The fake provider answers from each request's content
//! (not a queue), so residents that infer in parallel get the right answers in any order.

mod support;

use serde_json::{Value, json};
use support::fake::{FakeProvider, Reply};
use support::styled;

/// The OpenAI-style request's system text and its last message.
fn parts(body: &Value) -> (String, Value) {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let system = messages
        .iter()
        .find(|m| m["role"] == "system")
        .and_then(|m| m["content"].as_str())
        .unwrap_or("")
        .to_string();
    (system, messages.last().cloned().unwrap_or(Value::Null))
}

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

#[test]
fn two_ais_relay_until_max_hop() {
    let fake = FakeProvider::start();
    // Each AI relays every mail to the other through `tell`, then says it is done.
    fake.set_responder(|body, _| {
        let (system, last) = parts(body);
        if last["role"] == "tool" {
            return Reply::text("relayed");
        }
        let other = if system.contains("You are a") {
            "b"
        } else {
            "a"
        };
        Reply::tool_call("c1", "tell", json!({"to": other, "text": "ping"}))
    });
    let run = styled(&fake, "openai").lua(
        r#"
local tell = ai.tool{
  name = "tell", description = "Mail another AI",
  parameters = { to = "string", text = "string" },
  handler = function(args, ctx)
    local p = ai.inbound_provenance()
    assert(p.ai == p.to and p.ai == ctx.ai, "the serving AI")
    local ok, err = ai.mail{ to = args.to, source = p.ai, content = args.text, hop = p.hop + 1 }
    print(string.format("%s tells %s at hop %d (from %s, ctx hop %d): %s",
      p.ai, args.to, p.hop + 1, p.origin, ctx.hop, tostring(ok or err)))
    if not ok then return nil, err end
    return "sent"
  end,
}
local replies = 0
local function deliver(reply, info)
  replies = replies + 1
  print(string.format("reply %d from %s: %s (hop %d)", replies, info.ai, reply, info.hop))
  if replies == 3 then ai.stop("done") end
end
ai.route{ provider = "openai", model = "m" }
ai.spawn{ name = "a", system = "You are a", tools = { tell }, max_hop = 2, deliver_to = deliver,
  sources = { function(self) assert(ai.mail{ to = self, source = "desk", content = "start", hop = 0 }) end } }
ai.spawn{ name = "b", system = "You are b", tools = { tell }, max_hop = 2, deliver_to = deliver }
print("before the watch:", ai.mail{ to = "a", source = "x", content = "early", hop = 0 })
print("watch ended:", ai.watch{})
"#,
        &[],
    );
    let run = run.ok();
    let lines = run.lines();
    assert_eq!(
        lines[0],
        "before the watch:\tnil\tno_recipient: \"a\" is spawned but not started: the watch starts \
         it (mail it from one of its sources, or once ai.watch runs)"
    );
    let tells: Vec<&&str> = lines.iter().filter(|l| l.contains(" tells ")).collect();
    assert_eq!(
        tells,
        [
            &"a tells b at hop 1 (from desk, ctx hop 0): true",
            &"b tells a at hop 2 (from a, ctx hop 1): true",
            &"a tells b at hop 3 (from b, ctx hop 2): hop_limit: hop 3 to \"b\" is above its max_hop of 2",
        ]
    );
    // The replies race (a and b answer in parallel); which AI answered which hop does not.
    let mut replies: Vec<String> = lines
        .iter()
        .filter_map(|l| l.strip_prefix("reply "))
        .map(|l| {
            l.split_once(' ')
                .map(|(_, r)| r.to_string())
                .unwrap_or_default()
        })
        .collect();
    replies.sort();
    assert_eq!(
        replies,
        [
            "from a: relayed (hop 0)",
            "from a: relayed (hop 2)",
            "from b: relayed (hop 1)"
        ],
        "{}",
        run.stdout
    );
    assert_eq!(lines.last().unwrap(), &"watch ended:\tdone");
    // The hop-limited call came back to the model as an error result.
    let calls = support::model_calls(&fake);
    assert!(
        calls
            .iter()
            .any(|b| texts(b).iter().any(|t| t.contains("hop_limit"))),
        "no request carried the refusal"
    );
}

#[test]
fn dismissed_and_unknown_ais_answer_no_recipient() {
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("noted"));
    let run = styled(&fake, "openai").lua(
        r#"
local function show()
  local out = {}
  for _, r in ipairs(ai.residents()) do out[#out + 1] = r.name .. "=" .. r.state end
  return table.concat(out, " ")
end
ai.spawn{ name = "keeper", provider = "openai", model = "m", deliver_to = function() end }
ai.spawn{ name = "temp", provider = "openai", model = "m", deliver_to = function(reply, info)
  print("temp replied: " .. reply)
  print("dismiss temp:", ai.dismiss("temp"))
  print("mail temp:", ai.mail{ to = "temp", source = "t", content = "again", hop = 0 })
  print("dismiss temp again:", ai.dismiss("temp"))
  print("mail nobody:", ai.mail{ to = "nobody", source = "t", content = "x", hop = 0 })
  print("after:", show())
  print("dismiss keeper:", ai.dismiss("keeper"))
end, sources = { function(self) ai.mail{ to = self, source = "t", content = "hello", hop = 0 } end } }
print("before:", show())
print("watch ended:", ai.watch{})
"#,
        &[],
    );
    let run = run.ok();
    assert_eq!(
        run.lines(),
        [
            "before:\tkeeper=pending temp=pending",
            "temp replied: noted",
            "dismiss temp:\ttrue",
            "mail temp:\tnil\tno_recipient: \"temp\"",
            "dismiss temp again:\tnil\tno_recipient: \"temp\"",
            "mail nobody:\tnil\tno_recipient: \"nobody\"",
            "after:\tkeeper=idle",
            "dismiss keeper:\ttrue",
            "watch ended:\tevery resident is gone",
        ]
    );
}

#[test]
fn a_crashing_source_is_restarted_then_given_up() {
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("noted"));
    let run = styled(&fake, "openai").lua(
        r#"
local runs, crashes, fails = 0, {}, {}
ai.spawn{ name = "w", provider = "openai", model = "m",
  deliver_to = function(reply) print("w: " .. reply) ; ai.stop("done") end,
  sources = {
    { function(self) runs = runs + 1 ; error("boom " .. runs) end, restart = "permanent", restart_window_ms = 600000 },
    function(self)
      -- The other source goes on: it mails once the first has failed.
      while #fails == 0 do ai.sleep(5) end
      assert(ai.mail{ to = self, source = "second", content = "still here", hop = 0 })
    end,
  } }
print("watch ended:", ai.watch{
  on_crash = function(id, name, message) crashes[#crashes + 1] = id .. " (" .. name .. "): " .. message end,
  on_fail = function(id, name, err) fails[#fails + 1] = id .. ": " .. err end,
})
print("runs", runs)
for _, c in ipairs(crashes) do print("crash", c) end
for _, f in ipairs(fails) do print("fail", f) end
"#,
        &[],
    );
    let run = run.ok();
    let lines = run.lines();
    assert_eq!(lines[0], "w: noted");
    assert_eq!(lines[1], "watch ended:\tdone");
    // Three restarts allowed, the fourth crash is past the limit.
    assert_eq!(lines[2], "runs\t4");
    let crashes: Vec<&&str> = lines.iter().filter(|l| l.starts_with("crash")).collect();
    assert_eq!(crashes.len(), 4, "{lines:?}");
    assert!(
        crashes[0].starts_with("crash\tw/source/1 (w): ") && crashes[0].ends_with("boom 1"),
        "{}",
        crashes[0]
    );
    let fails: Vec<&&str> = lines.iter().filter(|l| l.starts_with("fail")).collect();
    assert_eq!(fails.len(), 1, "{lines:?}");
    assert!(fails[0].starts_with("fail\tw/source/1: ") && fails[0].ends_with("boom 4"));
}

#[test]
fn without_deliver_to_undelivered_text_gains_one_line() {
    let fake = FakeProvider::start();
    fake.set_responder(|body, _| {
        let (_, last) = parts(body);
        let text = last["content"].as_str().unwrap_or("");
        if text.contains("quiet") {
            Reply::text("  ")
        } else {
            Reply::text("something to say")
        }
    });
    let run = styled(&fake, "openai").lua(
        r#"
local function settle(n)
  -- Waits until the resident has finished the turn that brings its conversation to n messages.
  while true do
    local r = ai.residents()[1]
    if r.state == "idle" and r.conversation >= n then return r.conversation end
    ai.sleep(2)
  end
end
ai.spawn{ name = "mute", provider = "openai", model = "m", sources = { function(self)
  ai.mail{ to = self, source = "t", content = "first", hop = 0 }
  print("after first:", settle(3))
  ai.mail{ to = self, source = "t", content = "quiet please", hop = 0 }
  print("after quiet:", settle(5))
  ai.mail{ to = self, source = "t", content = "third", hop = 0 }
  print("after third:", settle(8))
  ai.stop("done")
end } }
ai.watch{}
"#,
        &[],
    );
    let run = run.ok();
    // first: user + reply + the note; quiet: user + blank reply (no note); third: user + reply + note.
    assert_eq!(
        run.lines(),
        ["after first:\t3", "after quiet:\t5", "after third:\t8"]
    );
    let calls = support::model_calls(&fake);
    assert_eq!(calls.len(), 3);
    let second = texts(&calls[1]);
    assert_eq!(
        second,
        [
            "[mail from t] first",
            "something to say",
            "[colony] Your last reply was not delivered: you have no deliver_to, so nobody reads your replies. Speak through your tools.",
            "[mail from t] quiet please",
        ]
    );
    let third = texts(&calls[2]);
    assert_eq!(third.len(), 6, "{third:?}");
    assert_eq!(third[4], "  ");
    assert_eq!(third[5], "[mail from t] third");
}

#[test]
fn a_resident_whose_delivery_raises_restarts_with_its_conversation() {
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("answer"));
    let run = styled(&fake, "openai").lua(
        r#"
local n = 0
ai.spawn{ name = "r", provider = "openai", model = "m",
  deliver_to = function(reply)
    n = n + 1
    if n == 1 then error("the printer is on fire") end
    print("delivered " .. reply) ; ai.stop("done")
  end,
  sources = { function(self)
    ai.mail{ to = self, source = "t", content = "one", hop = 0 }
    while ai.residents()[1].restarts == 0 do ai.sleep(2) end
    ai.mail{ to = self, source = "t", content = "two", hop = 0 }
  end } }
print(ai.watch{ on_crash = function(id, name, message) print("crash " .. id .. ": " .. message) end })
"#,
        &[],
    );
    let run = run.ok();
    let lines = run.lines();
    assert!(
        lines[0].starts_with("crash r: ") && lines[0].contains("the printer is on fire"),
        "{lines:?}"
    );
    assert_eq!(&lines[1..], ["delivered answer", "done"]);
    let calls = support::model_calls(&fake);
    assert_eq!(
        texts(&calls[1]),
        ["[mail from t] one", "answer", "[mail from t] two"]
    );
}

/// A mail whose id the recipient accepted before answers `true, "duplicate"`: it is not served
/// (the first is). It answered a bare `true`, so a sender that reused an id for another mail
/// could not tell that mail was never to be served.
#[test]
fn a_repeated_mail_id_is_answered_as_a_duplicate() {
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("ok"));
    let sb = styled(&fake, "openai");
    let state = sb.path("state").display().to_string();
    let run = sb
        .lua(
            r#"ai.spawn{ name = "a", provider = "openai", model = "m", persist_conversation = true,
  sources = { function(self)
    print(ai.mail{ to = self, source = "s", content = "A", hop = 0, id = "same" })
    print(ai.mail{ to = self, source = "s", content = "B", hop = 0, id = "same" })
  end } }
ai.watch()
"#,
            &["--state", &state],
        )
        .ok();
    assert_eq!(run.lines(), ["true", "true\tduplicate"]);
    let calls = support::model_calls(&fake);
    assert_eq!(calls.len(), 1);
    assert_eq!(texts(&calls[0]), ["[mail from s] A"]);
}

#[test]
fn misuse_is_named() {
    let fake = FakeProvider::start();
    let sb = styled(&fake, "openai");
    let run = sb
        .lua(r#"ai.mail{ to = "a", source = "s", content = "c" }"#, &[])
        .failed();
    assert!(
        run.stderr
            .contains("script.lua:1: ai.mail: hop is required"),
        "{}",
        run.stderr
    );
    let run = sb
        .lua(
            r#"ai.mail{ to = "a", source = "s", content = "c", hop = 0, id = "" }"#,
            &[],
        )
        .failed();
    assert!(
        run.stderr
            .contains("script.lua:1: ai.mail: id is empty: give an id that names the mail"),
        "{}",
        run.stderr
    );
    let run = sb
        .lua(r#"ai.spawn{ name = "a", colour = "red" }"#, &[])
        .failed();
    assert!(
        run.stderr
            .contains("ai.spawn \"a\": unknown option \"colour\""),
        "{}",
        run.stderr
    );
    // The options it lists name each once (tools was listed twice).
    assert_eq!(run.stderr.matches(" tools,").count(), 1, "{}", run.stderr);
    // A misspelt "host" is shown as written (it said "not string").
    let run = sb
        .lua(r#"ai.spawn{ name = "a", deliver_to = "hots" }"#, &[])
        .failed();
    assert!(
        run.stderr
            .contains("deliver_to must be a function(reply, info) or \"host\", not \"hots\""),
        "{}",
        run.stderr
    );
    let run = sb
        .lua(
            r#"ai.spawn{ name = "a", persist_conversation = "yes" }"#,
            &[],
        )
        .failed();
    assert!(
        run.stderr
            .contains("persist_conversation must be true or false, not string"),
        "{}",
        run.stderr
    );
    let run = sb
        .lua(r#"ai.spawn{ name = "a", restart = "sometimes" }"#, &[])
        .failed();
    assert!(
        run.stderr.contains("restart = \"sometimes\""),
        "{}",
        run.stderr
    );
    let run = sb
        .lua(r#"ai.spawn{ name = "a", middleware = { 3 } }"#, &[])
        .failed();
    assert!(
        run.stderr.contains("middleware[1] is not"),
        "{}",
        run.stderr
    );
    let run = sb
        .lua(r#"ai.spawn{ name = "a" } ai.spawn{ name = "a" }"#, &[])
        .failed();
    assert!(run.stderr.contains("already spawned"), "{}", run.stderr);
    let run = sb.lua(r#"print(ai.watch{})"#, &[]).ok();
    assert_eq!(run.stdout, "there are no residents\n");
}

#[test]
fn host_deliveries_print_under_colony_run() {
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("hi there"));
    let run = styled(&fake, "openai").lua(
        r#"
ai.spawn{ name = "greeter", provider = "openai", model = "m", deliver_to = "host",
  sources = { function(self) ai.mail{ to = self, source = "t", content = "hello", hop = 0 } end } }
ai.spawn{ name = "stopper", provider = "openai", model = "m", sources = { function()
  -- A resident is idle again only after its delivery returned.
  while not (ai.residents()[1].conversation > 0 and ai.residents()[1].state == "idle") do ai.sleep(2) end
  ai.stop("done")
end } }
ai.watch{}
"#,
        &[],
    );
    assert_eq!(run.ok().stdout, "[greeter] hi there\n");
}

#[test]
fn an_outage_holds_the_newest_24_and_tells_once_in_and_once_out() {
    let fake = FakeProvider::start();
    // Overloaded (asking for a 5 ms wait) until a request carries the last mail.
    fake.set_responder(|body, _| {
        if texts(body).iter().any(|t| t == "[mail from t] mail 30") {
            Reply::text("caught up")
        } else {
            Reply::status(529).header("retry-after-ms", "5")
        }
    });
    let run = styled(&fake, "openai").lua(
        r#"
local notices = {}
ai.spawn{ name = "r", provider = "openai", model = "m",
  deliver_to = function(text, info)
    notices[#notices + 1] = info.kind .. ": " .. text
    if info.kind == "reply" then ai.stop("done") end
  end,
  sources = { function(self)
    ai.mail{ to = self, source = "t", content = "mail 1", hop = 0 }
    while ai.residents()[1].state ~= "outage" do ai.sleep(1) end
    for i = 2, 30 do ai.mail{ to = self, source = "t", content = "mail " .. i, hop = 0 } end
    local r = ai.residents()[1]
    print("during the outage: conversation " .. r.conversation)
  end } }
ai.watch{}
for _, n in ipairs(notices) do print(n) end
"#,
        &[],
    );
    let run = run.ok();
    let lines = run.lines();
    assert_eq!(lines[0], "during the outage: conversation 0");
    assert_eq!(lines.len(), 4, "{lines:?}");
    assert!(
        lines[1].starts_with("outage: [colony] r cannot reach its model (")
            && lines[1].contains("holding the newest 24 arrivals until it can (trying again in "),
        "{}",
        lines[1]
    );
    assert!(
        lines[2].starts_with("recovered: [colony] r reaches its model again after ")
            && lines[2].ends_with("24 held arrivals are served (6 older ones were dropped)."),
        "{}",
        lines[2]
    );
    assert_eq!(lines[3], "reply: caught up");
    let calls = support::model_calls(&fake);
    let (failed, last) = calls.split_at(calls.len() - 1);
    assert!(!failed.is_empty(), "the first attempt failed");
    // While the model could not be called the conversation did not grow: every attempt sent
    // only held arrivals (behind the marker once the bound discarded some), no replies.
    for body in failed {
        let t = texts(body);
        assert!(!t.is_empty() && t.len() <= 25, "{t:?}");
        for m in body["messages"].as_array().unwrap() {
            assert_eq!(m["role"], "user", "{body}");
        }
    }
    let sent = texts(&last[0]);
    let mut expected = vec![
        "[colony] 6 older messages arrived while the model could not be called and were dropped; the newest 24 follow.".to_string(),
    ];
    expected.extend((7..=30).map(|i| format!("[mail from t] mail {i}")));
    assert_eq!(sent, expected);
}

#[test]
fn sigterm_lets_the_turn_in_flight_finish_and_starts_no_other() {
    let fake = FakeProvider::start();
    fake.set_responder(|body, _| {
        let (_, last) = parts(body);
        if last["role"] == "tool" {
            Reply::text("finished")
        } else {
            Reply::tool_call("c1", "slow", json!({}))
        }
    });
    let sb = styled(&fake, "openai");
    let started = sb.path("started");
    let script = sb.write(
        "script.lua",
        &format!(
            r#"
local slow = ai.tool{{ name = "slow", description = "Takes a while", parameters = {{}},
  handler = function()
    fs.write({started:?}, "yes")
    while not ai.stopping() do ai.sleep(5) end
    return "wrapped up because of " .. ai.stopping()
  end }}
ai.spawn{{ name = "r", provider = "openai", model = "m", tools = {{ slow }},
  deliver_to = function(reply) print("delivered: " .. reply) end,
  sources = {{ function(self)
    ai.mail{{ to = self, source = "t", content = "one", hop = 0 }}
    while not fs.exists({started:?}) do ai.sleep(5) end
    ai.mail{{ to = self, source = "t", content = "two", hop = 0 }}
  end }} }}
print("watch ended: " .. ai.watch{{}})
"#,
            started = started.display().to_string()
        ),
    );
    let child = sb.spawn(&["run", &script.display().to_string()]);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !started.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the tool never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill runs");
    assert!(status.success());
    let out = child.wait_with_output().expect("colony ends");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(stdout, "delivered: finished\nwatch ended: SIGTERM\n");
    let calls = support::model_calls(&fake);
    // The turn in flight made its second step; "two" never started a turn.
    assert_eq!(calls.len(), 2);
    let results: Vec<String> = texts(&calls[1]);
    assert!(
        results.contains(&"wrapped up because of SIGTERM".to_string()),
        "{results:?}"
    );
}

/// Waits for `path` to exist, failing the test if `child` ends first or a minute passes.
fn wait_for_file(path: &std::path::Path, child: &mut std::process::Child, what: &str) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !path.exists() {
        if let Ok(Some(status)) = child.try_wait() {
            panic!("colony ended ({status}) before {what}");
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{what} never happened"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[test]
fn a_second_ctrl_c_stops_the_turn_in_flight_without_waiting_out_the_grace() {
    let fake = FakeProvider::start();
    fake.set_responder(|body, _| {
        let (_, last) = parts(body);
        if last["role"] == "tool" {
            Reply::text("finished")
        } else {
            Reply::tool_call("c1", "stubborn", json!({}))
        }
    });
    let sb = styled(&fake, "openai");
    let started = sb.path("started");
    let told = sb.path("told");
    let script = sb.write(
        "script.lua",
        &format!(
            r#"
local stubborn = ai.tool{{ name = "stubborn", description = "Never ends", parameters = {{}},
  timeout = 7200,
  handler = function()
    fs.write({started:?}, "yes")
    while true do
      if ai.stopping() and not fs.exists({told:?}) then fs.write({told:?}, ai.stopping()) end
      ai.sleep(5)
    end
  end }}
ai.spawn{{ name = "r", provider = "openai", model = "m", tools = {{ stubborn }},
  deliver_to = function(reply) print("delivered: " .. reply) end,
  sources = {{ function(self) ai.mail{{ to = self, source = "t", content = "go", hop = 0 }} end }} }}
print("watch ended: " .. ai.watch{{ grace_ms = 3600000 }})
"#,
            started = started.display().to_string(),
            told = told.display().to_string(),
        ),
    );
    let mut child = sb.spawn(&["run", &script.display().to_string()]);
    let interrupt = |child: &std::process::Child| {
        let status = std::process::Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status()
            .expect("kill runs");
        assert!(status.success());
    };
    wait_for_file(&started, &mut child, "the tool started");
    interrupt(&child);
    // The watch has heard the first Ctrl-C once the tool sees the program stopping.
    wait_for_file(&told, &mut child, "the tool saw the stop");
    interrupt(&child);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while child.try_wait().expect("waiting on colony").is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().expect("colony ends");
            panic!(
                "the second Ctrl-C did not end the hour's grace: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("colony ends");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    // The turn was stopped: nothing delivered, and the script went on after its watch.
    assert_eq!(stdout, "watch ended: SIGINT\n", "{stderr}");
    assert!(
        stderr.contains("SIGINT: stopping; 1 turn(s) in flight get up to 3600.0 s to finish (Ctrl-C or SIGTERM again stops them now)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("SIGINT again: stopping the turns in flight now"),
        "{stderr}"
    );
    assert_eq!(support::model_calls(&fake).len(), 1);
}

#[test]
fn breaker_transitions_reach_lua_and_context_is_added_to_each_step() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let fake = FakeProvider::start();
    let n = Arc::new(AtomicUsize::new(0));
    let seen = n.clone();
    // Three overloaded answers, then the provider is back.
    fake.set_responder(move |_, _| {
        if seen.fetch_add(1, Ordering::SeqCst) < 3 {
            Reply::status(529).header("retry-after-ms", "1")
        } else {
            Reply::text("back")
        }
    });
    let run = styled(&fake, "openai").lua(
        r#"
ai.route{ provider = "openai", model = "m", middleware = {
  ai.with_context{ system_suffix = "Be brief.", before_step = function(info) return "Messages so far: " .. info.messages end },
  ai.with_breaker{ threshold = 2, first_probe_ms = 20, on_transition = function(from, to, info)
    print(from .. " -> " .. to .. " after " .. info.failures .. " failures")
  end },
} }
ai.spawn{ name = "r", system = "You are r.", deliver_to = function(reply, info)
    if info.kind == "reply" then print("reply: " .. reply) ; ai.stop("done") end
  end,
  sources = { function(self) ai.mail{ to = self, source = "t", content = "hello", hop = 0 } end } }
ai.watch{}
"#,
        &[],
    );
    let run = run.ok();
    assert_eq!(
        run.lines(),
        [
            "closed -> open after 2 failures",
            "open -> half_open after 2 failures",
            "half_open -> open after 3 failures",
            "open -> half_open after 3 failures",
            "half_open -> closed after 0 failures",
            "reply: back",
        ]
    );
    let calls = support::model_calls(&fake);
    // The open breaker refused the steps between probes without calling the provider.
    assert_eq!(calls.len(), 4);
    assert_eq!(
        calls[3]["messages"][0]["content"],
        "You are r.\n\nBe brief.\n\nMessages so far: 1"
    );
}

#[test]
fn a_turn_cut_short_after_its_tools_ran_continues_without_running_them_again() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let fake = FakeProvider::start();
    let after_tool = Arc::new(AtomicUsize::new(0));
    let seen = after_tool.clone();
    // The step after the tool fails once (overloaded), then answers.
    fake.set_responder(move |body, _| {
        let (_, last) = parts(body);
        if last["role"] != "tool" {
            return Reply::tool_call("c1", "note", json!({"text": "x"}));
        }
        if seen.fetch_add(1, Ordering::SeqCst) == 0 {
            Reply::status(529).header("retry-after-ms", "5")
        } else {
            Reply::text("done")
        }
    });
    let run = styled(&fake, "openai").lua(
        r#"
local runs = 0
local note = ai.tool{ name = "note", description = "Notes", parameters = { text = "string" },
  handler = function() runs = runs + 1 ; return "noted " .. runs end }
ai.spawn{ name = "r", provider = "openai", model = "m", tools = { note },
  deliver_to = function(text, info)
    print(info.kind)
    if info.kind == "reply" then print(text) ; ai.stop("done") end
  end,
  sources = { function(self) ai.mail{ to = self, source = "t", content = "go", hop = 0 } end } }
ai.watch{}
print("the tool ran " .. runs .. " time(s)")
"#,
        &[],
    );
    assert_eq!(
        run.ok().lines(),
        [
            "outage",
            "recovered",
            "reply",
            "done",
            "the tool ran 1 time(s)"
        ]
    );
    let calls = support::model_calls(&fake);
    assert_eq!(calls.len(), 3);
    // The retry sent the committed transcript as it was: the mail, the call, its one result.
    assert_eq!(calls[2]["messages"], calls[1]["messages"]);
    let roles: Vec<&str> = calls[2]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, ["user", "assistant", "tool"]);
}

#[test]
fn a_resident_compacts_across_turns() {
    // Each answer reports 600 tokens against a 1,000-token window compacted at half: the second
    // mail's turn summarises first, though it is that turn's first request.
    let fake = FakeProvider::start();
    fake.set_responder(|body, _| {
        let t = texts(body);
        if t.last().is_some_and(|l| l.starts_with("Summarise")) {
            Reply::text("summary: one mail so far").usage(10, 5)
        } else {
            Reply::text("noted").usage(590, 10)
        }
    });
    let run = styled(&fake, "openai").lua(
        r#"
local n = 0
ai.spawn{ name = "r", provider = "openai", model = "m", context_window = 1000, compact_at = 0.5,
  deliver_to = function(reply)
    n = n + 1
    if n == 2 then ai.stop("done") end
  end,
  sources = { function(self)
    ai.mail{ to = self, source = "t", content = "one", hop = 0 }
    while ai.residents()[1].conversation < 2 do ai.sleep(2) end
    ai.mail{ to = self, source = "t", content = "two", hop = 0 }
  end } }
print(ai.watch{})
"#,
        &[],
    );
    assert_eq!(run.ok().stdout, "done\n");
    let calls = support::model_calls(&fake);
    assert_eq!(calls.len(), 3, "one mail, the summary, the second mail");
    assert!(texts(&calls[1]).last().unwrap().starts_with("Summarise"));
    let last = texts(&calls[2]);
    assert!(last[0].contains("summary: one mail so far"), "{last:?}");
}

/// A busy resident dismissed with mail waiting: the mail goes with it, and that is said (it
/// was dropped without a word).
#[test]
fn a_dismissal_says_how_much_waiting_mail_it_drops() {
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("late").delay(60_000));
    let run = styled(&fake, "openai").lua(
        r#"
ai.spawn{ name = "a", provider = "openai", model = "m" }
ai.spawn{ name = "boss", provider = "openai", model = "m", sources = { function()
  assert(ai.mail{ to = "a", source = "boss", content = "first", hop = 0 })
  local function state()
    for _, r in ipairs(ai.residents()) do if r.name == "a" then return r.state end end
  end
  while state() ~= "busy" do ai.sleep(10) end
  assert(ai.mail{ to = "a", source = "boss", content = "second", hop = 0 })
  assert(ai.mail{ to = "a", source = "boss", content = "third", hop = 0 })
  print("dismissed", ai.dismiss("a"))
  ai.stop("done")
end } }
print(ai.watch{})
"#,
        &[],
    );
    let run = run.ok();
    assert_eq!(run.stdout, "dismissed\ttrue\ndone\n");
    assert!(
        run.stderr
            .contains("dismissed with 2 waiting mail(s): they are dropped"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_name_hired_again_after_a_dismiss_keeps_its_new_sources() {
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("ok"));
    let run = styled(&fake, "openai").lua(
        r#"
ai.spawn{ name = "keeper", provider = "openai", model = "m" }
ai.spawn{ name = "a", provider = "openai", model = "m" }
ai.spawn{ name = "boss", provider = "openai", model = "m", sources = { function()
  ai.dismiss("a")
  ai.spawn{ name = "a", provider = "openai", model = "m", sources = { function()
    for i = 1, 5 do ai.sleep(10) end
    print("the new source lived")
    ai.stop("done")
  end } }
end } }
print(ai.watch{})
"#,
        &[],
    );
    assert_eq!(run.ok().stdout, "the new source lived\ndone\n");
}

/// Many residents spawned before the watch: each name once (a pending one dismissed frees its
/// name), all listed as pending, all registered when the watch comes up.
#[test]
fn thousands_spawned_before_the_watch_register_once_each() {
    let sb = support::script::Sandbox::new();
    let at = sb.path("script.lua").display().to_string();
    let run = sb
        .lua(
            r#"for i = 1, 5000 do ai.spawn{ name = "r" .. i, system = "Be brief." } end
               local ok, e = pcall(ai.spawn, { name = "r4999" })
               print(ok, e)
               print(ai.dismiss("r7"), (ai.spawn{ name = "r7" }))
               local pending = 0
               for _, r in ipairs(ai.residents()) do if r.state == "pending" then pending = pending + 1 end end
               print("pending", pending)
               ai.spawn{ name = "counter", sources = { function()
                 print("registered", #ai.residents())
                 ai.stop("counted")
               end } }
               print(ai.watch{})"#,
            &[],
        )
        .ok();
    let lines = run.lines();
    assert!(
        lines[0].starts_with(&format!(
            "false\t{at}:2: ai.spawn \"r4999\": an AI named \"r4999\" is already spawned"
        )),
        "{}",
        lines[0]
    );
    assert_eq!(
        lines[1..],
        ["true\tr7", "pending\t5000", "registered\t5001", "counted"]
    );
}

#[test]
fn a_full_mailbox_refuses_until_one_is_served() {
    // The first mail's turn holds in a tool until the source lets it go, so the next mails wait:
    // a mailbox of capacity 3 takes three and refuses the fourth; once the resident has served
    // them it accepts again. A relaying tool gets the same answer to pass on.
    let fake = FakeProvider::start();
    fake.set_responder(|body, _| {
        let t = texts(body);
        let last = body["messages"].as_array().and_then(|m| m.last()).cloned();
        if last.is_some_and(|m| m["role"] == "tool") {
            Reply::text("ok")
        } else if t.last().is_some_and(|l| l.ends_with("] hold")) {
            Reply::tool_call("h", "hold", json!({}))
        } else if t.last().is_some_and(|l| l.ends_with("] relay")) {
            Reply::tool_call("r", "relay", json!({}))
        } else {
            Reply::text("ok")
        }
    });
    let run = styled(&fake, "openai").lua(
        r#"
local held, released = false, false
local hold = ai.tool{ name = "hold", parameters = {}, handler = function()
  held = true
  while not released do ai.sleep(2) end
  return "released"
end }
local relay = ai.tool{ name = "relay", parameters = {}, handler = function()
  local ok, err = ai.mail{ to = "r", source = "relay", content = "x", hop = 1 }
  print("relay", ok, err)
  if not ok then return nil, err end
  return "sent"
end }
local function served() return ai.residents()[1].served end
ai.spawn{ name = "r", provider = "openai", model = "m", mailbox = 3, tools = { hold, relay },
  deliver_to = function() end }
ai.spawn{ name = "relayer", provider = "openai", model = "m", tools = { relay },
  deliver_to = function() end }
ai.spawn{ name = "source", provider = "openai", model = "m", sources = { function()
  local function mail(content) return ai.mail{ to = "r", source = "t", content = content, hop = 0 } end
  assert(mail("hold"))
  while not held do ai.sleep(2) end
  print(mail("one"), mail("two"), mail("three"), mail("four"))
  assert(ai.mail{ to = "relayer", source = "t", content = "relay", hop = 0 })
  while ai.residents()[2].state ~= "idle" or ai.residents()[2].conversation == 0 do ai.sleep(2) end
  print("refused", ai.residents()[1].refused, "waiting", ai.residents()[1].held)
  released = true
  while served() < 4 do ai.sleep(2) end
  print("again", mail("five"))
  while served() < 5 do ai.sleep(2) end
  local r = ai.residents()[1]
  print("served", r.served, "refused", r.refused)
  ai.stop("done")
end } }
print(ai.watch{})
"#,
        &[],
    );
    let run = run.ok();
    // The refusals are logged, as every other reason's is: once for the two (a sender pushed
    // back hard would write a line a mail).
    assert_eq!(
        run.stderr
            .matches("mail to \"r\" refused: mailbox_full: it holds its 3 waiting mails")
            .count(),
        1,
        "{}",
        run.stderr
    );
    assert_eq!(
        run.stdout,
        "true\ttrue\ttrue\tnil\tmailbox_full\n\
         relay\tnil\tmailbox_full\n\
         refused\t2\twaiting\t3\n\
         again\ttrue\n\
         served\t5\trefused\t2\n\
         done\n"
    );
    let calls = support::model_calls(&fake);
    // The relayer's model read the refusal as its tool's error result.
    assert!(
        calls
            .iter()
            .any(|c| c.to_string().contains("mailbox_full") && c.to_string().contains("relay")),
        "the relaying tool passed mailbox_full to its model"
    );
    // The three waiting mails were served in one turn; the refused fourth never reached a model.
    assert!(calls.iter().any(|c| {
        let t = texts(c);
        t.ends_with(&[
            "[mail from t] one".to_string(),
            "[mail from t] two".to_string(),
            "[mail from t] three".to_string(),
        ])
    }));
    assert!(
        !calls
            .iter()
            .any(|c| c.to_string().contains("[mail from t] four"))
    );
}

#[test]
fn a_persisted_resident_at_capacity_refuses_without_saving() {
    // The model is down (529, retry in a minute): the mail is held. A persisted mailbox of
    // capacity 2 takes one more and refuses the third before saving it, so after a restart (the
    // model up again) the resident serves exactly the two it accepted.
    let fake = FakeProvider::start();
    let up = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let model_up = up.clone();
    fake.set_responder(move |_, _| {
        if model_up.load(std::sync::atomic::Ordering::SeqCst) {
            Reply::text("ok")
        } else {
            Reply::status(529).header("retry-after", "60")
        }
    });
    let sb = styled(&fake, "openai");
    let state = sb.path("state-dir").display().to_string();
    let script = sb
        .write(
            "keeper.lua",
            r#"
local run = ...
ai.spawn{ name = "keeper", provider = "openai", model = "m", persist_conversation = true, mailbox = 2,
  deliver_to = function(reply, info)
    if info.kind == "reply" then print("reply: " .. reply) ; ai.stop("done") end
  end,
  sources = { function(self)
    if run ~= "first" then return end
    local function mail(content) return ai.mail{ to = self, source = "t", content = content, hop = 0 } end
    assert(mail("one"))
    while ai.residents()[1].state ~= "outage" do ai.sleep(2) end
    print(mail("two"), mail("three"))
    print("refused", ai.residents()[1].refused)
    ai.stop("stopped")
  end } }
print(ai.watch{})
"#,
        )
        .display()
        .to_string();
    let run = sb
        .colony(&["run", "--state", &state, &script, "first"])
        .ok();
    assert_eq!(run.stdout, "true\tnil\tmailbox_full\nrefused\t1\nstopped\n");
    up.store(true, std::sync::atomic::Ordering::SeqCst);
    let run = sb
        .colony(&["run", "--state", &state, &script, "second"])
        .ok();
    assert_eq!(run.stdout, "reply: ok\ndone\n");
    let calls = support::model_calls(&fake);
    assert_eq!(
        texts(calls.last().unwrap()),
        ["[mail from t] one", "[mail from t] two"],
        "the refused mail was never saved"
    );
}

#[test]
fn a_turn_that_reaches_max_steps_is_over_and_the_program_ends() {
    // The model calls a tool at every step, the last one included: the turn ends with the
    // results of the calls it did not run. That was read as a turn stopped midway, so the
    // resident was never at rest and the watch never returned; restored, it went on calling.
    let fake = FakeProvider::start();
    fake.set_responder(|_, _| Reply::tool_calls(vec![("c1", "spin", json!({}))]));
    let sb = styled(&fake, "openai");
    let state = sb.path("state").display().to_string();
    let program = |mail: bool| {
        format!(
            r#"
local spin = ai.tool{{ name = "spin", description = "d", parameters = {{}},
  handler = function() return "ok" end }}
ai.spawn{{ name = "w", provider = "openai", model = "m", tools = {{ spin }}, max_steps = 2,
  persist_conversation = true,
  sources = {{ function(self)
    if {mail} then ai.mail{{ to = self, source = "t", content = "go", hop = 0 }} end
  end }} }}
print(ai.watch{{}})
"#
        )
    };
    let first = sb.lua(&program(true), &["--max-time", "30", "--state", &state]);
    assert_eq!(first.code, 0, "{}", first.stderr);
    assert_eq!(first.lines(), ["idle"]);
    assert_eq!(support::model_calls(&fake).len(), 2);
    // Restored, the turn is not continued: no new mail, no model call.
    let again = sb.lua(&program(false), &["--max-time", "30", "--state", &state]);
    assert_eq!(again.code, 0, "{}", again.stderr);
    assert_eq!(again.lines(), ["idle"]);
    assert_eq!(support::model_calls(&fake).len(), 2);
}

#[test]
fn a_source_that_failed_for_good_fails_the_run_unless_on_fail_decides() {
    // The program ran on without it to `idle`, and the run ended with status 0.
    let source = |on_fail: &str| {
        format!(
            r#"
ai.spawn{{ name = "w", system = "x", sources = {{ function() error("source broke") end }} }}
print(ai.watch{{ {on_fail} }})
"#
        )
    };
    let sb = support::script::Sandbox::new();
    let run = sb.lua(&source(""), &["--max-time", "60"]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert_eq!(run.lines(), ["idle"]);
    let at = sb.path("script.lua").display().to_string();
    assert!(
        run.stderr.contains(&format!(
            "colony: [w/source/1] failed and was not started again: {at}:2: source broke\n\
             colony: the program ran on without it, so the run failed"
        )),
        "{}",
        run.stderr
    );
    let run = sb.lua(
        &source("on_fail = function(id) print('failed: ' .. id) end"),
        &["--max-time", "60"],
    );
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.lines(), ["failed: w/source/1", "idle"]);
}

#[test]
fn a_resident_that_keeps_its_conversation_serves_every_mail_held_through_an_outage() {
    let fake = FakeProvider::start();
    // Overloaded until a request carries the 24th mail (the first batch once all have come).
    fake.set_responder(|body, _| {
        if texts(body).iter().any(|t| t == "[mail from t] mail 24") {
            Reply::text("caught up")
        } else {
            Reply::status(529).header("retry-after-ms", "5")
        }
    });
    let run = styled(&fake, "openai").lua(
        r#"
local notices, replies = {}, 0
ai.spawn{ name = "r", provider = "openai", model = "m", persist_conversation = true,
  deliver_to = function(text, info)
    notices[#notices + 1] = info.kind .. ": " .. text
    if info.kind == "reply" then
      replies = replies + 1
      if replies == 2 then ai.stop("done") end
    end
  end,
  sources = { function(self)
    ai.mail{ to = self, source = "t", content = "mail 1", hop = 0 }
    while ai.residents()[1].state ~= "outage" do ai.sleep(1) end
    for i = 2, 30 do ai.mail{ to = self, source = "t", content = "mail " .. i, hop = 0 } end
  end } }
ai.watch{}
for _, n in ipairs(notices) do print(n) end
"#,
        &[],
    );
    let run = run.ok();
    let lines = run.lines();
    assert!(
        lines[0].contains("keeping every arrival until it can (trying again in "),
        "{lines:?}"
    );
    // Every mail reached the model, in two turns, and none was dropped.
    let calls = support::model_calls(&fake);
    let last = texts(calls.last().unwrap());
    let mails: Vec<String> = (1..=30)
        .map(|i| format!("[mail from t] mail {i}"))
        .collect();
    let sent: Vec<&String> = last
        .iter()
        .filter(|t| t.starts_with("[mail from t]"))
        .collect();
    assert_eq!(sent, mails.iter().collect::<Vec<_>>(), "{last:?}");
    assert!(!last.iter().any(|t| t.contains("were dropped")), "{last:?}");
}

#[test]
fn mail_to_a_resident_while_the_program_stops_says_so_and_text_that_is_not_utf8_is_named() {
    let fake = FakeProvider::start();
    fake.set_responder(|_, _| Reply::text("answer").delay(300));
    let run = styled(&fake, "openai")
        .lua(
            r#"
print(select(2, pcall(ai.mail, { to = "x", source = "t", content = "bad \255", hop = 0 })))
ai.spawn{ name = "a", provider = "openai", model = "m",
  deliver_to = function(reply, info)
    print(ai.mail{ to = "b", source = "a", content = reply, hop = info.hop + 1 })
  end,
  sources = { function(self)
    ai.mail{ to = self, source = "t", content = "go", hop = 0 }
    while ai.residents()[1].state ~= "busy" do ai.sleep(1) end
    ai.stop("done")
  end } }
ai.spawn{ name = "b", provider = "openai", model = "m" }
print(ai.watch{})
"#,
            &[],
        )
        .ok();
    let lines = run.lines();
    assert!(
        lines[0].ends_with(
            "ai.mail: content is not UTF-8 text (convert it, or send the bytes as a file)"
        ),
        "{lines:?}"
    );
    assert_eq!(
        lines[1],
        "nil\tstopping: no mail is taken for \"b\", the program is stopping (done)"
    );
    assert_eq!(lines[2], "done");
}

/// A program stopped before its watch (`ai.stop`, or a host's signal as the script reaches
/// `ai.watch`) has its watch return the stop's reason at once. The watch raised instead, the
/// hire of its first resident refused ("the route is stopping"), and the run failed: `colony
/// mcp serve` exited 1 on a SIGTERM that came as its program started.
#[test]
fn a_watch_stopped_before_it_began_returns_the_stop_s_reason() {
    let sb = support::script::Sandbox::new();
    let run = sb
        .lua(
            "ai.spawn{ name = \"a\", system = \"x\" }\nai.stop(\"early\")\nprint(ai.watch{})\n",
            &[],
        )
        .ok();
    assert_eq!(run.stdout, "early\n");
}
