//! The body of a `generateContent` request: contents, the system instruction, the generation
//! config, tools and the opaque data that goes back beside each part.

use std::collections::{HashMap, HashSet};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value, json};

use super::opaque::{SIGNATURE, SKIP_SIGNATURE, beside, gemini_fields, id_from_model};
use super::schema::gemini_schema;
use crate::providers::{Endpoint, merge_extra};
use crate::vocab::{InferRequest, Message, Part, Role, ToolCall, ToolChoice, ToolResult, ToolSpec};

/// `gemini-2.5-flash` -> `models/gemini-2.5-flash`; a name that already is a resource path
/// (`models/x`, `tunedModels/y`) is used as it is, so the prefix is never doubled.
pub(super) fn model_path(model: &str) -> String {
    if model.contains('/') {
        model.to_string()
    } else {
        format!("models/{model}")
    }
}

/// The key goes in a header: a URL ends up in logs and error messages, a header does not.
pub(super) fn key_headers(ep: &Endpoint) -> Vec<(String, String)> {
    ep.key
        .iter()
        .map(|key| ("x-goog-api-key".to_string(), key.clone()))
        .collect()
}

pub(super) fn request_body(req: &InferRequest) -> Value {
    let mut body = Map::new();
    body.insert("contents".into(), Value::Array(contents(req)));
    if let Some(system) = system_instruction(req) {
        body.insert("systemInstruction".into(), system);
    }
    let config = generation_config(req);
    if !config.is_empty() {
        body.insert("generationConfig".into(), Value::Object(config));
    }
    if !req.tools.is_empty() {
        let declarations: Vec<Value> = req.tools.iter().map(declaration).collect();
        body.insert(
            "tools".into(),
            json!([{ "functionDeclarations": declarations }]),
        );
        body.insert("toolConfig".into(), tool_config(&req.tool_choice));
    }
    let mut body = Value::Object(body);
    merge_extra(&mut body, req.extra.as_ref());
    body
}

/// `req.system` first, then the text of every system message, one part each.
fn system_instruction(req: &InferRequest) -> Option<Value> {
    let from_messages = req
        .messages
        .iter()
        .filter(|m| m.role == Role::System)
        .map(Message::text);
    let parts: Vec<Value> = req
        .system
        .iter()
        .cloned()
        .chain(from_messages)
        .filter(|text| !text.is_empty())
        .map(|text| json!({ "text": text }))
        .collect();
    (!parts.is_empty()).then(|| json!({ "parts": parts }))
}

fn generation_config(req: &InferRequest) -> Map<String, Value> {
    let mut config = Map::new();
    if let Some(t) = req.temperature {
        config.insert("temperature".into(), json!(t));
    }
    if let Some(n) = req.max_tokens {
        config.insert("maxOutputTokens".into(), json!(n));
    }
    if !req.stop_sequences.is_empty() {
        config.insert("stopSequences".into(), json!(req.stop_sequences));
    }
    if let Some(schema) = &req.response_schema {
        // `responseJsonSchema` takes ordinary JSON Schema as it is (`$defs`, `$ref`, `anyOf`,
        // `additionalProperties`, lower-case types...), unlike `responseSchema`, which takes
        // the OpenAPI subset that [`gemini_schema`] cuts tool parameters down to. Google
        // documents it as "an alternative to `response_schema` that accepts JSON Schema ... If
        // set, `response_schema` must be omitted, but `response_mime_type` is required", and
        // keywords outside its supported list may be sent. Gemini has no schema name.
        config.insert("responseMimeType".into(), json!("application/json"));
        config.insert("responseJsonSchema".into(), schema.schema.clone());
    }
    config
}

fn tool_config(choice: &ToolChoice) -> Value {
    let config = match choice {
        ToolChoice::Auto => json!({ "mode": "AUTO" }),
        ToolChoice::None => json!({ "mode": "NONE" }),
        ToolChoice::Required => json!({ "mode": "ANY" }),
        ToolChoice::Tool(name) => json!({ "mode": "ANY", "allowedFunctionNames": [name] }),
    };
    json!({ "functionCallingConfig": config })
}

fn declaration(tool: &ToolSpec) -> Value {
    let mut decl = Map::new();
    decl.insert("name".into(), json!(tool.name));
    if !tool.description.is_empty() {
        decl.insert("description".into(), json!(tool.description));
    }
    if let Some(parameters) = gemini_schema(&tool.parameters) {
        decl.insert("parameters".into(), parameters);
    }
    Value::Object(decl)
}

/// What the history says about tool calls, needed to write their results.
struct History<'a> {
    /// Calls whose `id` goes on the wire (the model gave it); their results name it too.
    wire_ids: HashSet<&'a str>,
    /// Call id -> tool name, for a result that does not name its tool.
    names: HashMap<&'a str, &'a str>,
}

impl<'a> History<'a> {
    fn of(messages: &'a [Message]) -> History<'a> {
        let calls = messages.iter().flat_map(Message::tool_calls);
        let mut history = History {
            wire_ids: HashSet::new(),
            names: HashMap::new(),
        };
        for call in calls {
            if id_from_model(call) {
                history.wire_ids.insert(&call.id);
            }
            history.names.insert(&call.id, &call.name);
        }
        history
    }
}

fn contents(req: &InferRequest) -> Vec<Value> {
    let history = History::of(&req.messages);
    let mut contents: Vec<(&str, Vec<Value>)> = Vec::new();
    for message in &req.messages {
        let role = match message.role {
            Role::System => continue,
            Role::Assistant => "model",
            Role::User | Role::Tool => "user",
        };
        let parts: Vec<Value> = message
            .parts
            .iter()
            .filter_map(|p| wire_part(p, &history))
            .collect();
        if parts.is_empty() {
            // Gemini rejects a content without parts.
            continue;
        }
        match contents.last_mut() {
            Some((last, existing)) if *last == role => existing.extend(parts),
            _ => contents.push((role, parts)),
        }
    }
    if validates_signatures(&req.model) {
        sign_unsigned_steps(&mut contents);
    }
    contents
        .into_iter()
        .map(|(role, parts)| json!({ "role": role, "parts": parts }))
        .collect()
}

fn wire_part(part: &Part, history: &History) -> Option<Value> {
    match part {
        Part::Text { text, opaque } => {
            let fields = gemini_fields(opaque.as_ref()).filter(|f| !f.is_empty());
            if text.is_empty() && fields.is_none() {
                // Gemini rejects an empty text part that carries nothing else.
                return None;
            }
            Some(beside(json!({ "text": text }), fields))
        }
        // Reasoning only goes back to the style that produced it, where it is a thought part.
        Part::Reasoning { text, opaque } => {
            let mut fields = gemini_fields(opaque.as_ref())?;
            fields.insert("thought".into(), json!(true));
            Some(beside(json!({ "text": text }), Some(fields)))
        }
        Part::ToolCall(call) => Some(function_call(call)),
        Part::ToolResult(result) => Some(function_response(result, history)),
        // Only what the file renderer left as a file (a type Gemini documents) reaches here.
        Part::File(file) => file.data.as_deref().map(|data| {
            json!({ "inlineData": { "mimeType": file.content_type, "data": STANDARD.encode(data) } })
        }),
    }
}

fn function_call(call: &ToolCall) -> Value {
    let mut wire = Map::new();
    wire.insert("name".into(), json!(call.name));
    wire.insert("args".into(), args_object(&call.arguments));
    if id_from_model(call) {
        wire.insert("id".into(), json!(call.id));
    }
    beside(
        json!({ "functionCall": wire }),
        gemini_fields(call.opaque.as_ref()),
    )
}

/// Gemini's `args` must be an object. Arguments from another style may not be one: a JSON value
/// that is not an object goes as `{"value": v}`, text that is not JSON as `{"raw": text}`, so
/// the request stays valid and nothing the model wrote is lost.
pub(super) fn args_object(arguments: &str) -> Value {
    if arguments.trim().is_empty() {
        return json!({});
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(object @ Value::Object(_)) => object,
        Ok(other) => json!({ "value": other }),
        Err(_) => json!({ "raw": arguments }),
    }
}

fn function_response(result: &ToolResult, history: &History) -> Value {
    let content = serde_json::from_str::<Value>(&result.content)
        .unwrap_or_else(|_| Value::String(result.content.clone()));
    let key = if result.is_error { "error" } else { "result" };
    let name = if result.name.is_empty() {
        history
            .names
            .get(result.call_id.as_str())
            .copied()
            .unwrap_or_default()
    } else {
        &result.name
    };
    let mut wire = Map::new();
    wire.insert("name".into(), json!(name));
    wire.insert("response".into(), json!({ key: content }));
    if history.wire_ids.contains(result.call_id.as_str()) {
        wire.insert("id".into(), json!(result.call_id));
    }
    json!({ "functionResponse": wire })
}

/// Gemini 3 and later refuse function calls of the current turn that carry no signature.
pub(super) fn validates_signatures(model: &str) -> bool {
    let name = model.rsplit('/').next().unwrap_or(model);
    let Some(version) = name.strip_prefix("gemini-") else {
        return false;
    };
    let major: String = version.chars().take_while(char::is_ascii_digit).collect();
    major.parse::<u32>().is_ok_and(|v| v >= 3)
}

/// Gives the first call of each unsigned step of the current turn Google's placeholder
/// signature. The current turn starts after the last user content that is more than tool
/// results; only it is validated, and the placeholder costs answer quality, so it is used no
/// further than needed.
fn sign_unsigned_steps(contents: &mut [(&str, Vec<Value>)]) {
    let turn_start = contents
        .iter()
        .rposition(|(role, parts)| {
            *role == "user" && parts.iter().any(|p| p.get("functionResponse").is_none())
        })
        .map_or(0, |i| i + 1);
    for (role, parts) in &mut contents[turn_start..] {
        if *role != "model" {
            continue;
        }
        let mut calls = parts.iter_mut().filter(|p| p.get("functionCall").is_some());
        let Some(first) = calls.next() else {
            continue;
        };
        let signed = first.get(SIGNATURE).is_some() || calls.any(|p| p.get(SIGNATURE).is_some());
        if !signed && let Value::Object(first) = first {
            first.insert(SIGNATURE.into(), json!(SKIP_SIGNATURE));
        }
    }
}
