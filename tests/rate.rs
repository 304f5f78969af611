//! Rate limits set in the config (`[rate]`), through the binary: the eleventh call of
//! "10/min" is a `429` with `Retry-After` for a caller of `colony serve`'s API, and a
//! `rate_limited` result for a model's tool call (per tool and for all tools together).

mod support;

use serde_json::json;
use support::fake::{FakeProvider, Reply};
use support::script::Sandbox;
use support::serve::Served;
use support::styled;

/// A program with one resident that never needs a model.
const QUIET: &str = "ai.spawn{ name = \"w\" }\nai.watch{}\n";

#[track_caller]
fn assert_eleventh_refused(served: &Served, caller: &str) {
    for i in 1..=10 {
        let ok = served.get("/api/programs");
        assert_eq!(ok.status, 200, "call {i}: {}", ok.text);
    }
    let refused = served.get("/api/programs");
    assert_eq!(refused.status, 429, "{}", refused.text);
    let retry: u64 = refused.headers["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .expect("Retry-After is whole seconds");
    // Ten a minute is one every 6 s: the next is due within that.
    assert!((1..=6).contains(&retry), "Retry-After: {retry}");
    assert_eq!(refused.json["error"], "rate_limited");
    assert_eq!(
        refused.json["message"],
        format!("caller {caller:?} allows 10/min requests; try again in {retry} s")
    );
    // The health endpoints are not a caller's to spend.
    assert_eq!(served.get_with("/healthz", &[], true).status, 200);
}

#[test]
fn the_eleventh_api_call_of_ten_a_minute_by_the_token_is_429_with_retry_after() {
    let sb = Sandbox::new();
    sb.write("config.toml", "[rate.callers]\ntoken = \"10/min\"\n");
    let program = sb.write("quiet.lua", QUIET);
    let token = sb.write("token", "rate-test-token-8c2f\n");
    let mut served = Served::start(
        &sb,
        &[
            "--token-file",
            &token.display().to_string(),
            &program.display().to_string(),
        ],
    );
    served.token = Some("rate-test-token-8c2f".into());
    assert_eleventh_refused(&served, "token");
}

#[test]
fn every_caller_gets_the_configs_caller_rate_on_a_loopback_service_without_a_token() {
    let sb = Sandbox::new();
    sb.write("config.toml", "[rate]\ncaller = \"10/min\"\n");
    let program = sb.write("quiet.lua", QUIET);
    let served = Served::start(&sb, &[&program.display().to_string()]);
    assert_eleventh_refused(&served, "local");
}

/// One step of eleven calls of `count`, then "done"; prints the reply, how often the handler
/// ran, and the kinds of the calls.
fn eleven_calls(config: &str) -> (Vec<String>, Vec<String>) {
    let fake = FakeProvider::start();
    let calls: Vec<(String, &str, serde_json::Value)> = (1..=11)
        .map(|i| (format!("c{i}"), "count", json!({ "n": i })))
        .collect();
    fake.push(Reply::tool_calls(calls));
    fake.push(Reply::text("done"));
    let sb = styled(&fake, "openai");
    sb.write(
        "config.toml",
        &format!("[use.general]\nprovider = \"openai\"\n{config}"),
    );
    let run = sb
        .lua(
            r#"
local ran = 0
local count = ai.tool{ name = "count", parameters = { n = "integer" },
  handler = function(args) ran = ran + 1 return "counted " .. args.n end }
local r = ai.take_turn{ prompt = "count", tools = { count } }
local kinds = {}
for _, e in ipairs(r.tool_events) do kinds[e.kind] = (kinds[e.kind] or 0) + 1 end
print(r.reply, ran, kinds.ok, kinds.rate_limited)
"#,
            &[],
        )
        .ok();
    let results: Vec<String> = support::model_calls(&fake)[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap().to_string())
        .filter(|r| r.contains("rate_limited"))
        .collect();
    (run.lines().iter().map(|l| l.to_string()).collect(), results)
}

#[test]
fn the_eleventh_tool_call_of_the_configs_ten_a_minute_is_rate_limited_and_not_run() {
    let (lines, limited) = eleven_calls("[rate.tools]\ncount = \"10/min\"\n");
    assert_eq!(lines, ["done\t10\t10\t1"]);
    assert_eq!(limited.len(), 1, "{limited:?}");
    assert!(
        limited[0].contains(
            "rate_limited: count allows 10/min calls (the config's [rate.tools]); try again in "
        ),
        "{}",
        limited[0]
    );
}

#[test]
fn the_global_rate_counts_every_tool_call() {
    let (lines, limited) = eleven_calls("[rate]\nglobal = \"10/min\"\n");
    assert_eq!(lines, ["done\t10\t10\t1"]);
    assert!(
        limited[0]
            .contains("rate_limited: tool calls allow 10/min in all (the config's [rate] global)"),
        "{}",
        limited[0]
    );
}

#[test]
fn a_rate_written_wrong_in_the_config_is_refused_naming_it() {
    let sb = Sandbox::new();
    let config = sb.write("config.toml", "[rate.tools]\nlookup = \"often\"\n");
    let run = sb.lua("print('never')", &[]).failed();
    assert!(
        run.stderr.contains(&format!(
            "{}: [rate.tools] lookup = \"often\": \"often\" is not a rate",
            config.display()
        )),
        "{}",
        run.stderr
    );
}

/// A tool's own `rate` of the wrong type is named with what it should be (it read "rate is a
/// string (\"10/min\"), not a table", as if the table were the string).
#[test]
fn a_tools_rate_of_the_wrong_type_is_refused_naming_it() {
    let sb = Sandbox::new();
    let run = sb
        .lua(
            r#"ai.tool{ name = "t", parameters = {}, rate = { per = "min" }, handler = print }"#,
            &[],
        )
        .failed();
    assert!(
        run.stderr.contains(
            "script.lua:1: ai.tool: tool t: rate must be a string such as \"10/min\", not a table"
        ),
        "{}",
        run.stderr
    );
}
