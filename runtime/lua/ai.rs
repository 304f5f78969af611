//! The `ai` module's one-shot part: `ai.ask`, `ai.ask_simple` (and `ai.infer`), `ai.providers`,
//! `ai.models`, `ai.sleep`; the turn-level functions are in `turn.rs`.
//!
//! This file only translates: Lua tables in, neutral types to the core, neutral results back as
//! Lua tables. Mistakes in how a function is called (a misspelt option, a history entry without
//! a role) raise an error naming the field; failures of the call itself (no key, a refused
//! request, an outage) are expected and come back as `nil, err`.

use mlua::{Function, Lua, MultiValue, Table, Value};

use super::convert::{misuse, provider_error, to_json};
use super::messages::{calls_table, read_history};
use super::options::Options;
use crate::config::Overrides;
use crate::core::{Ask, Core};
use crate::providers::catalogue::CATALOGUE;
use crate::vocab::{Inferred, ToolChoice, ToolSpec};

pub fn register(lua: &Lua) -> mlua::Result<Table> {
    let ai = lua.create_table()?;
    // Arguments read by `convert::arg`, which names the function when one is of the wrong
    // type (mlua's own conversion did not).
    let ask_fn = lua.create_async_function(|lua, (history, opts): (Value, Value)| async move {
        let opts: Option<Table> = super::convert::arg(&lua, "ai.ask", 2, opts)?;
        ask(&lua, history, opts, "ai.ask").await
    })?;
    ai.set("ask", ask_fn)?;
    // One function a name, so a bad argument names the one the script called (`ai.infer`
    // was told of as `ai.ask_simple`).
    for (name, who) in [
        ("ask_simple", "ai.ask_simple"),
        ("infer", "ai.infer"),
        ("askSimple", "ai.askSimple"),
    ] {
        let ask_simple =
            lua.create_async_function(move |lua, (prompt, opts): (Value, Value)| async move {
                let prompt: mlua::LuaString = super::convert::arg(&lua, who, 1, prompt)?;
                let opts: Option<Table> = super::convert::arg(&lua, who, 2, opts)?;
                let history = Value::String(prompt);
                // Only the reply, or `nil, err`: the calls are not for a one-shot caller.
                let out = ask(&lua, history, opts, who).await?;
                Ok(MultiValue::from_iter(out.into_iter().take(2)))
            })?;
        ai.set(name, ask_simple)?;
    }
    ai.set("providers", lua.create_function(|lua, ()| providers(lua))?)?;
    // `ai.classify_file(content_type)`: "image", "pdf", "text", "audio", "video" or "other".
    ai.set(
        "classify_file",
        lua.create_function(|lua, ct: Value| {
            let ct: String = super::convert::arg(lua, "ai.classify_file", 1, ct)?;
            Ok(crate::files::classify(&ct).as_str())
        })?,
    )?;
    // `file, err = ai.view_file(ref)`: an attached file again, bytes and all.
    ai.set(
        "view_file",
        lua.create_function(|lua, handle: Value| match handle {
            Value::String(s) => super::files::view_file(lua, s.to_string_lossy()),
            other => Err(misuse(format!(
                "ai.view_file: ref must be a string (a file table's ref), not {}",
                other.type_name()
            ))),
        })?,
    )?;
    // `ai.sleep(ms)`: waits without holding up any other coroutine.
    ai.set(
        "sleep",
        lua.create_async_function(|lua, ms: Value| async move {
            let ms: f64 = super::convert::arg(&lua, "ai.sleep", 1, ms)?;
            let wait = super::convert::millis_option("ai.sleep", "ms", ms)?;
            tokio::time::sleep(wait).await;
            Ok(())
        })?,
    )?;
    let models =
        lua.create_async_function(|lua, opts: Value| async move { models(&lua, opts).await })?;
    ai.set("models", models.clone())?;
    ai.set("fetchModels", models)?;
    Ok(ai)
}

pub fn core(lua: &Lua) -> Core {
    lua.app_data_ref::<Core>()
        .expect("the VM was built with a core")
        .clone()
}

/// `reply, err, tool_calls = ai.ask(history, overrides)`, or one of the one-shot names (`who`,
/// as its misuse names it: `ai.infer`).
async fn ask(
    lua: &Lua,
    history: Value,
    opts: Option<Table>,
    who: &str,
) -> mlua::Result<MultiValue> {
    let (mut ask, stream) = read_ask(lua, opts.clone(), who, &[])?;
    // `ai.ask{ prompt = ..., model = ... }`, the shape of `ai.run`, puts the options where the
    // history goes: say where they belong rather than send no messages with no options.
    if let Value::Table(t) = &history
        && t.raw_len() == 0
        && let Some(keys) = super::messages::record_keys(t)
    {
        return Err(misuse(format!(
            "{who}: history must be a string or a list of messages, not a table with keys \
             {keys}: the prompt goes first and the options second, \
             {who}(\"...\", {{ model = ... }})"
        )));
    }
    ask.messages = read_history(lua, history, who)?;
    if ask.messages.is_empty() {
        return Err(misuse(format!(
            "{who}: the history is empty: give a prompt or a list of messages"
        )));
    }
    if let Some(tools) = opts
        .map(|o| o.get::<Option<Table>>("tools"))
        .transpose()?
        .flatten()
    {
        for (i, tool) in tools.sequence_values::<Value>().enumerate() {
            let spec = read_tool(lua, tool?, i + 1)
                .map_err(|e| misuse(format!("{who}: {}", super::plain(&e))))?;
            ask.tools.push(spec);
        }
    }
    let core = core(lua);
    let overrides = ask.overrides.clone();
    let mut req = core.request(ask);
    let on_text = stream.map(|f| {
        move |delta: String| {
            let f = f.clone();
            async move { f.call_async::<()>(delta).await }
        }
    });
    let result =
        crate::turn::model_call::call_model(&core, &core, &overrides, &mut req, on_text).await?;
    match result {
        Ok(inferred) => match crate::providers::ProviderError::failed_answer(&inferred) {
            Some(e) => failure(lua, &e),
            None if withheld(&inferred) => {
                let t = super::convert::error_table(
                    lua,
                    "content_filter",
                    "the provider withheld the answer: its content filter stopped it (the \
                     prompt, or what the model began to say)",
                )?;
                t.set("transient", false)?;
                Ok(MultiValue::from_iter([Value::Nil, Value::Table(t)]))
            }
            None => success(lua, &inferred),
        },
        Err(e) => failure(lua, &e),
    }
}

/// An answer a content filter stopped before any of it (Gemini's `promptFeedback.blockReason`,
/// OpenAI's `finish_reason: content_filter`): `ai.ask` answered "" as if the model had said
/// nothing, and a script could not tell why.
fn withheld(inferred: &Inferred) -> bool {
    inferred.stop == crate::vocab::Stop::ContentFilter
        && inferred.text().trim().is_empty()
        && inferred.message.tool_calls().next().is_none()
}

fn failure(lua: &Lua, e: &crate::providers::ProviderError) -> mlua::Result<MultiValue> {
    Ok(MultiValue::from_iter([
        Value::Nil,
        Value::Table(provider_error(lua, e)?),
    ]))
}

fn success(lua: &Lua, inferred: &Inferred) -> mlua::Result<MultiValue> {
    let reply = Value::String(lua.create_string(inferred.text())?);
    match calls_table(lua, &inferred.message)? {
        None => Ok(MultiValue::from_iter([reply])),
        Some(list) => Ok(MultiValue::from_iter([
            reply,
            Value::Nil,
            Value::Table(list),
        ])),
    }
}

const OPTIONS: &[&str] = &[
    "use",
    "provider",
    "model",
    "key",
    "base_url",
    "timeout",
    "max_tokens",
    "temperature",
    "system",
    "tools",
    "tool_choice",
    "extra",
    "stream",
    "stop",
];

/// A `base_url` the script sets is the script reaching that host, as its `http` does: under
/// `--sandbox` it needs `--allow-net`. Only the config's providers are colony's own calls; a
/// script could send the configured key (and anything else) to a host of its choosing.
fn script_base_url(lua: &Lua, who: &str, base_url: Option<&str>) -> mlua::Result<()> {
    // One that does not parse reaches nothing: resolving it says what is wrong.
    match base_url.map(reqwest::Url::parse) {
        Some(Ok(url)) => super::sandbox::check_net(lua, who, &url),
        _ => Ok(()),
    }
}

/// The options table of `ai.ask` (and of every call that takes its options): settings for
/// resolution, plus what shapes the request. `tools` is left to the caller: `ai.ask` wants only
/// their specs, a turn wants their handlers too. `extra_keys` are the caller's own options, which
/// it reads itself; any other key is a mistake and is named.
pub fn read_ask(
    lua: &Lua,
    opts: Option<Table>,
    who: &str,
    extra_keys: &[&str],
) -> mlua::Result<(Ask, Option<Function>)> {
    match opts {
        None => Ok((Ask::default(), None)),
        Some(t) => read_ask_from(lua, &Options::read(lua, t, who)?, who, extra_keys),
    }
}

/// [`read_ask`] from options already read (a turn reads more of them itself).
pub fn read_ask_from(
    lua: &Lua,
    opts: &Options,
    who: &str,
    extra_keys: &[&str],
) -> mlua::Result<(Ask, Option<Function>)> {
    let bad = |what: String| super::convert::misuse(format!("{who}: {what}"));
    let mut ask = Ask::default();
    for name in opts.keys() {
        if !OPTIONS.contains(&name) && !extra_keys.contains(&name) {
            let mut known: Vec<&str> = OPTIONS.to_vec();
            known.extend(extra_keys.iter().filter(|k| !OPTIONS.contains(k)));
            return Err(bad(format!(
                "unknown option {name:?} (options: {})",
                known.join(", ")
            )));
        }
    }
    let text = |key: &str| -> mlua::Result<Option<String>> {
        opts.get::<Option<String>>(key)
            .map_err(|_| bad(format!("option {key} must be a string")))
    };
    let number = |key: &str| -> mlua::Result<Option<f64>> {
        opts.get::<Option<f64>>(key)
            .map_err(|_| bad(format!("option {key} must be a number")))
    };
    ask.overrides = Overrides {
        use_type: text("use")?,
        provider: text("provider")?,
        model: text("model")?,
        key: text("key")?,
        base_url: text("base_url")?,
        timeout: number("timeout")?
            .map(|s| super::convert::seconds_option(who, "timeout", s).map(|_| s))
            .transpose()?,
        max_tokens: number("max_tokens")?
            .map(|n| super::convert::count_option(who, "max_tokens", n))
            .transpose()?,
        temperature: number("temperature")?
            .map(|t| super::convert::temperature_option(who, t))
            .transpose()?,
    };
    script_base_url(lua, who, ask.overrides.base_url.as_deref())?;
    ask.system = text("system")?;
    ask.tool_choice = match opts.get::<Value>("tool_choice")? {
        Value::Nil => ToolChoice::Auto,
        Value::String(s) => match s.to_str()?.as_ref() {
            "auto" => ToolChoice::Auto,
            "none" => ToolChoice::None,
            "required" | "any" => ToolChoice::Required,
            name => ToolChoice::Tool(name.to_string()),
        },
        Value::Table(t) => ToolChoice::Tool(
            t.get::<String>("name")
                .map_err(|_| bad("tool_choice table needs a name".into()))?,
        ),
        other => {
            return Err(bad(format!(
                "tool_choice cannot be a {}",
                other.type_name()
            )));
        }
    };
    ask.stop_sequences = match opts.get::<Value>("stop")? {
        Value::Nil => vec![],
        Value::String(s) => vec![s.to_string_lossy()],
        Value::Table(t) => t.sequence_values::<String>().collect::<mlua::Result<_>>()?,
        other => return Err(bad(format!("stop cannot be a {}", other.type_name()))),
    };
    ask.extra = match opts.get::<Value>("extra")? {
        Value::Nil => None,
        v @ Value::Table(_) => Some(to_json(lua, v)?),
        other => {
            return Err(bad(format!(
                "extra must be a table, not {}",
                other.type_name()
            )));
        }
    };
    let stream = match opts.get::<Value>("stream")? {
        Value::Nil | Value::Boolean(false) => None,
        Value::Function(f) => Some(f),
        Value::Boolean(true) => Some(lua.create_function(|_, _: Value| Ok(()))?),
        other => {
            return Err(bad(format!(
                "stream must be a function, not {}",
                other.type_name()
            )));
        }
    };
    Ok((ask, stream))
}

fn read_tool(lua: &Lua, tool: Value, n: usize) -> mlua::Result<ToolSpec> {
    let bad = |what: String| super::convert::misuse(what);
    let t = match tool {
        Value::Table(t) => t,
        Value::UserData(ud) => {
            let tool = ud
                .borrow::<super::tools::ToolValue>()
                .map_err(|_| bad(format!("tools[{n}] is not a tool")))?;
            return Ok(tool.0.spec.clone());
        }
        _ => return Err(bad(format!("tools[{n}] must be a table or an ai.tool"))),
    };
    let name: String = t
        .get("name")
        .map_err(|_| bad(format!("tools[{n}] needs a name")))?;
    let description: Option<String> = t.get("description")?;
    let parameters = match t.get::<Value>("parameters")? {
        Value::Nil => serde_json::json!({"type": "object", "properties": {}}),
        v => to_json(lua, v)?,
    };
    Ok(ToolSpec {
        name,
        description: description.unwrap_or_default(),
        parameters,
    })
}

fn providers(lua: &Lua) -> mlua::Result<Table> {
    let list = lua.create_table()?;
    for e in CATALOGUE {
        let t = lua.create_table()?;
        t.set("id", e.id)?;
        t.set("name", e.name)?;
        t.set("style", e.style.as_str())?;
        t.set("base_url", e.base_url)?;
        t.set("default_model", e.default_model)?;
        t.set("key_env", e.key_env)?;
        t.set(
            "tools",
            match e.tools {
                crate::providers::ToolsLevel::Native => "native",
                crate::providers::ToolsLevel::Text => "text",
                crate::providers::ToolsLevel::None => "none",
            },
        )?;
        list.push(t)?;
    }
    Ok(list)
}

/// `models, err = ai.models{ provider, key?, base_url? }` (or `ai.models("openai")`).
async fn models(lua: &Lua, opts: Value) -> mlua::Result<MultiValue> {
    let mut overrides = Overrides::default();
    match opts {
        Value::String(s) => overrides.provider = Some(s.to_string_lossy()),
        Value::Table(t) => {
            // A misspelt option (`bse_url`) listed the configured server's models unsaid.
            super::convert::check_fields(&t, "ai.models", &["provider", "key", "base_url", "use"])?;
            overrides.provider = t.get("provider")?;
            overrides.key = t.get("key")?;
            overrides.base_url = t.get("base_url")?;
            overrides.use_type = t.get("use")?;
            script_base_url(lua, "ai.models", overrides.base_url.as_deref())?;
        }
        Value::Nil => {}
        other => {
            return Err(super::convert::misuse(format!(
                "ai.models: expected {{ provider = ... }}, not {}",
                other.type_name()
            )));
        }
    }
    let core = core(lua);
    let resolved = match core.resolve(&overrides) {
        Ok(r) => r,
        Err(e) => return failure(lua, &e),
    };
    match core.providers().models(&resolved.endpoint).await {
        Ok(ids) => {
            let list = lua.create_sequence_from(ids)?;
            Ok(MultiValue::from_iter([Value::Table(list)]))
        }
        Err(e) => failure(lua, &e),
    }
}
