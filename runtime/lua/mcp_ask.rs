//! `ctx.sample{...}` and `ctx.elicit{...}` in a tool handler: the Lua tables read into the
//! questions the core's MCP server sends its client ([`crate::mcp::server::ask`]), and the
//! answers read back. A call that did not come over MCP has no client to ask: both answer
//! `nil, { kind = "unsupported" }` there, as for a client that declared no such capability.

use mlua::{Function, Lua, MultiValue, Table, Value};
use serde_json::{Map, Value as Json, json};

use super::convert::{check_fields, error_table, from_json, misuse, to_json};
use crate::mcp::server::{Exports, Question, Unanswered};

/// What `max_tokens` is when the handler does not say (the protocol requires one).
const MAX_TOKENS: u64 = 1024;

/// Adds `sample` and `elicit` to the `ctx` of call `call_id`.
pub fn add_ctx(lua: &Lua, ctx: &Table, exports: Exports, call_id: &str) -> mlua::Result<()> {
    // A call that did not come over MCP has nobody to ask: its `sample` and `elicit` are made
    // once per VM (they check their arguments, then answer `unsupported`), not once per call,
    // which cost every tool call of a model's turn two async functions.
    if !call_id.starts_with("mcp-") {
        if lua.app_data_ref::<NotOverMcp>().is_none() {
            let made = NotOverMcp {
                sample: sample_fn(lua, String::new(), exports.clone())?,
                elicit: elicit_fn(lua, String::new(), exports)?,
            };
            lua.set_app_data(made);
        }
        let cached = lua.app_data_ref::<NotOverMcp>().expect("made above");
        ctx.set("sample", cached.sample.clone())?;
        ctx.set("elicit", cached.elicit.clone())?;
        return Ok(());
    }
    ctx.set(
        "sample",
        sample_fn(lua, call_id.to_string(), exports.clone())?,
    )?;
    ctx.set("elicit", elicit_fn(lua, call_id.to_string(), exports)?)?;
    Ok(())
}

/// `ctx.sample` and `ctx.elicit` for the calls that did not come over MCP, made once.
struct NotOverMcp {
    sample: Function,
    elicit: Function,
}

fn sample_fn(lua: &Lua, id: String, ex: Exports) -> mlua::Result<Function> {
    lua.create_async_function(move |lua, spec: Value| {
        let (id, ex) = (id.clone(), ex.clone());
        async move {
            let who = "ctx.sample";
            let params = sample_params(&lua, table(spec, who)?)?;
            match ex.ask(&id, Question::Sample(params)).await {
                Ok(answer) => Ok(MultiValue::from_iter([Value::Table(sampled(
                    &lua, &answer,
                )?)])),
                Err(e) => unanswered(&lua, who, e),
            }
        }
    })
}

fn elicit_fn(lua: &Lua, id: String, ex: Exports) -> mlua::Result<Function> {
    lua.create_async_function(move |lua, spec: Value| {
        let (id, ex) = (id.clone(), ex.clone());
        async move {
            let who = "ctx.elicit";
            let params = elicit_params(&lua, table(spec, who)?)?;
            match ex.ask(&id, Question::Elicit(params)).await {
                Ok(answer) => Ok(MultiValue::from_iter([Value::Table(elicited(
                    &lua, &answer,
                )?)])),
                Err(e) => unanswered(&lua, who, e),
            }
        }
    })
}

fn table(spec: Value, who: &str) -> mlua::Result<Table> {
    match spec {
        Value::Table(t) => Ok(t),
        other => Err(misuse(format!(
            "{who}: takes a table ({who}{{ ... }}), not {}",
            other.type_name()
        ))),
    }
}

/// `nil, err` for what the client could not or would not answer; a question the protocol
/// cannot carry is the handler's mistake and raises.
fn unanswered(lua: &Lua, who: &str, e: Unanswered) -> mlua::Result<MultiValue> {
    let kind = match &e {
        Unanswered::Invalid(m) => return Err(misuse(format!("{who}: {m}"))),
        Unanswered::Unsupported(_) => "unsupported",
        Unanswered::Refused(_) => "rpc_error",
        Unanswered::Closed(_) => "closed",
    };
    let err = error_table(lua, kind, &format!("{who}: {e}"))?;
    Ok(MultiValue::from_iter([Value::Nil, Value::Table(err)]))
}

fn string(t: &Table, key: &str, who: &str) -> mlua::Result<Option<String>> {
    match t.get::<Value>(key)? {
        Value::Nil => Ok(None),
        Value::String(s) => Ok(Some(s.to_str()?.to_string())),
        other => Err(misuse(format!(
            "{who}: {key} must be a string, not {}",
            other.type_name()
        ))),
    }
}

fn number(t: &Table, key: &str, who: &str) -> mlua::Result<Option<f64>> {
    match t.get::<Value>(key)? {
        Value::Nil => Ok(None),
        Value::Integer(n) => Ok(Some(n as f64)),
        Value::Number(n) => Ok(Some(n)),
        other => Err(misuse(format!(
            "{who}: {key} must be a number, not {}",
            other.type_name()
        ))),
    }
}

/// A message's `content`: text, or a content block as MCP spells it (`{ type = "image", data,
/// mimeType }`).
fn content(lua: &Lua, value: Value, at: &str) -> mlua::Result<Json> {
    match value {
        Value::String(s) => Ok(json!({ "type": "text", "text": s.to_str()?.to_string() })),
        Value::Table(t) => {
            let block = to_json(lua, Value::Table(t))?;
            if block.get("type").is_some_and(Json::is_string) {
                Ok(block)
            } else {
                Err(misuse(format!(
                    "{at}: a content block needs a type (\"text\", \"image\", \"audio\")"
                )))
            }
        }
        other => Err(misuse(format!(
            "{at}: must be a string or a content block, not {}",
            other.type_name()
        ))),
    }
}

/// `ctx.sample{ messages | prompt, system?, max_tokens?, temperature?, stop_sequences?,
/// model_preferences?, include_context?, metadata? }` as `sampling/createMessage` params.
fn sample_params(lua: &Lua, spec: Table) -> mlua::Result<Json> {
    let who = "ctx.sample";
    check_fields(
        &spec,
        who,
        &[
            "messages",
            "prompt",
            "system",
            "max_tokens",
            "temperature",
            "stop_sequences",
            "model_preferences",
            "include_context",
            "metadata",
        ],
    )?;
    let mut messages = Vec::new();
    match (
        spec.get::<Value>("messages")?,
        string(&spec, "prompt", who)?,
    ) {
        (Value::Nil, Some(prompt)) => {
            messages.push(json!({ "role": "user", "content": { "type": "text", "text": prompt } }))
        }
        (Value::Table(list), None) => {
            for (i, m) in list.sequence_values::<Value>().enumerate() {
                let at = format!("{who}: messages[{}]", i + 1);
                let Value::Table(m) = m? else {
                    return Err(misuse(format!("{at} must be a table {{ role, content }}")));
                };
                check_fields(&m, &at, &["role", "content"])?;
                let role = string(&m, "role", &at)?.unwrap_or_else(|| "user".into());
                if role != "user" && role != "assistant" {
                    return Err(misuse(format!(
                        "{at}: role must be \"user\" or \"assistant\", not {role:?}"
                    )));
                }
                let body = content(lua, m.get("content")?, &format!("{at}.content"))?;
                messages.push(json!({ "role": role, "content": body }));
            }
            if messages.is_empty() {
                return Err(misuse(format!("{who}: messages is empty")));
            }
        }
        (Value::Nil, None) => {
            return Err(misuse(format!(
                "{who}: give prompt (a string) or messages (a list of {{ role, content }})"
            )));
        }
        (Value::Table(_), Some(_)) => {
            return Err(misuse(format!("{who}: give prompt or messages, not both")));
        }
        (other, _) => {
            return Err(misuse(format!(
                "{who}: messages must be a list, not {}",
                other.type_name()
            )));
        }
    }
    let max_tokens = match number(&spec, "max_tokens", who)? {
        None => MAX_TOKENS,
        Some(n) if n >= 1.0 && n.fract() == 0.0 && n <= u32::MAX as f64 => n as u64,
        Some(n) => {
            return Err(misuse(format!(
                "{who}: max_tokens must be a whole number of at least 1, not {n}"
            )));
        }
    };
    let mut p = Map::new();
    p.insert("messages".into(), Json::Array(messages));
    p.insert("maxTokens".into(), json!(max_tokens));
    if let Some(s) = string(&spec, "system", who)? {
        p.insert("systemPrompt".into(), json!(s));
    }
    if let Some(t) = number(&spec, "temperature", who)? {
        let t = super::convert::temperature_option(who, t)?;
        p.insert("temperature".into(), json!(t));
    }
    match spec.get::<Value>("stop_sequences")? {
        Value::Nil => {}
        v @ Value::Table(_) => {
            p.insert("stopSequences".into(), to_json(lua, v)?);
        }
        other => {
            return Err(misuse(format!(
                "{who}: stop_sequences must be a list of strings, not {}",
                other.type_name()
            )));
        }
    }
    if let Some(c) = string(&spec, "include_context", who)? {
        let wire = match c.as_str() {
            "none" => "none",
            "this_server" => "thisServer",
            "all_servers" => "allServers",
            _ => {
                return Err(misuse(format!(
                    "{who}: include_context must be \"none\", \"this_server\" or \
                     \"all_servers\", not {c:?}"
                )));
            }
        };
        p.insert("includeContext".into(), json!(wire));
    }
    match spec.get::<Value>("model_preferences")? {
        Value::Nil => {}
        Value::Table(t) => {
            p.insert("modelPreferences".into(), preferences(lua, t)?);
        }
        other => {
            return Err(misuse(format!(
                "{who}: model_preferences must be a table, not {}",
                other.type_name()
            )));
        }
    }
    match spec.get::<Value>("metadata")? {
        Value::Nil => {}
        v => {
            p.insert("metadata".into(), to_json(lua, v)?);
        }
    }
    Ok(Json::Object(p))
}

/// `{ hints = { "name" | { name } ... }, cost_priority?, speed_priority?,
/// intelligence_priority? }` as `modelPreferences`.
fn preferences(lua: &Lua, t: Table) -> mlua::Result<Json> {
    let who = "ctx.sample: model_preferences";
    check_fields(
        &t,
        who,
        &[
            "hints",
            "cost_priority",
            "speed_priority",
            "intelligence_priority",
        ],
    )?;
    let mut p = Map::new();
    match t.get::<Value>("hints")? {
        Value::Nil => {}
        Value::Table(list) => {
            let mut hints = Vec::new();
            for (i, h) in list.sequence_values::<Value>().enumerate() {
                match h? {
                    Value::String(s) => hints.push(json!({ "name": s.to_str()?.to_string() })),
                    v @ Value::Table(_) => hints.push(to_json(lua, v)?),
                    other => {
                        return Err(misuse(format!(
                            "{who}: hints[{}] must be a model name or {{ name }}, not {}",
                            i + 1,
                            other.type_name()
                        )));
                    }
                }
            }
            p.insert("hints".into(), Json::Array(hints));
        }
        other => {
            return Err(misuse(format!(
                "{who}: hints must be a list, not {}",
                other.type_name()
            )));
        }
    }
    for (key, wire) in [
        ("cost_priority", "costPriority"),
        ("speed_priority", "speedPriority"),
        ("intelligence_priority", "intelligencePriority"),
    ] {
        if let Some(n) = number(&t, key, who)? {
            if !(0.0..=1.0).contains(&n) {
                return Err(misuse(format!(
                    "{who}: {key} must be between 0 and 1, not {n}"
                )));
            }
            p.insert(wire.into(), json!(n));
        }
    }
    Ok(Json::Object(p))
}

/// `ctx.elicit{ message, schema }` as `elicitation/create` params (form mode): `schema` is a
/// flat JSON Schema object of strings, numbers, booleans and enums (`type = "object"` may be
/// left out).
fn elicit_params(lua: &Lua, spec: Table) -> mlua::Result<Json> {
    let who = "ctx.elicit";
    check_fields(&spec, who, &["message", "schema"])?;
    let message = string(&spec, "message", who)?
        .filter(|m| !m.is_empty())
        .ok_or_else(|| misuse(format!("{who}: message (a non-empty string) is required")))?;
    let mut schema = match spec.get::<Value>("schema")? {
        v @ Value::Table(_) => to_json(lua, v)?,
        Value::Nil => {
            return Err(misuse(format!(
                "{who}: schema (a table: {{ properties = {{ ... }}, required = {{ ... }} }}) is required"
            )));
        }
        other => {
            return Err(misuse(format!(
                "{who}: schema must be a table, not {}",
                other.type_name()
            )));
        }
    };
    if let Json::Object(o) = &mut schema {
        o.entry("type").or_insert_with(|| json!("object"));
        o.entry("properties").or_insert_with(|| json!({}));
    }
    Ok(json!({ "mode": "form", "message": message, "requestedSchema": schema }))
}

/// A `sampling/createMessage` result as `{ text, role, content, model, stop_reason }`; `text`
/// is the text of the answer's text blocks.
fn sampled(lua: &Lua, answer: &Json) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    let blocks: Vec<&Json> = match &answer["content"] {
        Json::Array(list) => list.iter().collect(),
        Json::Null => Vec::new(),
        one => vec![one],
    };
    let text: Vec<&str> = blocks
        .iter()
        .filter(|b| b["type"] == "text")
        .filter_map(|b| b["text"].as_str())
        .collect();
    t.set("text", text.join(""))?;
    t.set("role", answer["role"].as_str())?;
    t.set("content", from_json(lua, &answer["content"])?)?;
    t.set("model", answer["model"].as_str())?;
    t.set("stop_reason", answer["stopReason"].as_str())?;
    Ok(t)
}

/// An `elicitation/create` result as `{ action, content? }`: `action` is `"accept"`,
/// `"decline"` or `"cancel"`; `content` the form's values when accepted.
fn elicited(lua: &Lua, answer: &Json) -> mlua::Result<Table> {
    let t = lua.create_table()?;
    t.set("action", answer["action"].as_str().unwrap_or("cancel"))?;
    if let Some(c) = answer.get("content").filter(|c| !c.is_null()) {
        t.set("content", from_json(lua, c)?)?;
    }
    Ok(t)
}
