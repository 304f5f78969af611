//! The `store` module from Lua: values round-trip exactly, keys list in order, `update` is
//! atomic, and a resident's workspace is a boundary its tools and sources cannot cross.

mod support;

use serde_json::json;
use support::fake::{FakeProvider, Reply};
use support::script::Sandbox;
use support::styled;

#[test]
fn values_round_trip_exactly() {
    let run = Sandbox::new()
        .lua(
            r#"
local v = { nested = { list = { 1, 2.5, "three", true }, empty = {}, none = json.array({}) },
            unicode = "héllo wörld ✓ 日本", int = 42, float = 42.0, negative = -7, big = 9007199254740993 }
assert(store.set("v", v))
local back = store.get("v")
print(json.encode(back))
print(math.type(back.int), math.type(back.float), math.type(back.big))
print(json.encode(store.get("v").nested.none), json.encode(store.get("v").nested.empty))
print(store.get("missing"))
assert(store.set("s", "plain"))
print(store.get("s"), store.delete("s"), store.delete("s"), store.get("s"))
"#,
            &[],
        )
        .ok();
    assert_eq!(
        run.lines(),
        [
            r#"{"big":9007199254740993,"float":42.0,"int":42,"negative":-7,"nested":{"empty":{},"list":[1,2.5,"three",true],"none":[]},"unicode":"héllo wörld ✓ 日本"}"#,
            "integer\tfloat\tinteger",
            "[]\t{}",
            "nil",
            "plain\ttrue\tfalse\tnil",
        ]
    );
}

/// A table JSON cannot hold is refused, naming the key, by `store.set`, `json.encode` and a
/// tool's result alike. Read as a list, as it used to be, `{ 1, 2, x = 3 }` was kept as `[1,2]`
/// and `{ [1] = 1, [5] = 5 }` as `[1]`, the README's "exactly" notwithstanding.
#[test]
fn numbers_functions_and_bytes_json_cannot_hold_are_refused_naming_where() {
    // serde_json wrote NaN and the infinities as null: stored, a number came back nil.
    let sb = Sandbox::new();
    let at = sb.path("script.lua").display().to_string();
    let run = sb
        .lua(
            r#"
print(pcall(store.set, "n", { x = 0/0 }))
print(store.get("n"))
print(pcall(json.encode, { items = { { score = 1 }, { score = -math.huge } } }))
print(pcall(json.encode, { on_done = print }))
print(pcall(json.encode, { ["a b"] = { "\xff\xfe" } }))
print(pcall(json.encode, math.huge))
print(json.encode({ 1.5, "\u{e9}" }))
print(pcall(json.encode, { tools = { 1, ai.tool{ name = "x", parameters = {}, handler = print } } }))
local marked = json.array(); marked.name = "x"
print(pcall(json.encode, marked))
print(json.encode({ json.null }))
"#,
            &[],
        )
        .ok();
    assert_eq!(
        run.lines(),
        [
            format!(
                "false\t{at}:2: store.set \"n\": the value cannot be stored as JSON: x: the number \
                 nan has no JSON form: JSON numbers are finite"
            )
            .as_str(),
            "nil",
            &format!(
                "false\t{at}:4: json.encode: items[2].score: the number -inf has no JSON form: \
                 JSON numbers are finite"
            ),
            &format!("false\t{at}:5: json.encode: on_done: a function has no JSON form"),
            &format!(
                "false\t{at}:6: json.encode: [\"a b\"][1]: a string of 2 bytes that is not UTF-8 \
                 text has no JSON form (JSON holds text: encode the bytes, as hex or base64, first)"
            ),
            &format!(
                "false\t{at}:7: json.encode: the number inf has no JSON form: JSON numbers are \
                 finite"
            ),
            "[1.5,\"\u{e9}\"]",
            // A value of colony's: mlua's "unsupported value type `userdata`", no place.
            &format!(
                "false\t{at}:9: json.encode: tools[2]: a userdata (a value of colony's: a tool, \
                 a connection) has no JSON form"
            ),
            // An empty list given a key was written `[]`, the key lost.
            &format!(
                "false\t{at}:11: json.encode: a table marked a list (json.array, or a JSON array \
                 decoded) holds the key \"name\": JSON has no form for it (a list's items go \
                 from 1)"
            ),
            "[null]",
        ],
        "{}",
        run.stdout
    );
}

#[test]
fn a_table_json_cannot_hold_is_refused_not_cut() {
    let sb = Sandbox::new();
    let at = sb.path("script.lua").display().to_string();
    let run = sb
        .lua(
            r#"
print(pcall(store.set, "mixed", { 1, 2, x = 3 }))
print(store.get("mixed"))
print(pcall(json.encode, { [1] = 1, [5] = 5 }))
print(json.encode({ a = { 1, nil, 3 } }))
print(pcall(json.encode, { [2] = "b" }))
"#,
            &[],
        )
        .ok();
    assert_eq!(
        run.lines(),
        [
            format!(
                "false\t{at}:2: store.set \"mixed\": the value cannot be stored as JSON: a table \
                 with list items 1..2 also holds the key \"x\": JSON has no form for it (put the \
                 list in a field of its own, or fill the list's holes)"
            )
            .as_str(),
            "nil",
            &format!(
                "false\t{at}:4: json.encode: a table with list items 1..1 also holds the key 5: \
                 JSON has no form for it (put the list in a field of its own, or fill the list's \
                 holes)"
            ),
            r#"{"a":[1,null,3]}"#,
            &format!(
                "false\t{at}:6: json.encode: a table with the number key 2 is not a list from 1, \
                 and JSON object keys are strings: JSON has no form for it (start the list at 1, \
                 or use string keys)"
            ),
        ],
        "{}",
        run.stdout
    );
}

#[test]
fn list_orders_keys_and_update_is_atomic() {
    let run = Sandbox::new()
        .lua(
            r#"
for _, k in ipairs({ "b/2", "a", "b/1", "b_x", "b%y", "c" }) do store.set(k, 1) end
print(table.concat(store.list("b"), " "))
print(table.concat(store.list(), " "))
-- Forty coroutines each add one, waiting between reads: update never loses one.
local fns = {}
for i = 1, 40 do
  fns[i] = function()
    ai.sleep(i % 3)
    return store.update("n", function(old) return (old or 0) + 1 end)
  end
end
ai.parallel(table.unpack(fns))
print(store.get("n"))
print(store.update("n", function() return nil end), store.get("n"))
print(pcall(store.update, "n", function() error("no thanks") end))
"#,
            &[],
        )
        .ok();
    let lines = run.lines();
    assert_eq!(lines[0], "b%y b/1 b/2 b_x");
    assert_eq!(lines[1], "a b%y b/1 b/2 b_x c");
    assert_eq!(lines[2], "40");
    assert_eq!(lines[3], "nil\tnil");
    assert!(
        lines[4].starts_with("false\t") && lines[4].contains("no thanks"),
        "{}",
        lines[4]
    );
}

#[test]
fn a_workspace_is_a_boundary() {
    let fake = FakeProvider::start();
    fake.set_responder(|body, _| {
        let last = body["messages"].as_array().unwrap().last().unwrap().clone();
        if last["role"] == "tool" {
            Reply::text("done")
        } else {
            Reply::tool_call(
                "c1",
                "remember",
                json!({"key": "k", "value": "from the tool"}),
            )
        }
    });
    let run = styled(&fake, "openai")
        .lua(
            r#"
store.set("k", "global")
local remember = ai.tool{ name = "remember", description = "Stores a value", parameters = { key = "string", value = "string" },
  handler = function(args)
    local before = store.get(args.key)
    store.set(args.key, args.value)
    return "before: " .. tostring(before)
  end }
local seen = {}
ai.spawn{ name = "core", provider = "openai", model = "m", workspace = "core", tools = { remember },
  deliver_to = function() ai.stop("done") end,
  sources = { function(self)
    seen.source_sees_global = store.get("k")
    store.set("from_source", true)
    ai.mail{ to = self, source = "t", content = "remember", hop = 0 }
  end } }
ai.watch{}
print("global k:", store.get("k"))
print("global from_source:", store.get("from_source"))
print("source saw:", seen.source_sees_global)
print("global keys:", table.concat(store.list(), " "))
"#,
            &[],
        )
        .ok();
    assert_eq!(
        run.lines(),
        [
            "global k:\tglobal",
            "global from_source:\tnil",
            "source saw:\tnil",
            "global keys:\tk",
        ]
    );
    // The tool saw its workspace's empty `k`, not the global one.
    let calls = support::model_calls(&fake);
    let result = calls[1]["messages"].as_array().unwrap().last().unwrap()["content"].clone();
    assert_eq!(result, "before: nil");
}

#[test]
fn a_table_that_holds_itself_or_a_key_that_is_not_a_string_is_refused_naming_where() {
    let sb = Sandbox::new();
    let at = sb.path("script.lua").display().to_string();
    let run = sb
        .lua(
            r#"
local t = { name = "loop", child = {} }
t.child.parent = t
print(pcall(json.encode, t))
print(pcall(json.encode, { items = { { [true] = 1 } } }))
local shared = { 1, 2 }
print(json.encode({ a = shared, b = shared }))
"#,
            &[],
        )
        .ok();
    assert_eq!(
        run.lines(),
        [
            format!(
                "false\t{at}:4: json.encode: child.parent: a table that holds itself (through \
                 this key) has no JSON form"
            )
            .as_str(),
            &format!(
                "false\t{at}:5: json.encode: items[1]: the key true is a boolean: JSON object \
                 keys are strings"
            ),
            "{\"a\":[1,2],\"b\":[1,2]}",
        ],
        "{}",
        run.stdout
    );
}

#[test]
fn store_update_refuses_a_value_and_a_wait_as_store_set_would() {
    let sb = Sandbox::new();
    let at = sb.path("script.lua").display().to_string();
    let run = sb
        .lua(
            r#"print(select(2, pcall(store.update, "k", function() return print end)))
print(select(2, pcall(store.update, "k", function() ai.sleep(1) return 1 end)))
print(store.get("k"))
error(setmetatable({}, { __tostring = function() return "a failure of my own" end }))"#,
            &[],
        )
        .failed();
    assert_eq!(
        run.lines(),
        [
            format!(
                "{at}:1: store.update \"k\": the new value cannot be stored as JSON: a function \
                 has no JSON form"
            ),
            format!(
                "{at}:2: store.update: the function cannot wait (ai.sleep, ai.ask, http...): it \
                 runs inside the store's transaction"
            ),
            "nil".to_string(),
        ],
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("a failure of my own"), "{}", run.stderr);
}

/// The store, and what writes to it, called inside a `store.update` function raises: it
/// answered `nil, err`, which the function took for "absent" (a read kept nil, an inner update's
/// nil deleted the outer key).
#[test]
fn the_store_inside_an_update_function_raises() {
    let sb = Sandbox::new();
    let at = sb.path("script.lua").display().to_string();
    let run = sb
        .lua(
            r#"store.set("price", 41)
store.set("count", 7)
local calls = {
  function() return store.get("price") end,
  function() return store.update("other", function() return 5 end) end,
  function() store.set("other", 1) return 1 end,
  function() return #store.list() end,
  function() ai.mail{ to = "nobody", content = "x", hop = 0 } return 1 end,
}
for _, f in ipairs(calls) do
  print(select(2, pcall(store.update, "count", f)))
end
print(store.get("count"), store.get("other"), store.update("count", function(n) return n + 1 end))"#,
            &[],
        )
        .ok();
    let refused = |line: u32, who: &str| {
        format!(
            "{at}:{line}: {who}: cannot be called inside a store.update function (it runs inside \
             the store's transaction): read what it needs before the update"
        )
    };
    assert_eq!(
        run.lines(),
        [
            refused(4, "store.get"),
            refused(5, "store.update"),
            refused(6, "store.set"),
            refused(7, "store.list"),
            refused(8, "ai.mail"),
            "7\tnil\t8".to_string(),
        ],
        "{}",
        run.stderr
    );
}

/// A turn that may call tools starts the store's write-ahead log while its first model call is
/// in flight, so that the first call's audit line does not write and sync the log's header in
/// the middle of the turn; a program that calls no tool writes nothing to its store.
#[test]
fn a_tool_turn_starts_the_log_before_its_first_line_and_a_run_without_tools_writes_nothing() {
    let fake = FakeProvider::start();
    fake.set_responder(|body, _| {
        let last = body["messages"].as_array().unwrap().last().unwrap().clone();
        if last["role"] == "tool" {
            Reply::text("done")
        } else if body.get("tools").is_some() {
            Reply::tool_call("c1", "probe", json!({}))
        } else {
            Reply::text("hello")
        }
    });
    let sandbox = styled(&fake, "openai");
    let state = sandbox.path("st").display().to_string();
    let run = sandbox
        .lua(
            r#"
local function log_size()
  local s = fs.stat("st/store.sqlite3-wal")
  return s and s.size or 0
end
ai.ask("hi", { provider = "openai", model = "m" })
ai.run{ provider = "openai", model = "m", prompt = "hi" }
print("log after an ask and a turn without tools:", log_size())
local seen
local probe = ai.tool{ name = "probe", description = "Looks at the log", parameters = {},
  handler = function()
    -- This call's own audit line is written after it returns: a log with something in it
    -- now was started by the turn. Waited for, as it is started beside the turn.
    for _ = 1, 2000 do
      if log_size() > 0 then break end
      ai.sleep(10)
    end
    seen = log_size()
    return "ok"
  end }
local r = ai.run{ provider = "openai", model = "m", prompt = "go", tools = { probe } }
print("reply:", r.text)
print("log started in the first call:", seen > 0)
"#,
            &["--state", &state],
        )
        .ok();
    assert_eq!(
        run.lines(),
        [
            "log after an ask and a turn without tools:\t0",
            "reply:\tdone",
            "log started in the first call:\ttrue",
        ]
    );
    // The store closed whole, its log copied into the file and removed, though stdout is a
    // pipe (the run's watcher of it held the program, and the store open, to the end); the
    // call's line is in the audit log.
    let left = support::left_open(&sandbox.path("st"));
    assert!(left.is_empty(), "left beside the store: {left:?}");
    let script = sandbox.path("script.lua").display().to_string();
    let audit = sandbox.colony(&["audit", "--state", &state, &script]).ok();
    assert!(audit.stdout.contains("probe"), "{}", audit.stdout);
}

/// A workspace named `""` is refused: it is the global space, so a resident given it saw every
/// global key (README: its tools and sources see its space alone).
#[test]
fn an_empty_workspace_is_refused() {
    let sb = Sandbox::new();
    let at = sb.path("script.lua").display().to_string();
    let run = sb
        .lua(
            r#"print(select(2, pcall(ai.spawn, { name = "tenant", provider = "openai", model = "m", workspace = "" })))"#,
            &[],
        )
        .ok();
    assert_eq!(
        run.lines(),
        [format!(
            "{at}:1: ai.spawn \"tenant\": workspace is empty: name a space of its own, or leave it \
             out for the global space"
        )],
        "{}",
        run.stderr
    );
}
