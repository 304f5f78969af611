//! `ai.tool`, `ai.take_turn` and `ai.run` from Lua, through the binary, against the fake
//! provider in each wire style: multi-step turns, concurrent calls, every failure kind, the step
//! cap, allow / deny / pin, dotted names, compaction.

mod support;

use serde_json::{Value, json};
use support::fake::{FakeProvider, Reply};
use support::script::Sandbox;
use support::{STYLES, model_calls};

/// A sandbox pointed at the fake in `style`, with that style as the `general` provider.
fn sandbox(fake: &FakeProvider, style: &str) -> Sandbox {
    let sb = support::styled(fake, style);
    sb.write(
        "config.toml",
        &format!("[use.general]\nprovider = \"{style}\"\n"),
    );
    sb
}

/// Tools shared by the scripts: `weather.current` (dotted), `slow`, and failing ones.
const TOOLS: &str = r#"
local weather = ai.tool{ name = "weather.current", description = "Weather in a city",
  parameters = { city = "string", days = "integer?" },
  handler = function(args, ctx) return { city = args.city, sky = "clear", step = ctx.step } end }
local raises = ai.tool{ name = "raises", parameters = {}, handler = function() error("it broke") end }
local throws = ai.tool{ name = "throws", parameters = {}, handler = function() error({ code = 7 }) end }
local refuses = ai.tool{ name = "refuses", parameters = {}, handler = function() return nil, "no such file" end }
local slow = ai.tool{ name = "slow", parameters = {}, timeout = 0.05,
  handler = function() ai.sleep(60000) return "late" end }
local function show(r)
  print("reply", r.reply or r.text)
  print("stop", r.stop, "steps", r.steps)
  for _, e in ipairs(r.tool_events or r.tools) do print("event", e.name, e.kind, e.outcome) end
end
"#;

fn script(body: &str) -> String {
    format!("{TOOLS}\n{body}")
}

#[test]
fn a_two_step_turn_in_every_style() {
    for style in STYLES {
        let fake = FakeProvider::start();
        fake.push(
            Reply::tool_call("c1", "weather_current", json!({"city": "Paris"})).usage(100, 20),
        );
        fake.push(Reply::text("Clear in Paris.").usage(150, 10));
        let run = sandbox(&fake, style)
            .lua(
                &script(
                    r#"local r = ai.take_turn{ prompt = "Weather in Paris?", tools = { weather } }
                       show(r)
                       print("usage", r.usage.input, r.usage.output)
                       print("messages", #r.messages, r.messages[2].role, r.messages[2].tool_calls[1].name,
                             r.messages[3].role, r.messages[4].content)
                       -- the transcript goes straight back into another turn
                       local again = ai.take_turn{ messages = r.messages, prompt = "And tomorrow?", tools = { weather } }
                       print("again", again.reply, #again.messages)"#,
                ),
                &[],
            )
            .ok();
        let lines = run.lines();
        assert_eq!(
            lines[0], "reply\tClear in Paris.",
            "{style}: {}",
            run.stdout
        );
        assert_eq!(lines[1], "stop\tend_turn\tsteps\t2", "{style}");
        assert!(
            lines[2].starts_with("event\tweather.current\tok\t{"),
            "{style}: {}",
            lines[2]
        );
        assert_eq!(lines[3], "usage\t250\t30", "{style}");
        assert_eq!(
            lines[4], "messages\t4\tassistant\tweather.current\ttool\tClear in Paris.",
            "{style}"
        );
        // The fake's queue is empty: the second turn fails, and says so, without losing its input.
        assert!(lines[5].starts_with("again\t\t"), "{style}: {}", lines[5]);
    }
}

#[test]
fn calls_of_one_step_run_at_once() {
    for style in STYLES {
        let fake = FakeProvider::start();
        fake.push(Reply::tool_calls(vec![
            ("a", "meet", json!({"me": "a", "other": "b"})),
            ("b", "meet", json!({"me": "b", "other": "a"})),
        ]));
        fake.push(Reply::text("met"));
        // Each call waits until the other has started: run one after the other, the first would
        // wait forever (its bound of 10 s turns that into a failed event, and the test fails).
        let run = sandbox(&fake, style)
            .lua(
                r#"local started = {}
                   local meet = ai.tool{ name = "meet", parameters = { me = "string", other = "string" },
                     handler = function(args)
                       started[args.me] = true
                       local waited = 0
                       while not started[args.other] do
                         ai.sleep(1)
                         waited = waited + 1
                         if waited > 10000 then error("the other call never started") end
                       end
                       return args.me .. " met " .. args.other
                     end }
                   local r = ai.take_turn{ prompt = "meet", tools = { meet } }
                   for _, e in ipairs(r.tool_events) do print(e.kind, e.outcome) end"#,
                &[],
            )
            .ok();
        assert_eq!(run.lines(), ["ok\ta met b", "ok\tb met a"], "{style}");
    }
}

#[test]
fn every_failure_kind_comes_back_as_an_error_result() {
    for style in STYLES {
        let fake = FakeProvider::start();
        fake.push(Reply::tool_calls(vec![
            ("c1", "raises", json!({})),
            ("c2", "throws", json!({})),
            ("c3", "refuses", json!({})),
            ("c4", "slow", json!({})),
            ("c5", "weather_current", json!({"city": 12})),
            ("c6", "nobody_offered_this", json!({})),
        ]));
        fake.push(Reply::text("I could not do it."));
        let run = sandbox(&fake, style)
            .lua(
                &script(
                    r#"local r = ai.take_turn{ prompt = "try", tools = { weather, raises, throws, refuses, slow } }
                       show(r)"#,
                ),
                &[],
            )
            .ok();
        let lines = run.lines();
        assert_eq!(
            lines[0], "reply\tI could not do it.",
            "{style}: {}",
            run.stdout
        );
        assert_eq!(lines[1], "stop\tend_turn\tsteps\t2", "{style}");
        let events: Vec<Vec<&str>> = lines[2..]
            .iter()
            .map(|l| l.splitn(4, '\t').collect())
            .collect();
        let kinds: Vec<(&str, &str)> = events.iter().map(|e| (e[1], e[2])).collect();
        assert_eq!(
            kinds,
            [
                ("raises", "error"),
                ("throws", "thrown"),
                ("refuses", "error"),
                ("slow", "deadline"),
                ("weather.current", "schema"),
                ("nobody_offered_this", "unknown_tool"),
            ],
            "{style}"
        );
        assert!(
            events[0][3].contains("it broke"),
            "{style}: {:?}",
            events[0]
        );
        assert!(
            events[1][3].contains("\"code\":7"),
            "{style}: {:?}",
            events[1]
        );
        assert_eq!(events[2][3], "no such file", "{style}");
        assert!(events[4][3].contains("/city"), "{style}: {:?}", events[4]);
        assert!(
            events[5][3].contains("weather.current"),
            "{style}: {:?}",
            events[5]
        );
        // The model got one error result per call.
        let second = &model_calls(&fake)[1];
        let text = second.to_string();
        for needle in ["it broke", "no such file", "deadline", "unknown tool"] {
            assert!(
                text.contains(needle),
                "{style}: {needle} missing from {text}"
            );
        }
        match style {
            "anthropic" => {
                let results = second["messages"][2]["content"].as_array().unwrap();
                assert_eq!(results.len(), 6);
                assert!(results.iter().all(|r| r["is_error"] == true), "{style}");
            }
            "openai" => {
                let tool_messages: Vec<&Value> = second["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter(|m| m["role"] == "tool")
                    .collect();
                assert_eq!(tool_messages.len(), 6);
            }
            _ => {
                let parts = second["contents"][2]["parts"].as_array().unwrap();
                assert_eq!(parts.len(), 6);
                assert!(
                    parts
                        .iter()
                        .all(|p| p["functionResponse"]["response"].get("error").is_some())
                );
            }
        }
    }
}

/// A handler that returns `json.null` sends JSON's null (it was "the handler returned a
/// lightuserdata"), and one that refuses with an error table of a `kind` alone says its kind
/// (it was "(error table without a message)").
#[test]
fn a_handler_may_return_json_null_or_refuse_with_a_kind() {
    let fake = FakeProvider::start();
    fake.push(Reply::tool_calls(vec![
        ("c1", "nothing", json!({})),
        ("c2", "missing", json!({})),
    ]));
    fake.push(Reply::text("done"));
    let run = sandbox(&fake, "openai")
        .lua(
            &script(
                r#"local nothing = ai.tool{ name = "nothing", parameters = {}, handler = function() return json.null end }
                   local missing = ai.tool{ name = "missing", parameters = {}, handler = function() return nil, { kind = "not_found" } end }
                   show(ai.take_turn{ prompt = "try", tools = { nothing, missing } })"#,
            ),
            &[],
        )
        .ok();
    assert_eq!(
        run.lines()[2..],
        [
            "event\tnothing\tok\tnull",
            "event\tmissing\terror\tnot_found"
        ],
        "{}",
        run.stdout
    );
}

#[test]
fn arguments_that_are_not_json() {
    // Gemini carries arguments as an object, so only the text-carrying styles can break them.
    for style in ["openai", "anthropic"] {
        let fake = FakeProvider::start();
        fake.push(Reply::tool_call_raw(
            "c1",
            "weather_current",
            "{\"city\": \"Par",
        ));
        fake.push(Reply::text("Sorry."));
        let run = sandbox(&fake, style)
            .lua(
                &script(r#"show(ai.take_turn{ prompt = "w", tools = { weather }, stream = function() end })"#),
                &[],
            )
            .ok();
        let event = run.lines()[2];
        assert!(
            event.starts_with(
                "event\tweather.current\tbad_arguments\tthe arguments are not valid JSON"
            ),
            "{style}: {event}"
        );
    }
}

#[test]
fn the_step_cap_answers_every_call() {
    for style in STYLES {
        let fake = FakeProvider::start();
        fake.push(Reply::tool_call(
            "c1",
            "weather_current",
            json!({"city": "A"}),
        ));
        fake.push(
            Reply::tool_call("c2", "weather_current", json!({"city": "B"}))
                .with_text("Still looking."),
        );
        let run = sandbox(&fake, style)
            .lua(
                &script(
                    r#"local r = ai.take_turn{ prompt = "w", tools = { weather }, max_steps = 2 }
                       show(r)
                       local last = r.messages[#r.messages]
                       print("last", last.role, last.tool_call_id, last.is_error, last.content)"#,
                ),
                &[],
            )
            .ok();
        let lines = run.lines();
        assert_eq!(lines[0], "reply\tStill looking.", "{style}: {}", run.stdout);
        assert_eq!(lines[1], "stop\tmax_steps\tsteps\t2", "{style}");
        // The call left unanswered is an event of its own.
        assert_eq!(
            lines[3],
            "event\tweather.current\tnot_run\tnot run: the tool budget of this turn was exhausted before this call could run",
            "{style}"
        );
        assert!(
            lines[4].starts_with("last\ttool\tc2\ttrue\tnot run: the tool budget"),
            "{style}: {}",
            lines[4]
        );
        let last = &model_calls(&fake)[1];
        let text = last.to_string();
        assert!(
            text.contains("tool budget of this turn is exhausted"),
            "{style}: the note is sent"
        );
        match style {
            "anthropic" => assert_eq!(last["tool_choice"], json!({"type": "none"})),
            "openai" => assert_eq!(last["tool_choice"], "none"),
            _ => assert_eq!(last["toolConfig"]["functionCallingConfig"]["mode"], "NONE"),
        }
    }
}

#[test]
fn allow_deny_and_pin() {
    for style in STYLES {
        let fake = FakeProvider::start();
        fake.push(Reply::tool_call(
            "c1",
            "notes_read",
            json!({"session_id": "evil", "path": "a"}),
        ));
        fake.push(Reply::text("done"));
        fake.push(Reply::text("done again"));
        let run = sandbox(&fake, style)
            .lua(
                r#"local read = ai.tool{ name = "notes.read", parameters = { session_id = "string", path = "string" },
                     handler = function(args) return "read " .. args.path .. " in " .. args.session_id end }
                   local write = ai.tool{ name = "notes.write", parameters = { path = "string" }, handler = function() return "w" end }
                   local mail = ai.tool{ name = "mail.send", parameters = {}, handler = function() return "m" end }
                   local r = ai.take_turn{ prompt = "read", tools = { read, write, mail },
                     allow = { "notes.*" }, deny = { "notes.write" }, pin = { session_id = "s1" } }
                   for _, e in ipairs(r.tool_events) do print(e.kind, e.outcome) end
                   r = ai.take_turn{ prompt = "x", tools = { read, write, mail }, deny = "notes.*" }
                   print(r.reply)"#,
                &[],
            )
            .ok();
        assert_eq!(run.lines(), ["ok\tread a in s1", "done again"], "{style}");
        let calls = model_calls(&fake);
        let offered = |body: &Value| -> Vec<String> {
            let list = match style {
                "anthropic" => body["tools"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t["name"].clone())
                    .collect::<Vec<_>>(),
                "openai" => body["tools"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t["function"]["name"].clone())
                    .collect(),
                _ => body["tools"][0]["functionDeclarations"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|t| t["name"].clone())
                    .collect(),
            };
            list.into_iter()
                .map(|v| v.as_str().unwrap().to_string())
                .collect()
        };
        assert_eq!(offered(&calls[0]), ["notes_read"], "{style}");
        assert_eq!(offered(&calls[2]), ["mail_send"], "{style}");
    }
}

#[test]
fn on_step_and_streaming_in_a_turn() {
    let fake = FakeProvider::start();
    fake.push(Reply::tool_call(
        "c1",
        "weather_current",
        json!({"city": "Oslo"}),
    ));
    fake.push(Reply::text("Cold in Oslo."));
    let run = sandbox(&fake, "openai")
        .lua(
            &script(
                r#"local deltas = {}
                   local r = ai.take_turn{ prompt = "w", tools = { weather },
                     stream = function(d) deltas[#deltas + 1] = d end,
                     on_step = function(s) print("step", s.step, #s.calls, #s.results, s.usage.input, s.text) end }
                   print("streamed", table.concat(deltas), #deltas > 1)"#,
            ),
            &[],
        )
        .ok();
    assert_eq!(
        run.lines(),
        [
            "step\t1\t1\t1\t10\t",
            "step\t2\t0\t0\t10\tCold in Oslo.",
            "streamed\tCold in Oslo.\ttrue"
        ]
    );
}

#[test]
fn on_tool_hears_each_call_as_it_ends_before_the_step_report() {
    let fake = FakeProvider::start();
    fake.push(Reply::tool_calls(vec![
        ("c1", "weather_current", json!({"city": "Oslo"})),
        ("c2", "refuses", json!({})),
    ]));
    fake.push(Reply::text("Done."));
    let run = sandbox(&fake, "anthropic")
        .lua(
            &script(
                r#"local r = ai.take_turn{ prompt = "w", tools = { weather, refuses },
                     on_tool = function(e) print("tool", e.step, e.call_id, e.name, e.arguments, e.ok, e.kind, e.outcome) end,
                     on_step = function(s) print("step", s.step) end }"#,
            ),
            &[],
        )
        .ok();
    let mut lines = run.lines();
    // The two calls run at once: either may end first.
    lines[..2].sort();
    assert_eq!(
        lines,
        [
            "tool\t1\tc1\tweather.current\t{\"city\":\"Oslo\"}\ttrue\tok\t{\"city\":\"Oslo\",\"sky\":\"clear\",\"step\":1}",
            "tool\t1\tc2\trefuses\t{}\tfalse\terror\tno such file",
            "step\t1",
            "step\t2",
        ]
    );
}

#[test]
fn ai_run_returns_text_and_tools() {
    let fake = FakeProvider::start();
    fake.push(Reply::tool_call(
        "c1",
        "weather_current",
        json!({"city": "Rome"}),
    ));
    fake.push(Reply::text("Sunny in Rome."));
    let run = sandbox(&fake, "gemini")
        .lua(
            &script(
                r#"local r = ai.run{ prompt = "Rome?", system = "Be brief.", tools = { weather } }
                   print(r.text, r.stop, r.steps, #r.tools, r.tools[1].name, r.compactions, r.error)"#,
            ),
            &[],
        )
        .ok();
    assert_eq!(
        run.stdout.trim(),
        "Sunny in Rome.\tend_turn\t2\t1\tweather.current\t0\tnil"
    );
    assert_eq!(
        model_calls(&fake)[0]["systemInstruction"],
        json!({"parts": [{"text": "Be brief."}]})
    );
}

#[test]
fn a_provider_failure_ends_the_turn_with_its_error() {
    let fake = FakeProvider::start();
    fake.push(Reply::tool_call(
        "c1",
        "weather_current",
        json!({"city": "Rome"}),
    ));
    fake.push(Reply::status(401));
    let run = sandbox(&fake, "anthropic")
        .lua(
            &script(
                r#"local r = ai.take_turn{ prompt = "Rome?", tools = { weather } }
                   print(r.stop, r.steps, r.error.kind, #r.messages, r.messages[#r.messages].role)"#,
            ),
            &[],
        )
        .ok();
    assert_eq!(run.stdout.trim(), "error\t1\tauth_error\t3\ttool");
}

#[test]
fn compaction_summarises_and_keeps_the_last_round() {
    for style in STYLES {
        let fake = FakeProvider::start();
        // Step 1 reports 900 tokens of a 1000-token window: the next request must compact.
        fake.push(
            Reply::tool_call("c1", "weather_current", json!({"city": "Paris"})).usage(880, 20),
        );
        fake.push(Reply::text(
            "SUMMARY: asked for Paris weather; tool said clear.",
        ));
        fake.push(Reply::text("Clear in Paris."));
        let run = sandbox(&fake, style)
            .lua(
                &script(
                    r#"local r = ai.take_turn{ prompt = "Weather in Paris?", tools = { weather },
                         context_window = 1000, compact_at = 0.8 }
                       print(r.reply, r.steps, r.compactions, #r.messages)
                       print(r.messages[1].content)
                       print(r.messages[2].role, r.messages[2].tool_calls[1].id, r.messages[3].role, r.messages[3].tool_call_id)
                       print(r.usage.input)"#,
                ),
                &[],
            )
            .ok();
        let lines = run.lines();
        assert_eq!(
            lines[0], "Clear in Paris.\t2\t1\t4",
            "{style}: {}",
            run.stdout
        );
        assert!(
            lines[1].starts_with(
                "This session continues an earlier conversation that was compacted to save context."
            ),
            "{style}"
        );
        assert!(
            run.stdout.contains("SUMMARY: asked for Paris weather"),
            "{style}"
        );
        assert!(
            run.stdout
                .contains("The user's latest request: Weather in Paris?"),
            "{style}"
        );
        // 880 (step 1) + 10 (the summary) + 10 (step 2)
        assert_eq!(
            lines.last().unwrap(),
            &"900",
            "{style}: usage counts the summary request too"
        );
        let calls = model_calls(&fake);
        assert_eq!(calls.len(), 3);
        let summary_request = calls[1].to_string();
        assert!(
            summary_request.contains("Summarise this conversation"),
            "{style}"
        );
        let after = calls[2].to_string();
        assert!(after.contains("This session continues"), "{style}");
        assert!(!after.contains("Summarise this conversation"), "{style}");
    }
}

#[test]
fn a_provider_that_under_reports_still_gets_a_compacted_conversation() {
    // Every answer says prompt_tokens = 11, as some OpenAI-compatible servers do. Each tool
    // result is 1,500 bytes against a 1,000-token window compacted at 0.8: colony's own estimate
    // (3 bytes a token) passes 800 tokens after the second result, so the third request must be
    // the summary, whatever the provider counted.
    for style in STYLES {
        let fake = FakeProvider::start();
        fake.set_responder(|body, _| {
            let text = body.to_string();
            if text.contains("Summarise this conversation") {
                Reply::text("SUMMARY: two pages read.").usage(11, 5)
            } else if text.contains("SUMMARY: two pages read.") {
                Reply::text("Done reading.").usage(11, 3)
            } else {
                let n = text.matches("lorem ipsum").count() / 125;
                Reply::tool_call(format!("c{n}"), "page", json!({})).usage(11, 1)
            }
        });
        let run = sandbox(&fake, style)
            .lua(
                r#"local page = ai.tool{ name = "page", parameters = {},
                     handler = function() return string.rep("lorem ipsum ", 125) end }
                   local r = ai.take_turn{ prompt = "Read the pages", tools = { page },
                     context_window = 1000, compact_at = 0.8, max_steps = 10 }
                   print(r.reply, r.compactions, r.usage.input)"#,
                &[],
            )
            .ok();
        assert_eq!(run.stdout, "Done reading.\t1\t44\n", "{style}");
        let calls = model_calls(&fake);
        assert_eq!(
            calls.len(),
            4,
            "{style}: two pages, the summary, the answer"
        );
        let summary_request = calls[2].to_string();
        assert!(
            summary_request.contains("Summarise this conversation"),
            "{style}"
        );
        assert_eq!(
            summary_request.matches("lorem ipsum").count(),
            250,
            "{style}: the summary request carries both pages"
        );
        let after = calls[3].to_string();
        assert!(after.contains("SUMMARY: two pages read."), "{style}");
        assert_eq!(
            after.matches("lorem ipsum").count(),
            125,
            "{style}: after the summary only the last round's page is sent"
        );
    }
}

#[test]
fn a_failing_summary_ends_the_turn() {
    let fake = FakeProvider::start();
    fake.push(Reply::tool_call("c1", "weather_current", json!({"city": "Paris"})).usage(990, 5));
    fake.push(Reply::status(400));
    let run = sandbox(&fake, "openai")
        .lua(
            &script(
                r#"local r = ai.take_turn{ prompt = "w", tools = { weather }, context_window = 1000 }
                   print(r.stop, r.error.kind, r.error.message:sub(1, 18))"#,
            ),
            &[],
        )
        .ok();
    assert_eq!(run.stdout.trim(), "error\tapi_error\tcompaction failed:");
}

/// A model that answers the summary request with a tool call (a server that ignores
/// `tool_choice: none`) or with nothing gave no summary: the turn goes on with its whole
/// transcript, said in the log, and is not asked for a summary again. It ended the turn as a
/// parse error ("the summary came back empty"), which blocked a resident for good.
#[test]
fn a_summary_answered_with_a_tool_call_leaves_the_turn_uncompacted() {
    let fake = FakeProvider::start();
    fake.push(Reply::tool_call("c1", "weather_current", json!({"city": "Paris"})).usage(990, 5));
    // The summary request, answered with a call.
    fake.push(Reply::tool_call("c2", "weather_current", json!({"city": "Rome"})).usage(990, 5));
    fake.push(Reply::tool_call("c3", "weather_current", json!({"city": "Oslo"})).usage(990, 5));
    fake.push(Reply::text("Sunny in Paris and Oslo.").usage(990, 5));
    let run = sandbox(&fake, "openai")
        .lua(
            &script(
                r#"local r = ai.take_turn{ prompt = "w", tools = { weather }, context_window = 1000 }
                   print(r.stop, r.reply, r.compactions, r.error)"#,
            ),
            &[],
        )
        .ok();
    assert_eq!(
        run.stdout.trim(),
        "end_turn\tSunny in Paris and Oslo.\t0\tnil"
    );
    assert!(
        run.stderr.contains(
            "compaction: the model answered the summary request with a tool call \
             (weather.current) though none was allowed: this turn goes on with the whole \
             transcript"
        ),
        "{}",
        run.stderr
    );
    let calls = model_calls(&fake);
    assert_eq!(calls.len(), 4, "two steps, the summary once, the answer");
    let summaries = calls
        .iter()
        .filter(|c| c.to_string().contains("Summarise this conversation"))
        .count();
    assert_eq!(summaries, 1);
}

#[test]
fn bad_tool_definitions_are_named() {
    let run = Sandbox::new()
        .lua(
            "ai.tool{ name = 'x', parameters = { city = 'text' }, handler = print }",
            &[],
        )
        .failed();
    assert!(
        run.stderr
            .contains("script.lua:1: ai.tool: tool x: parameters: city: unknown type \"text\""),
        "{}",
        run.stderr
    );
    let run = Sandbox::new()
        .lua("ai.tool{ name = 'x', handlr = print }", &[])
        .failed();
    assert!(
        run.stderr.contains("unknown field \"handlr\""),
        "{}",
        run.stderr
    );
    let run = Sandbox::new()
        .lua("ai.take_turn{ prompt = 'x', max_stpes = 3 }", &[])
        .failed();
    assert!(
        run.stderr.contains("unknown option \"max_stpes\""),
        "{}",
        run.stderr
    );
}

/// A field a tool does not have, read by a script, names the line and what there is to read
/// (it was mlua's "attempt to get an unknown field 'nme'", with no line at all under `pcall`).
#[test]
fn a_field_a_tool_does_not_have_names_the_line() {
    let run = Sandbox::new()
        .lua(
            "local t = ai.tool{ name = 'x', description = 'd', handler = print }
print(t.name, pcall(function() return t.nme end))
local h = t.handler",
            &[],
        )
        .failed();
    let fields = "(fields: name, description, parameters, timeout, exportable, idempotent)";
    assert!(
        run.stdout.starts_with("x\tfalse\t/")
            && run.stdout.ends_with(&format!(
                "script.lua:2: a tool has no field \"nme\" {fields}\n"
            )),
        "{}",
        run.stdout
    );
    assert!(
        run.stderr.contains(&format!(
            "script.lua:3: a tool has no field \"handler\" {fields}"
        )),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("__mlua"), "{}", run.stderr);
}

/// A tool given inline as a table is checked as `ai.tool` checks one: a misspelt `idempotent`
/// or `timeout` was taken without a word (a restart then answered the call "interrupted" where
/// it would have run it again).
#[test]
fn an_inline_tool_with_an_unknown_field_is_named() {
    let tool = "{ name = 'x', description = 'd', handler = print, idempotnet = true }";
    for (call, who) in [
        (
            format!("ai.spawn{{ name = 'w', tools = {{ {tool} }} }}"),
            "ai.spawn \"w\"",
        ),
        (
            format!("ai.take_turn{{ prompt = 'hi', tools = {{ {tool} }} }}"),
            "ai.take_turn",
        ),
    ] {
        let run = Sandbox::new().lua(&call, &[]).failed();
        assert!(
            run.stderr.contains(&format!(
                "script.lua:1: {who}: tools[1]: unknown field \"idempotnet\" (fields: name, \
                 description, parameters, handler, timeout, exportable, idempotent, rate)"
            )),
            "{}",
            run.stderr
        );
    }
}

/// Two tools of one name in a turn or a resident are refused, naming both: both were offered,
/// and the first answered every call.
#[test]
fn two_tools_of_one_name_are_refused() {
    let tool = "ai.tool{ name = 'probe', description = 'p', handler = function() return 'x' end }";
    for (call, who) in [
        ("ai.run{ prompt = 'x', tools = { a, b } }", "ai.run"),
        ("ai.spawn{ name = 'w', tools = { a, b } }", "ai.spawn \"w\""),
    ] {
        let source = format!("local a = {tool}\nlocal b = {tool}\n{call}\n");
        let run = Sandbox::new().lua(&source, &[]).failed();
        assert!(
            run.stderr.contains(&format!(
                "script.lua:3: {who}: tools[1] and tools[2] are both named \"probe\""
            )),
            "{}",
            run.stderr
        );
    }
}

/// Counts are whole numbers of 1 or more. `max_steps = -5` used to run one step and
/// `max_tokens = 1e30` to send 4294967295, both without a word; a resident's `mailbox = 2.5`
/// was taken as 2.
#[test]
fn counts_that_are_not_whole_and_positive_are_named() {
    let cases = [
        (
            "ai.run{ prompt = 'x', max_steps = -5 }",
            "script.lua:1: ai.run: max_steps must be a whole number from 1 to 4294967295, not -5",
        ),
        (
            "ai.run{ prompt = 'x', max_steps = 0 }",
            "ai.run: max_steps must be a whole number from 1 to 4294967295, not 0",
        ),
        (
            "ai.ask('x', { max_tokens = 1e30 })",
            "ai.ask: max_tokens must be a whole number from 1 to 4294967295, not 1e30",
        ),
        (
            "ai.ask('x', { max_tokens = 0/0 })",
            "ai.ask: max_tokens must be a whole number from 1 to 4294967295, not nan",
        ),
        (
            "ai.spawn{ name = 'a', mailbox = 2.5 }",
            "ai.spawn \"a\": mailbox must be a whole number from 1 to 4294967295, not 2.5",
        ),
        // max_hop = 1.5 was 1, and math.huge lifted the relay loop's guard; so max_restarts.
        (
            "ai.spawn{ name = 'a', max_hop = math.huge }",
            "ai.spawn \"a\": max_hop must be a whole number from 0 to 4294967295, not inf",
        ),
        (
            "ai.spawn{ name = 'a', max_restarts = 1.5 }",
            "ai.spawn \"a\": max_restarts must be a whole number from 0 to 4294967295, not 1.5",
        ),
        (
            "ai.spawn{ name = 'a', restart_window_ms = 0 }",
            "ai.spawn \"a\": restart_window_ms must be more than 0, not 0",
        ),
        // A temperature follows the config file's rule: a finite number from 0.
        (
            "ai.ask('x', { temperature = 0/0 })",
            "script.lua:1: ai.ask: temperature must be a number from 0 (0 to 1 for Anthropic, 0 to 2 \
             for OpenAI and Gemini), not nan",
        ),
        (
            "ai.run{ prompt = 'x', temperature = -1 }",
            "ai.run: temperature must be a number from 0 (0 to 1 for Anthropic, 0 to 2 for OpenAI \
             and Gemini), not -1",
        ),
        (
            "ai.take_turn{ prompt = 'x', context_window = 0/0 }",
            "ai.take_turn: context_window must be a whole number of tokens from 1, not nan",
        ),
        (
            "ai.take_turn{ prompt = 'x', context_window = 'abc' }",
            "ai.take_turn: context_window must be a number of tokens, not string",
        ),
        // attempts = 2.5 was 2, 0 was 1, and math.huge retried for ever.
        (
            "ai.with_retries{ attempts = math.huge }",
            "ai.with_retries: attempts must be a whole number from 1 to 4294967295, not inf",
        ),
        (
            "ai.with_breaker{ threshold = '3' }",
            "ai.with_breaker: threshold must be a whole number from 1, not a string",
        ),
        (
            "ai.with_breaker{ first_probe_ms = 1000, max_probe_ms = 10 }",
            "ai.with_breaker: first_probe_ms (1000 ms) is longer than max_probe_ms (10 ms)",
        ),
    ];
    for (source, expected) in cases {
        let run = Sandbox::new().lua(source, &[]).failed();
        assert!(run.stderr.contains(expected), "{source}\n{}", run.stderr);
    }
}

/// Writes `examples/tools.jsonl` afresh: the tools example recorded against the fake provider
/// with scripted replies (a synthetic cassette). Run it after changing the example:
/// `cargo test --test turn -- --ignored regenerate_tools_cassette`.
#[test]
#[ignore = "writes examples/tools.jsonl; run by hand"]
fn regenerate_tools_cassette() {
    let fake = FakeProvider::start();
    fake.push(
        Reply::tool_calls(vec![
            (
                "toolu_01",
                "weather_forecast",
                json!({"city": "Lyon", "days_ahead": 2}),
            ),
            (
                "toolu_02",
                "picnic_packing_list",
                json!({"city": "Lyon", "days_ahead": 2, "people": 4}),
            ),
        ])
        .with_text("I'll check the forecast and the packing list.")
        .usage(412, 96),
    );
    fake.push(
        Reply::text(
            "Saturday in Lyon looks sunny at 19 °C, good picnic weather. Pack a blanket, 8 sandwiches, water and sun cream for the four of you.",
        )
        .usage(590, 41),
    );
    let cassette = support::script::project_root().join("examples/tools.jsonl");
    sandbox(&fake, "anthropic")
        .colony(&[
            "run",
            "--record",
            &cassette.display().to_string(),
            "examples/tools.lua",
        ])
        .ok();
}

#[test]
fn the_tools_example_runs_offline() {
    let run = Sandbox::new()
        .colony(&[
            "run",
            "--replay",
            "examples/tools.jsonl",
            "examples/tools.lua",
        ])
        .ok();
    let lines = run.lines();
    assert_eq!(lines.len(), 4, "{}", run.stdout);
    assert!(
        lines[0].starts_with("tool weather.forecast: ok ({"),
        "{}",
        lines[0]
    );
    assert!(lines[1].starts_with("tool picnic.packing_list: ok ({\"items\":[\"blanket\",\"8 sandwiches\",\"water\",\"sun cream\"]}"), "{}", lines[1]);
    assert!(lines[2].contains("Lyon"), "{}", lines[2]);
    assert_eq!(lines[3], "stop=end_turn steps=2 tokens in=1002 out=137");
}

#[test]
fn a_tool_can_call_another_tool() {
    let fake = FakeProvider::start();
    fake.push(Reply::tool_call("c1", "outer", json!({"city": "Oslo"})));
    fake.push(Reply::text("ok"));
    let sb = sandbox(&fake, "openai");
    let at = sb.path("script.lua").display().to_string();
    let run = sb
        .lua(
            &script(
                r#"local outer = ai.tool{ name = "outer", parameters = { city = "string" },
                     handler = function(args) local w = weather({ city = args.city }) return "outer saw " .. w.sky end }
                   local r = ai.take_turn{ prompt = "x", tools = { outer } }
                   print(r.tool_events[1].outcome)
                   print(pcall(weather, { city = 3 }))"#,
            ),
            &[],
        )
        .ok();
    let lines = run.lines();
    assert_eq!(lines[0], "outer saw clear");
    assert!(
        lines[1].starts_with(&format!(
            "false\t{at}:20: weather.current: arguments do not match the schema: /city"
        )),
        "{}",
        lines[1]
    );
}

/// A turn's error and a structured call's carry what `ai.ask`'s does and the type file promises
/// every `ai.Error`: `transient`, `status`, `retry_after`. They had only kind and message, so a
/// script that tried again on `err.transient`, as README shows, never did.
#[test]
fn a_turns_error_says_whether_it_is_worth_trying_again() {
    let fake = FakeProvider::start();
    fake.push(Reply::status(429).header("retry-after", "7"));
    fake.push(Reply::status(503));
    fake.push(Reply::status(401));
    let run = sandbox(&fake, "openai")
        .lua(
            r#"local function show(e) print(e.kind, e.transient, e.status, e.retry_after) end
               show(ai.take_turn{ prompt = "x" }.error)
               show(select(2, ai.infer_structured{ schema = { type = "object" }, prompt = "y" }))
               show(ai.run{ prompt = "z" }.error)
               show(select(2, ai.infer_structured{ schema = { type = "strnig" }, prompt = "w" }))"#,
            &[],
        )
        .ok();
    assert_eq!(
        run.lines(),
        [
            "provider_error	true	429	7.0",
            "provider_error	true	503	nil",
            "auth_error	false	401	nil",
            "schema	false	nil	nil",
        ],
        "{}",
        run.stderr
    );
}

#[test]
fn structured_output_from_lua() {
    let fake = FakeProvider::start();
    fake.push(Reply::text("{\"name\": \"Ada\", \"born\": \"1815\"}"));
    fake.push(Reply::text(
        "```json\n{\"name\": \"Ada\", \"born\": 1815}\n```",
    ));
    fake.push(Reply::text("not json"));
    fake.push(Reply::text("still not json"));
    let run = sandbox(&fake, "gemini")
        .lua(
            r#"local schema = { type = "object", properties = { name = { type = "string" }, born = { type = "integer" } },
                                required = { "name", "born" } }
               local opts = { schema = schema, prompt = "Who wrote the first program?" }
               local v, err = ai.infer_structured(opts)
               print(v.name, v.born, math.type(v.born), err, opts.prompt)
               v, err = ai.infer_structured{ schema = schema, prompt = "again" }
               print(v, err.kind)
               v, err = ai.infer_structured{ schema = { type = "strnig" }, prompt = "x" }
               print(v, err.kind)"#,
            &[],
        )
        .ok();
    assert_eq!(
        run.lines(),
        [
            "Ada\t1815\tinteger\tnil\tWho wrote the first program?",
            "nil\tinvalid_output",
            "nil\tschema"
        ]
    );
    let second = &model_calls(&fake)[1];
    assert!(
        second.to_string().contains("/born"),
        "the correction names the field"
    );
    assert_eq!(model_calls(&fake).len(), 4, "a bad schema makes no call");
}

/// `middleware = {...}` on a script's own turns: a 529 is retried by `ai.with_retries` and the
/// turn ends with the answer, for `ai.take_turn` and `ai.run` alike.
#[test]
fn a_scripts_own_turn_takes_middleware() {
    let fake = FakeProvider::start();
    fake.push(Reply::status(529));
    fake.push(Reply::text("first"));
    fake.push(Reply::status(529));
    fake.push(Reply::text("second"));
    let sb = sandbox(&fake, "anthropic");
    let at = sb.path("script.lua").display().to_string();
    let run = sb
        .lua(
            r#"local retries = ai.with_retries{ attempts = 3, base_ms = 1, cap_ms = 5 }
               local r = ai.take_turn{ prompt = "one", middleware = { retries } }
               print(r.reply, r.stop, r.error and r.error.kind or "-")
               local r2 = ai.run{ prompt = "two", middleware = { retries, ai.with_breaker{ threshold = 5 } } }
               print(r2.text, r2.stop)
               local ok, e = pcall(ai.take_turn, { prompt = "x", middleware = { "retries" } })
               print(ok, e)"#,
            &[],
        )
        .ok();
    assert_eq!(
        run.lines(),
        [
            "first\tend_turn\t-",
            "second\tend_turn",
            &format!(
                "false\t{at}:6: ai.take_turn: middleware[1] is not an ai.with_retries, ai.with_breaker or ai.with_context value"
            ),
        ],
        "{}",
        run.stderr
    );
    assert_eq!(model_calls(&fake).len(), 4);
    // A retry's wait is said (a program waiting a minute in silence looked hung), once for
    // the two retries: within a period, the second goes unsaid.
    assert_eq!(
        run.stderr.matches("a model call failed (").count(),
        1,
        "{}",
        run.stderr
    );
    assert!(
        run.stderr.contains("529") && run.stderr.contains("attempt 2 of 3"),
        "{}",
        run.stderr
    );
}

/// A breaker on a script's own turns counts failed steps from one turn to the next: each turn
/// builds its stack anew from the state the program's store keeps, and the count was saved only
/// when the breaker opened or closed, so turns that each failed once never opened one with a
/// threshold of 2, and every one of them reached the provider.
#[test]
fn a_breaker_on_a_scripts_turns_counts_failures_across_turns() {
    let fake = FakeProvider::start();
    // Two failures open it; the first probe goes at once and fails too.
    for _ in 0..3 {
        fake.push(Reply::status(500));
    }
    fake.set_default(Reply::text("not asked"));
    let sb = sandbox(&fake, "openai");
    let state = sb.path("state").display().to_string();
    let run = sb
        .lua(
            r#"local br = ai.with_breaker{ threshold = 2, first_probe_ms = 60000 }
               for i = 1, 4 do
                 local t = ai.take_turn{ prompt = "turn " .. i, middleware = { br } }
                 print(i, t.stop, t.error and t.error.message:match("^[^(]*"))
               end"#,
            &["--state", &state],
        )
        .ok();
    let lines = run.lines();
    assert_eq!(lines.len(), 4, "{}", run.stderr);
    assert!(
        lines[3].starts_with("4\terror\tprovider error: circuit open"),
        "{lines:?}"
    );
    assert_eq!(
        model_calls(&fake).len(),
        3,
        "the fourth turn reached no model"
    );
}

/// `tools = "none"` on a use-type: a call without tools goes as usual and sends no tool
/// definitions; a call that offers tools fails saying why, and nothing is sent.
#[test]
fn a_use_type_with_tools_none_sends_no_tools() {
    let fake = FakeProvider::start();
    fake.push(Reply::text("plain"));
    let sb = support::styled(&fake, "openai");
    sb.write(
        "config.toml",
        "[use.general]\nprovider = \"openai\"\ntools = \"none\"\n",
    );
    let run = sb
        .lua(
            &script(
                r#"print(ai.ask("hi"))
                   local r, err = ai.ask("weather?", { tools = { weather } })
                   print(r, err.kind, err.message)
                   local t = ai.take_turn{ prompt = "weather?", tools = { weather } }
                   print(t.stop, t.error.kind)"#,
            ),
            &[],
        )
        .ok();
    let lines = run.lines();
    assert_eq!(lines[0], "plain", "{}", run.stderr);
    assert_eq!(
        lines[1],
        "nil\tconfig_error\tuse-type \"general\" has tools = \"none\" (its model takes no tools), \
         but this call offers weather.current: leave the tools out, or set tools to native or text"
    );
    assert_eq!(lines[2], "error\tconfig_error");
    let calls = model_calls(&fake);
    assert_eq!(calls.len(), 1, "only the call without tools went out");
    assert!(calls[0].get("tools").is_none(), "{}", calls[0]);
}

#[test]
fn absurd_token_counts_from_a_provider_are_capped_not_overflowed() {
    // 2^64 - 1 tokens a step: summing two steps overflowed (a panic in a debug build, a
    // wrapped total and a budget passed in a release one).
    let fake = FakeProvider::start();
    for style in STYLES {
        fake.push(
            Reply::tool_calls(vec![("c1", "weather.current", json!({"city": "Oslo"}))])
                .usage(u64::MAX, u64::MAX),
        );
        fake.push(Reply::text("done").usage(u64::MAX, u64::MAX));
        let run = sandbox(&fake, style)
            .lua(
                &script(
                    // No compaction between the steps: the counts would call for one.
                    r#"local r = ai.take_turn{ prompt = "go", tools = { weather },
                         compact = "off" }
                       print(r.reply, r.usage.input, r.usage.output)"#,
                ),
                &[],
            )
            .ok();
        // Each step's count is believed up to 2^40 (far past any model's window).
        assert_eq!(
            run.lines(),
            ["done\t2199023255552\t2199023255552"],
            "{style}"
        );
    }
}

/// An answer that says the model failed (Gemini's `MALFORMED_FUNCTION_CALL`) is a transient
/// `provider_error` carrying its message, to `ai.ask` and to a turn, never the reply: the
/// botched call's text came back as what the model said (`stop = "error"`, no error).
#[test]
fn an_answer_that_says_the_model_failed_is_an_error_not_a_reply() {
    let fake = FakeProvider::start();
    for _ in 0..2 {
        fake.push(Reply::text("").stop("MALFORMED_FUNCTION_CALL"));
    }
    fake.push(Reply::text("hello from fake").stop("OTHER"));
    let run = sandbox(&fake, "gemini")
        .lua(
            r#"local r, e = ai.ask("hi")
               print(r, e.kind, e.transient, e.message)
               local t = ai.take_turn{ prompt = "hi" }
               print(t.reply, t.stop, t.error.kind, t.error.transient, #t.messages)
               print(select(2, ai.ask("hi")).message)"#,
            &[],
        )
        .ok();
    let message = "provider error: the model's answer failed: MALFORMED_FUNCTION_CALL";
    assert_eq!(
        run.lines(),
        [
            format!("nil\tprovider_error\ttrue\t{message}"),
            "\terror\tprovider_error\ttrue\t1".to_string(),
            // The reason and what the model said apart (they ran into "hello from fakeOTHER").
            "provider error: the model's answer failed (OTHER): hello from fake".to_string(),
        ],
        "{}",
        run.stderr
    );
}

/// An answer a content filter stopped before any of it is `nil, err` of kind `content_filter`
/// from `ai.ask`: it answered "" as if the model had said nothing, and a script could not tell
/// why. A turn keeps saying it in `stop`.
#[test]
fn an_answer_a_content_filter_withheld_is_an_error_for_ai_ask() {
    let fake = FakeProvider::start();
    fake.push(Reply::text("").stop("content_filter"));
    fake.push(Reply::text("").stop("content_filter"));
    let run = sandbox(&fake, "openai")
        .lua(
            r#"local r, e = ai.ask("hi")
               print(r, e.kind, e.transient)
               local t = ai.take_turn{ prompt = "hi" }
               print(t.reply == "", t.stop)"#,
            &[],
        )
        .ok();
    assert_eq!(
        run.lines(),
        ["nil\tcontent_filter\tfalse", "true\tcontent_filter"],
        "{}",
        run.stderr
    );
}

/// `nil, err` with an `err` that is not a string says what it holds: a number its text, a
/// table without a message its JSON (the model read "(error value of type integer)" and
/// "(error table without a message)").
#[test]
fn a_refusal_that_is_not_a_string_says_what_it_holds() {
    let fake = FakeProvider::start();
    fake.push(Reply::tool_calls(vec![
        ("c1", "number", json!({})),
        ("c2", "record", json!({})),
    ]));
    fake.push(Reply::text("done"));
    let run = sandbox(&fake, "openai")
        .lua(
            &script(
                r#"local number = ai.tool{ name = "number", parameters = {}, handler = function() return nil, 42 end }
                   local record = ai.tool{ name = "record", parameters = {}, handler = function() return nil, { code = 28 } end }
                   show(ai.take_turn{ prompt = "try", tools = { number, record } })"#,
            ),
            &[],
        )
        .ok();
    assert_eq!(
        run.lines()[2..],
        [
            "event\tnumber\terror\t42",
            "event\trecord\terror\t{\"code\":28}"
        ],
        "{}",
        run.stdout
    );
}
