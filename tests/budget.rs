//! Budgets through the binary, against the fake provider on loopback: a resident over its token
//! or cost budget is blocked with kind `budget` (its mail kept), a restart keeps it blocked
//! (usage is in the store), a program's budget counts every resident, `colony usage` prints
//! what was used, and a budget or price written wrong is refused by name.

mod support;

use chrono::{Duration, Utc};
use support::fake::{FakeProvider, Reply};
use support::script::{Run, Sandbox};
use support::styled;

/// Longer than any of these runs needs; a run still going then is a hang.
const GUARD: &str = "120";

/// `worker` with `BUDGET`, mailed "first" by a source at its first start; its reply "one" mails
/// it "again". Notices, replies and the watch's reason are printed.
const WORKER: &str = r#"
ai.route{ model = "m" }
ai.spawn{ name = "worker", persist_conversation = true, budget = BUDGET,
  deliver_to = function(reply, info)
    if info.kind == "blocked" then
      print(("blocked: %s: %s (%d held)"):format(info.error.kind, info.error.message, info.held))
    else
      print(info.kind .. ": " .. reply)
      if reply == "one" then assert(ai.mail{ to = "worker", source = "desk", content = "again", hop = 0 }) end
    end
  end,
  sources = { function(self)
    if not store.get("mailed") then
      store.set("mailed", true)
      assert(ai.mail{ to = self, source = "desk", content = "first", hop = 0 })
    end
  end } }
local reason = ai.watch{ on_blocked = function()
  for _, r in ipairs(ai.residents()) do
    print(("residents: %s %s %s, %d held"):format(r.name, r.state, r.error and r.error.kind or "-", r.held))
  end
end }
print("watch ended: " .. reason)
"#;

fn run(sandbox: &Sandbox, source: &str) -> Run {
    let state = sandbox.path("state-dir").display().to_string();
    sandbox.lua(source, &["--state", &state, "--max-time", GUARD])
}

fn usage(sandbox: &Sandbox) -> Run {
    let state = sandbox.path("state-dir").display().to_string();
    let script = sandbox.path("script.lua").display().to_string();
    sandbox.colony(&["usage", "--state", &state, &script]).ok()
}

/// The midnight (UTC) after now, as a budget's message names it; read before and after a run,
/// so a run that crosses midnight still matches one of them.
fn next_midnight() -> String {
    (Utc::now().date_naive() + Duration::days(1))
        .format("%Y-%m-%dT00:00:00Z")
        .to_string()
}

fn today() -> String {
    Utc::now().date_naive().format("%Y-%m-%d").to_string()
}

#[track_caller]
fn assert_exit(run: &Run, code: i32) {
    assert_eq!(
        run.code, code,
        "stdout:\n{}\nstderr:\n{}",
        run.stdout, run.stderr
    );
}

#[test]
fn a_token_budget_blocks_the_resident_and_a_restart_keeps_it_blocked_with_its_mail() {
    let fake = FakeProvider::start();
    fake.push(Reply::text("one").usage(10, 5));
    fake.set_default(Reply::text("not asked").usage(10, 5));
    let sandbox = styled(&fake, "openai");
    let source = WORKER.replace("BUDGET", r#"{ tokens = 15, per = "day" }"#);

    let resets = next_midnight();
    let first = run(&sandbox, &source);
    assert_exit(&first, 3);
    let why = format!("over its budget of 15 tokens per day (15 used); it resets at {resets}");
    assert_eq!(
        first.lines(),
        [
            "reply: one",
            &format!("blocked: budget: {why} (1 held)"),
            "residents: worker blocked budget, 1 held",
            &format!("watch ended: blocked: worker: budget: {why}"),
        ]
    );
    assert_eq!(fake.calls(), 1, "the mail over budget reached no model");
    // No setting is wrong: the run says the mail waits for the reset (it said to fix "the
    // setting named above").
    assert!(
        first.stderr.contains(
            "A budget is spent: run again after it resets (the time named above), or raise it \
             in the script."
        ) && !first.stderr.contains("Fix the setting"),
        "{}",
        first.stderr
    );

    // A restart: the usage is in the store, so the resident is still over its budget; the
    // mail it held waits, and no model is called.
    let second = run(&sandbox, &source);
    assert_exit(&second, 3);
    assert_eq!(
        second.lines(),
        [
            &format!("blocked: budget: {why} (1 held)"),
            "residents: worker blocked budget, 1 held",
            &format!("watch ended: blocked: worker: budget: {why}"),
        ]
    );
    assert_eq!(fake.calls(), 1);
    let state = sandbox.path("state-dir").display().to_string();
    let script = sandbox.path("script.lua").display().to_string();
    let kept = sandbox
        .colony(&["conversations", "--state", &state, &script, "list"])
        .ok();
    assert_eq!(kept.stdout.trim(), "worker  2 messages, 1 in backlog");

    // `m` has no price: its tokens are shown unpriced, not guessed.
    assert_eq!(
        usage(&sandbox).lines(),
        [
            "RESIDENT  DAY         INPUT  OUTPUT  CACHE  TURNS  COST",
            &format!(
                "worker    {}     10       5      0      1  unpriced (15 tokens)",
                today()
            ),
        ]
    );
}

#[test]
fn a_cost_budget_in_the_price_tables_currency_blocks_the_resident() {
    let fake = FakeProvider::start();
    fake.push(Reply::text("one").usage(10, 5));
    fake.set_default(Reply::text("not asked").usage(10, 5));
    let sandbox = styled(&fake, "openai");
    // 10 input tokens at 100,000 and 5 output tokens at 200,000 per million: 1 + 1 = 2 EUR.
    sandbox.write(
        "config.toml",
        "[prices]\ncurrency = \"EUR\"\n[prices.models.\"openai/m\"]\ninput = 100000\noutput = 200000\n",
    );
    let source = WORKER.replace("BUDGET", "{ cost = 2 }");
    let resets = next_midnight();
    let run = run(&sandbox, &source);
    assert_exit(&run, 3);
    let why =
        format!("over its budget of 2 EUR per day (2.000000 EUR spent); it resets at {resets}");
    assert_eq!(run.lines()[1], format!("blocked: budget: {why} (1 held)"));
    assert_eq!(fake.calls(), 1);
    assert_eq!(
        usage(&sandbox).lines()[1],
        format!(
            "worker    {}     10       5      0      1  2.000000 EUR",
            today()
        )
    );
}

/// Tokens read from a prompt cache are input tokens, counted once (Anthropic reports them apart
/// from `input_tokens`, OpenAI among `prompt_tokens`) and priced at the cache's price: they
/// were counted twice, a cached prompt blocked a resident under its budget and cost up to
/// twice its price.
#[test]
fn cached_input_tokens_are_counted_once_and_priced_as_cache_reads() {
    for provider in ["anthropic", "openai"] {
        let fake = FakeProvider::start();
        // 14 input tokens, 4 of them read from the cache, and 7 output: 21 in all.
        fake.push(Reply::text("one").usage(14, 7).cache_read(4));
        fake.set_default(Reply::text("one").usage(14, 7).cache_read(4));
        let sandbox = styled(&fake, provider);
        // 10 uncached input tokens at 100,000 per million (1), 4 cached at 25,000 (0.1), 7
        // output at 0: 1.1 EUR.
        sandbox.write(
            "config.toml",
            &format!(
                "[prices]\ncurrency = \"EUR\"\n[prices.models.\"{provider}/m\"]\ninput = 100000\n\
                 output = 0\ncache_read = 25000\n"
            ),
        );
        let source = WORKER.replace("BUDGET", r#"{ tokens = 22, per = "day" }"#);
        let run = run(&sandbox, &source);
        assert_exit(&run, 3);
        let lines = run.lines();
        // Each reply mails the worker again: the third mail finds it over its budget.
        assert_eq!(
            lines[..2],
            ["reply: one", "reply: one"],
            "{provider}: {lines:?}"
        );
        assert!(
            lines[2].contains("over its budget of 22 tokens per day (42 used)"),
            "{provider}: {lines:?}"
        );
        assert_eq!(
            usage(&sandbox).lines()[1],
            format!(
                "worker    {}     28      14      8      2  2.200000 EUR",
                today()
            ),
            "{provider}"
        );
    }
}

/// A model call a tool makes during a resident's turn (a sub-agent tool's `ai.ask`) is the
/// resident's to pay: its budget and `colony usage` count it. They counted only the resident's
/// own steps, and a tool calling a model spent past the budget unseen.
#[test]
fn a_model_call_a_tool_makes_counts_in_the_residents_budget() {
    let fake = FakeProvider::start();
    fake.set_responder(|body, _| {
        let messages = body["messages"].as_array().cloned().unwrap_or_default();
        let asked = |text: &str| messages.iter().any(|m| m["content"] == text);
        if asked("inner question") {
            Reply::text("inner answer").usage(100, 50)
        } else if messages.iter().any(|m| m["role"] == "tool") {
            Reply::text("one").usage(10, 5)
        } else {
            Reply::tool_call("c1", "sub", serde_json::json!({})).usage(10, 5)
        }
    });
    let sandbox = styled(&fake, "openai");
    let source = r#"
ai.route{ provider = "openai", model = "m" }
local sub = ai.tool{ name = "sub", parameters = {}, handler = function()
  return (ai.ask("inner question", { provider = "openai", model = "m" }))
end }
ai.spawn{ name = "worker", persist_conversation = true, tools = { sub },
  budget = { tokens = 100, per = "day" },
  deliver_to = function(reply, info)
    if info.kind == "blocked" then
      print(("blocked: %s"):format(info.error.message))
    else
      print(info.kind .. ": " .. reply)
      assert(ai.mail{ to = "worker", source = "desk", content = "again", hop = 0 })
    end
  end,
  sources = { function(self)
    if not store.get("mailed") then
      store.set("mailed", true)
      assert(ai.mail{ to = self, source = "desk", content = "first", hop = 0 })
    end
  end } }
print("watch ended: " .. ai.watch())
"#;
    let run = run(&sandbox, source);
    assert_exit(&run, 3);
    let lines = run.lines();
    assert_eq!(lines[0], "reply: one", "{lines:?}");
    // 15 for each of the turn's two steps and 150 for the tool's call.
    assert!(
        lines[1].starts_with("blocked: over its budget of 100 tokens per day (180 used)"),
        "{lines:?}"
    );
    assert_eq!(
        usage(&sandbox).lines()[1],
        format!(
            "worker    {}    120      60      0      1  unpriced (180 tokens)",
            today()
        )
    );
}

/// A turn cut before its end (SIGTERM, and no grace for the tool it is sleeping in)
/// still counts what its model calls spent: its usage was recorded only from the turn's
/// outcome, which a cut turn never has, so `colony usage` showed nothing and a budget
/// undercounted every stopped run.
#[test]
fn a_turn_cut_by_a_stop_counts_what_it_spent() {
    use std::io::BufRead;
    let fake = FakeProvider::start();
    fake.set_default(Reply::tool_call("c1", "nap", serde_json::json!({})).usage(100, 10));
    let sandbox = styled(&fake, "openai");
    let script = sandbox.write(
        "script.lua",
        r#"
ai.route{ provider = "openai", model = "m" }
local nap = ai.tool{ name = "nap", parameters = {}, handler = function()
  print("napping")
  io.stdout:flush()
  ai.sleep(600000)
end }
ai.spawn{ name = "worker", persist_conversation = true, tools = { nap },
  budget = { tokens = 1000, per = "day" },
  sources = { function(self) assert(ai.mail{ to = self, source = "desk", content = "go", hop = 0 }) end } }
ai.watch{ grace_ms = 0 }
"#,
    );
    let state = sandbox.path("state-dir").display().to_string();
    let mut child = sandbox
        .command(&[
            "run",
            "--state",
            &state,
            "--max-time",
            GUARD,
            &script.display().to_string(),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("colony starts");
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    assert_eq!(lines.next().unwrap().unwrap(), "napping");
    support::signal(child.id(), "TERM");
    support::exits_within_a_minute(&mut child, "colony did not end on SIGTERM");
    assert_eq!(
        usage(&sandbox).lines()[1],
        format!(
            "worker    {}    100      10      0      1  unpriced (110 tokens)",
            today()
        )
    );
}

/// A resident's source that asks a model is stopped by the resident's budget, as its turns
/// are: once the budget is spent the next call is not made and answers `nil, err` of kind
/// `budget` (a clock source asking each minute spent without bound: the calls were counted,
/// never refused).
#[test]
fn a_source_over_its_residents_budget_is_not_asked_for_more() {
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("an answer").usage(10, 5));
    let sandbox = styled(&fake, "openai");
    let source = r#"
ai.route{ provider = "openai", model = "m" }
ai.spawn{ name = "watcher", budget = { tokens = 20, per = "day" },
  sources = { function(self)
    for i = 1, 5 do
      local answer, err = ai.ask("question " .. i)
      print(i, answer or (err.kind .. ": " .. err.message))
    end
    ai.stop("asked")
  end } }
print("watch ended: " .. ai.watch())
"#;
    let run = run(&sandbox, source);
    assert_exit(&run, 0);
    let lines = run.lines();
    assert_eq!(lines[0], "1\tan answer", "{lines:?}");
    assert_eq!(lines[1], "2\tan answer", "{lines:?}");
    for line in &lines[2..5] {
        assert!(
            line.contains(
                "budget: watcher is over its budget of 20 tokens per day (30 used); it resets at "
            ),
            "{lines:?}"
        );
    }
    assert_eq!(fake.calls(), 2, "{lines:?}");
    assert_eq!(lines[5], "watch ended: asked", "{lines:?}");
}

#[test]
fn the_programs_budget_counts_every_resident() {
    let fake = FakeProvider::start();
    fake.push(Reply::text("from alice").usage(30, 10));
    fake.set_default(Reply::text("not asked").usage(10, 5));
    let sandbox = styled(&fake, "openai");
    let source = r#"
ai.route{ model = "m", budget = { tokens = 40, per = "hour" } }
local function show(reply, info)
  if info.kind == "blocked" then print(info.ai .. " blocked: " .. info.error.message)
  else print(info.ai .. ": " .. reply); assert(ai.mail{ to = "bob", source = "alice", content = "your turn", hop = 0 }) end
end
ai.spawn{ name = "alice", deliver_to = show,
  sources = { function(self) assert(ai.mail{ to = self, source = "desk", content = "go", hop = 0 }) end } }
ai.spawn{ name = "bob", deliver_to = show }
print("watch ended: " .. ai.watch{})
"#;
    let run = run(&sandbox, source);
    assert_exit(&run, 3);
    let lines = run.lines();
    assert_eq!(lines[0], "alice: from alice");
    assert!(
        lines[1].starts_with(
            "bob blocked: over the program's budget of 40 tokens per hour (40 used); it resets at "
        ),
        "{}",
        run.stdout
    );
    assert_eq!(fake.calls(), 1);
    let shown = usage(&sandbox);
    assert_eq!(
        shown.lines().len(),
        2,
        "only alice used anything:\n{}",
        shown.stdout
    );
}

#[test]
fn a_budget_written_wrong_is_refused_naming_the_field() {
    let sandbox = Sandbox::new();
    let source = r#"
for _, b in ipairs{ 5, { tokens = -1 }, { tokens = 1.5 }, { cost = 0 }, { per = "day" },
                    { tokens = 1, per = "week" }, { tokens = 1, every = "day" } } do
  local ok, e = pcall(ai.spawn, { name = "w", budget = b })
  print(ok, e)
end
"#;
    let run = sandbox.lua(source, &[]).ok();
    let at = sandbox.path("script.lua").display().to_string();
    assert_eq!(
        run.lines(),
        [
            format!(
                "false\t{at}:4: ai.spawn \"w\": budget must be a table {{ tokens = N, cost = X, per = \"day\" }}, not 5"
            ),
            format!(
                "false\t{at}:4: ai.spawn \"w\": budget.tokens must be a whole number above 0, not -1"
            ),
            format!(
                "false\t{at}:4: ai.spawn \"w\": budget.tokens must be a whole number above 0, not 1.5"
            ),
            format!(
                "false\t{at}:4: ai.spawn \"w\": budget.cost must be an amount above 0 (in the price table's currency), not 0"
            ),
            format!("false\t{at}:4: ai.spawn \"w\": budget needs tokens = N, cost = X or both"),
            format!(
                "false\t{at}:4: ai.spawn \"w\": budget: per = \"week\" is not a window: say \"hour\", \"day\" or \"month\""
            ),
            format!(
                "false\t{at}:4: ai.spawn \"w\": budget.every is not a budget field (tokens, cost, per)"
            ),
        ]
    );
}

#[test]
fn a_price_written_wrong_is_refused_naming_the_file_and_field() {
    let sandbox = Sandbox::new();
    // A price so high the cost was infinite (stored as null, the usage then uncounted and a
    // cost budget never reached) is refused as a negative one is.
    for (price, shown) in [("-2", "-2"), ("1e308", "100000000000000000000")] {
        let config = sandbox.write(
            "config.toml",
            &format!("[prices.models.m]\ninput = {price}\noutput = 1\n"),
        );
        let run = sandbox.lua("print('never')", &[]).failed();
        assert!(
            run.stderr.contains(&format!(
                "{}: [prices.models.\"m\"] input = {shown}",
                config.display()
            )) && run
                .stderr
                .contains("is not a price (0 to a billion, per million tokens)"),
            "stderr:\n{}",
            run.stderr
        );
        assert!(!run.stdout.contains("never"));
    }
}

#[test]
fn a_budget_that_cannot_be_counted_blocks_instead_of_never_being_reached() {
    // A cost budget for a model with no price, and a token budget for a server that reports
    // no usage, counted nothing: every turn ran and the budget never blocked.
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("not asked").usage(10, 5));
    let sandbox = styled(&fake, "openai");
    let source = WORKER.replace("BUDGET", "{ cost = 2 }");
    let priced = run(&sandbox, &source);
    assert_exit(&priced, 3);
    assert_eq!(
        priced.lines()[0],
        "blocked: budget: a cost budget cannot be kept: openai/m has no price (add one under \
         [prices] in the config, or give the budget in tokens) (1 held)"
    );
    assert_eq!(fake.calls(), 0, "nothing is spent that cannot be counted");
    // A setting to fix, not a budget spent to wait out.
    assert!(
        priced.stderr.contains("Fix the setting named above")
            && !priced.stderr.contains("A budget is spent"),
        "{}",
        priced.stderr
    );

    let fake = FakeProvider::start();
    fake.push(Reply::text("one").usage(0, 0));
    fake.set_default(Reply::text("not asked").usage(0, 0));
    let sandbox = styled(&fake, "openai");
    let source = WORKER.replace("BUDGET", "{ tokens = 100000 }");
    let run = run(&sandbox, &source);
    assert_exit(&run, 3);
    assert_eq!(run.lines()[0], "reply: one");
    assert_eq!(
        run.lines()[1],
        "blocked: budget: a token budget cannot be kept: openai/m reported no token usage colony \
         could read for the last turn, so what it spends cannot be counted (have its server report usage) (1 \
         held)"
    );
    assert_eq!(fake.calls(), 1);
    // The turn is counted, tokens or not: `colony usage` showed nothing of it. Its cost is
    // not 0 (it read as free) but unknown.
    assert_eq!(
        usage(&sandbox).lines()[1],
        format!(
            "worker    {}      0       0      0      1  no usage reported",
            today()
        )
    );
}
