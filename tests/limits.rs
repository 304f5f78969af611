//! Rate limits on tools (`ai.tool{ rate = "10/min" }`), through the binary against the fake
//! provider: the eleventh call of ten a minute is answered `rate_limited` without running, and
//! the model reads when to try again.

mod support;

use serde_json::json;
use support::fake::{FakeProvider, Reply};
use support::styled;

#[test]
fn the_eleventh_call_of_ten_a_minute_is_rate_limited_and_not_run() {
    let fake = FakeProvider::start();
    // One step with eleven calls of the same tool, then a reply.
    let calls: Vec<(String, &str, serde_json::Value)> = (1..=11)
        .map(|i| (format!("c{i}"), "count", json!({ "n": i })))
        .collect();
    fake.push(Reply::tool_calls(calls));
    fake.push(Reply::text("done"));
    let sb = styled(&fake, "openai");
    sb.write("config.toml", "[use.general]\nprovider = \"openai\"\n");
    let run = sb
        .lua(
            r#"
local ran = 0
local count = ai.tool{ name = "count", parameters = { n = "integer" }, rate = "10/min",
  handler = function(args) ran = ran + 1 return "counted " .. args.n end }
local r = ai.take_turn{ prompt = "count", tools = { count } }
local kinds = {}
for _, e in ipairs(r.tool_events) do kinds[e.kind] = (kinds[e.kind] or 0) + 1 end
print(r.reply, ran, kinds.ok, kinds.rate_limited)
print(pcall(ai.tool, { name = "x", parameters = {}, handler = print, rate = "lots" }))
"#,
            &[],
        )
        .ok();
    let lines = run.lines();
    assert_eq!(lines[0], "done\t10\t10\t1", "{}", run.stderr);
    assert!(
        lines[1].starts_with("false\t")
            && lines[1].contains("tool x: rate: \"lots\" is not a rate"),
        "{}",
        lines[1]
    );
    let results: Vec<String> = support::model_calls(&fake)[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(results.len(), 11);
    let limited: Vec<&String> = results
        .iter()
        .filter(|r| r.contains("rate_limited"))
        .collect();
    assert_eq!(limited.len(), 1, "{results:?}");
    assert!(
        limited[0].contains("count allows 10/min calls; try again in "),
        "{}",
        limited[0]
    );
}
