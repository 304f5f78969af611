//! The gemini wire style: Google's `generateContent` / `streamGenerateContent?alt=sse`.
//!
//! # Requests
//! `POST {base_url}/models/{model}:generateContent` (or `:streamGenerateContent?alt=sse`), the key
//! in the `x-goog-api-key` header, never in the URL. Neutral messages become `contents` entries:
//! assistant -> `model`, user and tool -> `user`, and consecutive messages of one wire role share
//! one entry (so the results of one step travel as one content with several `functionResponse`
//! parts). `req.system` and every `Role::System` message become parts of `systemInstruction`.
//! Tool results are `{"functionResponse":{name, response:{"result": ...}}}` (`"error"` when
//! `is_error`), the content parsed as JSON when it is JSON and sent as a string otherwise.
//! `parameters` are cut down to what Gemini's `Schema` accepts, see [`gemini_schema`].
//! Structured output ([`InferRequest::response_schema`]) sets `generationConfig.responseMimeType`
//! to `application/json` and `generationConfig.responseJsonSchema` to the schema, unchanged.
//!
//! # Responses
//! | `finishReason` | [`Stop`] |
//! |---|---|
//! | `STOP` | `EndTurn`, or `ToolUse` when the answer holds function calls |
//! | `MAX_TOKENS` | `MaxTokens` |
//! | `SAFETY`, `RECITATION`, `BLOCKLIST`, `PROHIBITED_CONTENT`, `SPII`, `LANGUAGE`, `IMAGE_*` filters | `ContentFilter` |
//! | `MALFORMED_FUNCTION_CALL`, `OTHER`, anything else | `Error`, `finishMessage` (or the reason) appended as a text part, not streamed as a delta |
//! | none, prompt blocked (`promptFeedback.blockReason`, no candidates) | `ContentFilter`, empty text |
//! | none, stream cut | [`ProviderError::Fetch`] "the stream ended before a finishReason" |
//!
//! `MALFORMED_FUNCTION_CALL` is an answer, not a [`ProviderError`]: the request was fine and the
//! same request may well succeed, and the `finishMessage` (the call the model botched) is what the
//! caller needs to see or feed back, so it is kept as the message's text with `Stop::Error`.
//!
//! Usage: `input` = `promptTokenCount` + `toolUsePromptTokenCount` (cached tokens included, as
//! Gemini counts them); `output` = `candidatesTokenCount` + `thoughtsTokenCount`, because Gemini
//! bills thoughts as output and the other styles' output counts include reasoning too;
//! `reasoning` = `thoughtsTokenCount` (a part of `output`); `cache_read` =
//! `cachedContentTokenCount`; `cache_write` = 0 (Gemini creates caches through a separate API).
//! In a stream each chunk repeats the running totals, so the latest `usageMetadata` wins.
//!
//! # Opaque data
//! Gemini wants some fields beside a part back exactly as it sent them (`thoughtSignature`; the
//! `thought: true` flag of a thought part). Whatever a part carries besides its `text` or
//! `functionCall` is kept verbatim as [`Opaque`] `{ style: Gemini, data: {field: value, ...} }` on
//! the neutral part and put back beside the part on the next request; opaque data of another
//! style is dropped. Every tool call parsed here carries a Gemini opaque (possibly `{}`): when the
//! model gave no `id`, colony makes one up and notes `"syntheticId": true` in it (colony's own key,
//! never sent), and a `functionCall.id` goes back only for calls whose Gemini opaque does not say
//! so. A call from another style therefore goes back without an id too; Gemini then matches
//! results by name and order.
//!
//! Thought parts become [`Part::Reasoning`] and are sent back as thought parts. Streamed pieces
//! of one text (or thought) run are joined into one part until a piece carrying a
//! `thoughtSignature` closes the run: the signature, which Gemini streams in the run's last piece
//! (often an empty one), then sits on the joined part, as in the unstreamed answer.
//!
//! Gemini 3 rejects a step whose function calls carry no signature in the current turn (a
//! conversation moved over from another provider). For those models only, the first call of such
//! a step gets Google's documented `skip_thought_signature_validator` placeholder; a parallel
//! batch whose first call is signed is left as it came (only the first call of a batch is signed).
//! "Gemini 3 or later" is read from the model name (`gemini-N...`, N >= 3); an alias such as
//! `gemini-flash-latest` is not recognised.

use std::collections::{HashMap, HashSet};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};

use super::{Assembler, Codec, Endpoint, ProviderError, WireRequest, errors, merge_extra};
use crate::vocab::{
    InferRequest, Inferred, Message, Opaque, Part, Role, Stop, Style, ToolCall, ToolChoice,
    ToolResult, ToolSpec, Usage,
};

pub struct Gemini;

/// The part field Gemini wants back unchanged.
const SIGNATURE: &str = "thoughtSignature";
/// Colony's own note in a tool call's opaque data: the id was made up here, not sent by the model.
const SYNTHETIC_ID: &str = "syntheticId";
/// Google's documented placeholder for a function call that has no real signature.
const SKIP_SIGNATURE: &str = "skip_thought_signature_validator";

impl Codec for Gemini {
    fn request(&self, req: &InferRequest, ep: &Endpoint, stream: bool) -> WireRequest {
        let method = if stream {
            "streamGenerateContent?alt=sse"
        } else {
            "generateContent"
        };
        WireRequest {
            url: format!("{}/{}:{method}", ep.base(), model_path(&req.model)),
            headers: key_headers(ep),
            body: request_body(req),
        }
    }

    fn parse(&self, body: &[u8]) -> Result<Inferred, ProviderError> {
        let value: Value = serde_json::from_slice(body)
            .map_err(|e| ProviderError::Parse(format!("the Gemini response is not JSON: {e}")))?;
        let mut answer = Answer::default();
        answer.responses(&value, &mut |_| {})?;
        answer.finish(false)
    }

    fn assembler(&self) -> Box<dyn Assembler> {
        Box::new(GeminiStream::default())
    }

    fn models_request(&self, ep: &Endpoint) -> WireRequest {
        WireRequest {
            url: format!("{}/models?pageSize=1000", ep.base()),
            headers: key_headers(ep),
            body: Value::Null,
        }
    }

    /// Model ids without the `models/` prefix. Models that list their generation methods and
    /// cannot `generateContent` (embedding, AQA) are left out: they cannot answer a chat.
    fn parse_models(&self, body: &Value) -> Vec<String> {
        body.get("models")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|m| {
                m.get("supportedGenerationMethods")
                    .and_then(Value::as_array)
                    .is_none_or(|methods| methods.iter().any(|x| x == "generateContent"))
            })
            .filter_map(|m| m.get("name").and_then(Value::as_str))
            .map(|name| name.strip_prefix("models/").unwrap_or(name).to_string())
            .collect()
    }
}

// ---------------------------------------------------------------------------------------------
// Requests

/// `gemini-2.5-flash` -> `models/gemini-2.5-flash`; a name that already is a resource path
/// (`models/x`, `tunedModels/y`) is used as it is, so the prefix is never doubled.
fn model_path(model: &str) -> String {
    if model.contains('/') {
        model.to_string()
    } else {
        format!("models/{model}")
    }
}

/// The key goes in a header: a URL ends up in logs and error messages, a header does not.
fn key_headers(ep: &Endpoint) -> Vec<(String, String)> {
    ep.key
        .iter()
        .map(|key| ("x-goog-api-key".to_string(), key.clone()))
        .collect()
}

fn request_body(req: &InferRequest) -> Value {
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

/// The wire fields kept beside a part, if the opaque data is Gemini's own.
fn gemini_fields(opaque: Option<&Opaque>) -> Option<Map<String, Value>> {
    let opaque = opaque.filter(|o| o.style == Style::Gemini)?;
    let mut fields = opaque.data.as_object()?.clone();
    fields.remove(SYNTHETIC_ID);
    Some(fields)
}

fn beside(mut part: Value, fields: Option<Map<String, Value>>) -> Value {
    if let (Value::Object(target), Some(fields)) = (&mut part, fields) {
        target.extend(fields);
    }
    part
}

/// The model gave this call its id (rather than colony making one up, or another style).
fn id_from_model(call: &ToolCall) -> bool {
    call.opaque.as_ref().is_some_and(|o| {
        o.style == Style::Gemini && o.data.get(SYNTHETIC_ID) != Some(&Value::Bool(true))
    }) && !call.id.is_empty()
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
fn args_object(arguments: &str) -> Value {
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
fn validates_signatures(model: &str) -> bool {
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

// ---------------------------------------------------------------------------------------------
// Tool schemas

/// The keys of Gemini's `Schema` (a subset of OpenAPI 3.0). `parameters` is parsed as that
/// message, so any other key is a 400 "Unknown name".
const SCHEMA_KEYS: &[&str] = &[
    "type",
    "format",
    "title",
    "description",
    "nullable",
    "enum",
    "default",
    "example",
    "items",
    "minItems",
    "maxItems",
    "properties",
    "required",
    "minProperties",
    "maxProperties",
    "minLength",
    "maxLength",
    "pattern",
    "minimum",
    "maximum",
    "anyOf",
    "propertyOrdering",
];

/// How many `$ref`s are followed along one path; a recursive type ends in an unconstrained schema
/// there.
const MAX_REF_DEPTH: usize = 8;

/// A JSON Schema cut down to what Gemini's `parameters` accepts, or `None` for an object with no
/// properties (Gemini rejects an `OBJECT` without properties; a tool without parameters simply
/// has none).
///
/// Applied recursively through `properties` values, `items` and `anyOf`, never to the property
/// names themselves:
/// - kept: the keys of `SCHEMA_KEYS`; everything else is stripped, notably `$schema`, `$id`,
///   `additionalProperties`, `$comment`, `examples`, `not`, `if`/`then`/`else`,
///   `patternProperties`, `exclusiveMinimum`/`exclusiveMaximum`, `multipleOf`, `uniqueItems`;
/// - local `$ref`s (`#/$defs/X`, `#/definitions/X`) are inlined (siblings win) and the
///   definitions dropped; `allOf` is merged into its parent; `oneOf` becomes `anyOf`;
/// - `type: [T, "null"]` and an `anyOf` member `{type: "null"}` become `nullable: true`;
/// - `const: "x"` becomes `enum: ["x"]`; an `enum` that is not all strings is dropped (Gemini
///   enums are strings);
/// - `format` is kept only where Gemini knows it (`enum`, `date-time` for strings; `float`,
///   `double`, `int32`, `int64` for numbers), since others (`uri`, `email`) are refused;
/// - `required` keeps only names that are among the `properties`.
pub fn gemini_schema(schema: &Value) -> Option<Value> {
    let defs = Definitions::of(schema);
    let out = defs.convert(schema, 0);
    let empty_object = out.get("type").is_none_or(|t| t == "object")
        && out
            .get("properties")
            .and_then(Value::as_object)
            .is_none_or(Map::is_empty)
        && out.get("anyOf").is_none();
    (!empty_object).then_some(out)
}

struct Definitions<'a> {
    defs: Option<&'a Map<String, Value>>,
    definitions: Option<&'a Map<String, Value>>,
}

impl<'a> Definitions<'a> {
    fn of(root: &'a Value) -> Definitions<'a> {
        Definitions {
            defs: root.get("$defs").and_then(Value::as_object),
            definitions: root.get("definitions").and_then(Value::as_object),
        }
    }

    fn lookup(&self, reference: &str) -> Option<&'a Value> {
        if let Some(name) = reference.strip_prefix("#/$defs/") {
            return self.defs?.get(name);
        }
        self.definitions?
            .get(reference.strip_prefix("#/definitions/")?)
    }

    /// The schema with `$ref` and `allOf` resolved into one flat object, and how many `$ref`s
    /// were followed to get there (counted along the path, so a recursive type stops).
    fn flatten(&self, schema: &Value, refs: usize) -> (Map<String, Value>, usize) {
        let Some(source) = schema.as_object() else {
            // `true` and other non-object schemas accept anything.
            return (Map::new(), refs);
        };
        let mut flat = Map::new();
        let mut followed = refs;
        if let Some(reference) = source.get("$ref").and_then(Value::as_str)
            && refs < MAX_REF_DEPTH
            && let Some(target) = self.lookup(reference)
        {
            (flat, followed) = self.flatten(target, refs + 1);
        }
        for (key, value) in source {
            if key != "$ref" && key != "allOf" {
                flat.insert(key.clone(), value.clone());
            }
        }
        for member in source
            .get("allOf")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let (member, member_refs) = self.flatten(member, refs);
            followed = followed.max(member_refs);
            merge_schema(&mut flat, member);
        }
        (flat, followed)
    }

    fn convert(&self, schema: &Value, refs: usize) -> Value {
        let (flat, refs) = self.flatten(schema, refs);
        let mut out = Map::new();
        for (key, value) in &flat {
            match key.as_str() {
                "type" => convert_type(value, &mut out),
                "properties" => {
                    let properties: Map<String, Value> = value
                        .as_object()
                        .into_iter()
                        .flatten()
                        .map(|(name, prop)| (name.clone(), self.convert(prop, refs)))
                        .collect();
                    out.insert(key.clone(), Value::Object(properties));
                }
                "items" => {
                    // A tuple (`items: [...]`) has no Gemini form: its first member stands in.
                    let item = value.as_array().and_then(|a| a.first()).unwrap_or(value);
                    out.insert(key.clone(), self.convert(item, refs));
                }
                "anyOf" | "oneOf" => self.convert_any_of(value, refs, &mut out),
                "const" if value.is_string() => {
                    out.insert("enum".into(), json!([value]));
                }
                "enum"
                    if value
                        .as_array()
                        .is_some_and(|a| a.iter().all(Value::is_string)) =>
                {
                    out.insert(key.clone(), value.clone());
                }
                "enum" | "format" => {}
                _ if SCHEMA_KEYS.contains(&key.as_str()) => {
                    out.insert(key.clone(), value.clone());
                }
                _ => {}
            }
        }
        if let Some(format) = flat.get("format").and_then(Value::as_str)
            && format_known(out.get("type").and_then(Value::as_str), format)
        {
            out.insert("format".into(), json!(format));
        }
        keep_defined_required(&mut out);
        Value::Object(out)
    }

    fn convert_any_of(&self, members: &Value, refs: usize, out: &mut Map<String, Value>) {
        let members = members.as_array().map(Vec::as_slice).unwrap_or_default();
        let mut kept: Vec<Value> = Vec::new();
        for member in members {
            if member.get("type").is_some_and(|t| t == "null") {
                out.insert("nullable".into(), json!(true));
            } else {
                kept.push(self.convert(member, refs));
            }
        }
        match kept.len() {
            0 => {}
            1 => {
                if let Some(Value::Object(only)) = kept.pop() {
                    for (k, v) in only {
                        out.entry(k).or_insert(v);
                    }
                }
            }
            _ => {
                out.insert("anyOf".into(), Value::Array(kept));
            }
        }
    }
}

/// `allOf` members add their properties and requirements; other keys already set stay.
fn merge_schema(target: &mut Map<String, Value>, member: Map<String, Value>) {
    for (key, value) in member {
        match (key.as_str(), target.get_mut(&key), value) {
            ("properties", Some(Value::Object(props)), Value::Object(more)) => props.extend(more),
            ("required", Some(Value::Array(names)), Value::Array(more)) => {
                for name in more {
                    if !names.contains(&name) {
                        names.push(name);
                    }
                }
            }
            (_, None, value) => {
                target.insert(key, value);
            }
            _ => {}
        }
    }
}

fn convert_type(value: &Value, out: &mut Map<String, Value>) {
    let Some(types) = value.as_array() else {
        out.insert("type".into(), value.clone());
        return;
    };
    let real: Vec<&Value> = types.iter().filter(|t| *t != "null").collect();
    if real.len() < types.len() {
        out.insert("nullable".into(), json!(true));
    }
    match real.as_slice() {
        [] => {}
        [one] => {
            out.insert("type".into(), (*one).clone());
        }
        many => {
            let any_of: Vec<Value> = many.iter().map(|t| json!({ "type": t })).collect();
            out.insert("anyOf".into(), Value::Array(any_of));
        }
    }
}

fn format_known(kind: Option<&str>, format: &str) -> bool {
    match kind {
        Some("string") => matches!(format, "enum" | "date-time"),
        Some("number") => matches!(format, "float" | "double"),
        Some("integer") => matches!(format, "int32" | "int64"),
        _ => false,
    }
}

fn keep_defined_required(schema: &mut Map<String, Value>) {
    let defined: HashSet<String> = schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    if let Some(Value::Array(required)) = schema.get_mut("required") {
        required.retain(|name| name.as_str().is_some_and(|n| defined.contains(n)));
        if required.is_empty() {
            schema.remove("required");
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Responses

/// Builds one answer from one response object, an array of them (`streamGenerateContent`
/// without `alt=sse`), or the events of a stream: all are the same `GenerateContentResponse`s.
#[derive(Default)]
struct Answer {
    parts: Vec<Part>,
    /// A function call whose arguments are still streaming (`willContinue`, `partialArgs`).
    open_call: Option<StreamedCall>,
    saw_candidate: bool,
    finish_reason: Option<String>,
    finish_message: Option<String>,
    block_reason: Option<String>,
    usage: Usage,
    model: Option<String>,
}

impl Answer {
    fn responses(
        &mut self,
        value: &Value,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<(), ProviderError> {
        match value {
            Value::Array(items) => items
                .iter()
                .try_for_each(|item| self.response(item, on_text)),
            other => self.response(other, on_text),
        }
    }

    fn response(
        &mut self,
        response: &Value,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<(), ProviderError> {
        let Some(fields) = response.as_object() else {
            return Err(parse_error("a response is not a JSON object"));
        };
        if fields.contains_key("error") {
            return Err(errors::classify_stream_error(response));
        }
        if let Some(usage) = fields.get("usageMetadata") {
            self.usage = read_usage(usage);
        }
        if let Some(model) = fields.get("modelVersion").and_then(Value::as_str) {
            self.model = Some(model.to_string());
        }
        if let Some(reason) = fields
            .get("promptFeedback")
            .and_then(|f| f.get("blockReason"))
            .and_then(Value::as_str)
        {
            self.block_reason = Some(reason.to_string());
        }
        let Some(candidate) = first_candidate(fields)? else {
            return Ok(());
        };
        self.saw_candidate = true;
        if let Some(parts) = candidate.get("content").and_then(|c| c.get("parts")) {
            let parts = parts
                .as_array()
                .ok_or_else(|| parse_error("content.parts is not an array"))?;
            for part in parts {
                self.part(part, on_text)?;
            }
        }
        if let Some(reason) = candidate.get("finishReason").and_then(Value::as_str) {
            self.finish_reason = Some(reason.to_string());
        }
        if let Some(message) = candidate.get("finishMessage").and_then(Value::as_str) {
            self.finish_message = Some(message.to_string());
        }
        Ok(())
    }

    fn part(&mut self, part: &Value, on_text: &mut dyn FnMut(&str)) -> Result<(), ProviderError> {
        let Some(fields) = part.as_object() else {
            return Err(parse_error("a part is not a JSON object"));
        };
        if let Some(call) = fields.get("functionCall") {
            return self.function_call(call, fields_beside(fields, "functionCall"));
        }
        let Some(text) = fields.get("text") else {
            // Parts colony does not model (inline data, code execution) are left out.
            return Ok(());
        };
        let text = text
            .as_str()
            .ok_or_else(|| parse_error("a part's text is not a string"))?;
        let extra = fields_beside(fields, "text");
        let thought = extra.get("thought") == Some(&Value::Bool(true));
        if !thought && !text.is_empty() {
            on_text(text);
        }
        self.close_call();
        self.text(text, extra, thought);
        Ok(())
    }

    /// Adds a text or thought piece, continuing the last part when it is an unsigned run of the
    /// same kind.
    fn text(&mut self, text: &str, extra: Map<String, Value>, thought: bool) {
        if text.is_empty() && extra.is_empty() {
            return;
        }
        let run = match self.parts.last_mut() {
            Some(Part::Text { text, opaque }) if !thought => Some((text, opaque)),
            Some(Part::Reasoning { text, opaque }) if thought => Some((text, opaque)),
            _ => None,
        };
        if let Some((run_text, opaque)) = run
            && !signed(opaque.as_ref())
        {
            run_text.push_str(text);
            if !extra.is_empty() {
                match opaque {
                    Some(Opaque {
                        data: Value::Object(data),
                        ..
                    }) => data.extend(extra),
                    _ => *opaque = Some(gemini_opaque(extra)),
                }
            }
            return;
        }
        let opaque = (!extra.is_empty()).then(|| gemini_opaque(extra));
        let text = text.to_string();
        self.parts.push(if thought {
            Part::Reasoning { text, opaque }
        } else {
            Part::Text { text, opaque }
        });
    }

    fn function_call(
        &mut self,
        call: &Value,
        extra: Map<String, Value>,
    ) -> Result<(), ProviderError> {
        let Some(call) = call.as_object() else {
            return Err(parse_error("functionCall is not a JSON object"));
        };
        let name = match call.get("name") {
            Some(name) => Some(
                name.as_str()
                    .ok_or_else(|| parse_error("functionCall.name is not a string"))?,
            ),
            None => None,
        };
        let id = call.get("id").and_then(Value::as_str);
        let will_continue = call.get("willContinue") == Some(&Value::Bool(true));
        let partial = call.get("partialArgs");
        match name {
            // The start of a call whose arguments stream in the parts that follow.
            Some(name) if will_continue || partial.is_some() => {
                self.close_call();
                let mut open = StreamedCall::new(name, id, extra);
                if let Some(partial) = partial {
                    open.apply(partial)?;
                }
                self.open_call = Some(open);
                if !will_continue && partial.is_some_and(all_complete) {
                    self.close_call();
                }
            }
            // A whole call.
            Some(name) => {
                self.close_call();
                let args = match call.get("args") {
                    None | Some(Value::Null) => Value::Object(Map::new()),
                    Some(args @ Value::Object(_)) => args.clone(),
                    Some(_) => return Err(parse_error("functionCall.args is not an object")),
                };
                self.parts
                    .push(Part::ToolCall(tool_call(name, id, &args, extra)));
            }
            // More arguments for the open call, or its end (`"functionCall": {}`).
            None => {
                if let Some(partial) = partial {
                    let open = self.open_call.as_mut().ok_or_else(|| {
                        parse_error("functionCall.partialArgs came with no call open")
                    })?;
                    open.apply(partial)?;
                    open.extra.extend(extra);
                    if !will_continue && all_complete(partial) {
                        self.close_call();
                    }
                } else if !will_continue {
                    self.close_call();
                }
            }
        }
        Ok(())
    }

    fn close_call(&mut self) {
        if let Some(open) = self.open_call.take() {
            let call = tool_call(&open.name, open.id.as_deref(), &open.args, open.extra);
            self.parts.push(Part::ToolCall(call));
        }
    }

    /// The answer; `streamed` says a missing `finishReason` means the stream was cut.
    fn finish(mut self, streamed: bool) -> Result<Inferred, ProviderError> {
        self.close_call();
        let has_calls = self.parts.iter().any(|p| matches!(p, Part::ToolCall(_)));
        let stop = match (&self.finish_reason, &self.block_reason) {
            (Some(reason), _) => stop_reason(reason, has_calls),
            (None, Some(_)) => Stop::ContentFilter,
            (None, None) if streamed => {
                return Err(ProviderError::Fetch(
                    "the stream ended before a finishReason".into(),
                ));
            }
            (None, None) if !self.saw_candidate => {
                return Err(parse_error(
                    "the response has no candidates and no promptFeedback.blockReason",
                ));
            }
            (None, None) if has_calls => Stop::ToolUse,
            (None, None) => Stop::EndTurn,
        };
        if stop == Stop::Error {
            let note = self.finish_message.clone().unwrap_or_else(|| {
                format!(
                    "the model stopped: {}",
                    self.finish_reason.as_deref().unwrap_or("unknown reason")
                )
            });
            self.parts.push(Part::text(note));
        }
        Ok(Inferred {
            message: Message::new(Role::Assistant, self.parts),
            stop,
            usage: self.usage,
            model: self.model,
        })
    }
}

fn parse_error(what: &str) -> ProviderError {
    ProviderError::Parse(format!("Gemini: {what}"))
}

/// The candidate answering this request (colony asks for one): index 0.
fn first_candidate(fields: &Map<String, Value>) -> Result<Option<&Value>, ProviderError> {
    let Some(candidates) = fields.get("candidates") else {
        return Ok(None);
    };
    let candidates = candidates
        .as_array()
        .ok_or_else(|| parse_error("candidates is not an array"))?;
    Ok(candidates
        .iter()
        .find(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0))
}

/// A part's fields other than its content: what has to go back beside it unchanged.
fn fields_beside(part: &Map<String, Value>, content_key: &str) -> Map<String, Value> {
    part.iter()
        .filter(|(k, _)| *k != content_key)
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect()
}

fn gemini_opaque(data: Map<String, Value>) -> Opaque {
    Opaque {
        style: Style::Gemini,
        data: Value::Object(data),
    }
}

fn signed(opaque: Option<&Opaque>) -> bool {
    opaque.is_some_and(|o| o.data.get(SIGNATURE).is_some())
}

fn tool_call(
    name: &str,
    id: Option<&str>,
    args: &Value,
    mut extra: Map<String, Value>,
) -> ToolCall {
    let id = match id.filter(|id| !id.is_empty()) {
        Some(id) => id.to_string(),
        None => {
            extra.insert(SYNTHETIC_ID.into(), json!(true));
            synthetic_id()
        }
    };
    ToolCall {
        id,
        name: name.to_string(),
        arguments: args.to_string(),
        opaque: Some(gemini_opaque(extra)),
    }
}

/// An id for a call the model sent without one. It never goes on the wire, but it must not
/// repeat within a conversation, which may later move to a style that insists on unique ids.
fn synthetic_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let millis = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis())
        .unwrap_or_default();
    format!("gemini_{millis:x}_{n}")
}

fn stop_reason(reason: &str, has_calls: bool) -> Stop {
    match reason {
        "STOP" if has_calls => Stop::ToolUse,
        "STOP" => Stop::EndTurn,
        "MAX_TOKENS" => Stop::MaxTokens,
        "SAFETY"
        | "RECITATION"
        | "BLOCKLIST"
        | "PROHIBITED_CONTENT"
        | "SPII"
        | "LANGUAGE"
        | "IMAGE_SAFETY"
        | "IMAGE_PROHIBITED_CONTENT"
        | "IMAGE_RECITATION" => Stop::ContentFilter,
        _ => Stop::Error,
    }
}

fn read_usage(meta: &Value) -> Usage {
    let count = |key: &str| meta.get(key).and_then(Value::as_u64).unwrap_or(0);
    let reasoning = count("thoughtsTokenCount");
    Usage {
        input: count("promptTokenCount") + count("toolUsePromptTokenCount"),
        output: count("candidatesTokenCount") + reasoning,
        cache_read: count("cachedContentTokenCount"),
        cache_write: 0,
        reasoning,
    }
}

// ---------------------------------------------------------------------------------------------
// Streamed function-call arguments (Vertex `streamFunctionCallArguments`)

/// A call whose arguments arrive as `partialArgs` entries: `{jsonPath: "$.a.b[0]", stringValue |
/// numberValue | boolValue | nullValue, willContinue}`. A string with `willContinue` goes on in
/// the next entry for the same path.
struct StreamedCall {
    name: String,
    id: Option<String>,
    args: Value,
    extra: Map<String, Value>,
    open_string: Option<String>,
}

/// The longest array a partial argument may index into, so a bad index cannot exhaust memory.
const MAX_PARTIAL_INDEX: usize = 10_000;

#[derive(Debug, PartialEq)]
enum Step {
    Key(String),
    Index(usize),
}

impl StreamedCall {
    fn new(name: &str, id: Option<&str>, extra: Map<String, Value>) -> StreamedCall {
        StreamedCall {
            name: name.to_string(),
            id: id.map(str::to_string),
            args: Value::Object(Map::new()),
            extra,
            open_string: None,
        }
    }

    fn apply(&mut self, partial: &Value) -> Result<(), ProviderError> {
        let entries = partial
            .as_array()
            .ok_or_else(|| parse_error("functionCall.partialArgs is not an array"))?;
        for entry in entries {
            let path = entry
                .get("jsonPath")
                .and_then(Value::as_str)
                .ok_or_else(|| parse_error("a partialArgs entry has no jsonPath"))?;
            let steps = json_path(path)?;
            let continues = entry.get("willContinue") == Some(&Value::Bool(true));
            let slot = slot(&mut self.args, &steps)?;
            if let Some(piece) = entry.get("stringValue").and_then(Value::as_str) {
                match slot {
                    Value::String(s) if self.open_string.as_deref() == Some(path) => {
                        s.push_str(piece)
                    }
                    other => *other = json!(piece),
                }
                self.open_string = continues.then(|| path.to_string());
                continue;
            }
            *slot = if let Some(n) = entry.get("numberValue") {
                n.clone()
            } else if let Some(b) = entry.get("boolValue") {
                b.clone()
            } else if entry.get("nullValue").is_some() {
                Value::Null
            } else {
                return Err(parse_error(&format!(
                    "partialArgs entry {path} has no value"
                )));
            };
            self.open_string = None;
        }
        Ok(())
    }
}

fn all_complete(partial: &Value) -> bool {
    partial.as_array().is_some_and(|entries| {
        entries
            .iter()
            .all(|e| e.get("willContinue") != Some(&Value::Bool(true)))
    })
}

/// `$.recipe.ingredients[0].name`, `$['odd.key']` -> steps below the root object.
fn json_path(path: &str) -> Result<Vec<Step>, ProviderError> {
    let bad = || parse_error(&format!("cannot read the jsonPath {path:?}"));
    let mut rest = path.strip_prefix('$').ok_or_else(bad)?;
    let mut steps = Vec::new();
    while !rest.is_empty() {
        if let Some(after) = rest.strip_prefix('.') {
            let end = after.find(['.', '[']).unwrap_or(after.len());
            if end == 0 {
                return Err(bad());
            }
            steps.push(Step::Key(after[..end].to_string()));
            rest = &after[end..];
        } else if let Some(after) = rest.strip_prefix('[') {
            let end = after.find(']').ok_or_else(bad)?;
            let inside = &after[..end];
            let quoted = inside
                .strip_prefix('\'')
                .and_then(|s| s.strip_suffix('\''))
                .or_else(|| inside.strip_prefix('"').and_then(|s| s.strip_suffix('"')));
            steps.push(match quoted {
                Some(key) => Step::Key(key.to_string()),
                None => Step::Index(inside.parse().map_err(|_| bad())?),
            });
            rest = &after[end + 1..];
        } else {
            return Err(bad());
        }
    }
    if steps.is_empty() {
        return Err(bad());
    }
    Ok(steps)
}

/// The value at `steps` under `root`, creating objects and arrays on the way.
fn slot<'v>(root: &'v mut Value, steps: &[Step]) -> Result<&'v mut Value, ProviderError> {
    let mut current = root;
    for step in steps {
        current = match step {
            Step::Key(key) => {
                if current.is_null() {
                    *current = Value::Object(Map::new());
                }
                let Value::Object(map) = current else {
                    return Err(parse_error(&format!(
                        "partialArgs put key {key:?} into something not an object"
                    )));
                };
                map.entry(key.clone()).or_insert(Value::Null)
            }
            Step::Index(index) => {
                if current.is_null() {
                    *current = Value::Array(Vec::new());
                }
                let Value::Array(items) = current else {
                    return Err(parse_error(&format!(
                        "partialArgs put index {index} into something not an array"
                    )));
                };
                if *index > MAX_PARTIAL_INDEX {
                    return Err(parse_error(&format!(
                        "partialArgs index {index} is too large"
                    )));
                }
                if items.len() <= *index {
                    items.resize(index + 1, Value::Null);
                }
                &mut items[*index]
            }
        };
    }
    Ok(current)
}

// ---------------------------------------------------------------------------------------------
// Streams

/// Each SSE event is a whole `GenerateContentResponse`; there are no event names and no end
/// marker, so the stream is complete only if some event carried a `finishReason` (or the prompt
/// was blocked).
#[derive(Default)]
struct GeminiStream {
    answer: Answer,
}

impl Assembler for GeminiStream {
    fn event(
        &mut self,
        _event: &str,
        data: &str,
        on_text: &mut dyn FnMut(&str),
    ) -> Result<(), ProviderError> {
        let value: Value = serde_json::from_str(data)
            .map_err(|e| ProviderError::Parse(format!("a Gemini stream event is not JSON: {e}")))?;
        self.answer.responses(&value, on_text)
    }

    fn finish(self: Box<Self>) -> Result<Inferred, ProviderError> {
        self.answer.finish(true)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::providers::ToolsLevel;
    use crate::providers::sse::assemble_bytes;
    use crate::vocab::ResponseSchema;

    const KEY: &str = "AIza-test-key-123";

    fn endpoint() -> Endpoint {
        Endpoint {
            reads: Default::default(),
            provider: "gemini".into(),
            style: Style::Gemini,
            base_url: "https://generativelanguage.googleapis.com/v1beta".into(),
            key: Some(KEY.into()),
            tools_level: ToolsLevel::Native,
            timeout: Duration::from_secs(30),
            max_response_bytes: crate::providers::body::DEFAULT_MAX_RESPONSE_BYTES,
            max_concurrent_calls: crate::providers::DEFAULT_MAX_CONCURRENT_CALLS,
        }
    }

    fn request(req: &InferRequest) -> WireRequest {
        Gemini.request(req, &endpoint(), false)
    }

    fn wire_body(req: &InferRequest) -> Value {
        request(req).body
    }

    fn simple() -> InferRequest {
        InferRequest {
            model: "gemini-2.5-flash".into(),
            messages: vec![Message::user("hello")],
            ..Default::default()
        }
    }

    fn weather_tool() -> ToolSpec {
        ToolSpec {
            name: "get_weather".into(),
            description: "Weather for a city".into(),
            parameters: json!({
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            }),
        }
    }

    fn gemini_call(id: &str, name: &str, args: &str, data: Value) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: args.into(),
            opaque: Some(Opaque {
                style: Style::Gemini,
                data,
            }),
        }
    }

    fn result(call_id: &str, name: &str, content: &str, is_error: bool) -> Part {
        Part::ToolResult(ToolResult {
            call_id: call_id.into(),
            name: name.into(),
            content: content.into(),
            is_error,
        })
    }

    fn parse(body: Value) -> Result<Inferred, ProviderError> {
        Gemini.parse(body.to_string().as_bytes())
    }

    fn stream(events: &[Value]) -> (Result<Inferred, ProviderError>, Vec<String>) {
        let bytes: String = events
            .iter()
            .map(|e| format!("data: {e}\r\n\r\n"))
            .collect();
        assemble_bytes(bytes.as_bytes(), Gemini.assembler())
    }

    fn answer(parts: Value, finish: &str) -> Value {
        json!({"candidates": [{"content": {"role": "model", "parts": parts}, "finishReason": finish, "index": 0}]})
    }

    // --- requests -------------------------------------------------------------------------

    #[test]
    fn response_schema_goes_out_as_json_schema_unchanged() {
        // Keywords the OpenAPI subset lacks stay: `responseJsonSchema` takes JSON Schema.
        let schema = json!({
            "type": "object",
            "properties": {"tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}}},
            "$defs": {"tag": {"type": "string"}},
            "additionalProperties": false,
        });
        let req = InferRequest {
            temperature: Some(0.2),
            response_schema: Some(ResponseSchema {
                name: "tagged".into(),
                schema: schema.clone(),
            }),
            ..simple()
        };
        let body = wire_body(&req);
        assert_eq!(
            body["generationConfig"],
            json!({"temperature": 0.2, "responseMimeType": "application/json",
                   "responseJsonSchema": schema})
        );
        assert!(body["generationConfig"].get("responseSchema").is_none());
        let mut rest = body.clone();
        rest.as_object_mut().unwrap().remove("generationConfig");
        let mut plain = wire_body(&simple());
        plain.as_object_mut().unwrap().remove("generationConfig");
        assert_eq!(rest, plain);
    }

    #[test]
    fn no_response_schema_leaves_the_body_unchanged() {
        let req = InferRequest {
            system: Some("Be brief.".into()),
            tools: vec![weather_tool()],
            temperature: Some(0.5),
            max_tokens: Some(100),
            stop_sequences: vec!["END".into()],
            ..simple()
        };
        assert_eq!(
            wire_body(&req),
            json!({
                "contents": [{"role": "user", "parts": [{"text": "hello"}]}],
                "systemInstruction": {"parts": [{"text": "Be brief."}]},
                "generationConfig": {"temperature": 0.5, "maxOutputTokens": 100,
                                     "stopSequences": ["END"]},
                "tools": [{"functionDeclarations": [{"name": "get_weather",
                    "description": "Weather for a city",
                    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                   "required": ["city"]}}]}],
                "toolConfig": {"functionCallingConfig": {"mode": "AUTO"}},
            })
        );
        assert!(wire_body(&simple()).get("generationConfig").is_none());
    }

    #[test]
    fn url_and_key_header() {
        let wire = request(&simple());
        assert_eq!(
            wire.url,
            "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent"
        );
        assert_eq!(
            wire.headers,
            vec![("x-goog-api-key".to_string(), KEY.to_string())]
        );
        assert!(!wire.url.contains(KEY), "the key never goes in the URL");
        assert!(!wire.body.to_string().contains(KEY));
    }

    #[test]
    fn streaming_url() {
        let wire = Gemini.request(&simple(), &endpoint(), true);
        assert_eq!(
            wire.url,
            "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
        );
    }

    #[test]
    fn model_prefix_is_not_doubled_and_trailing_slash_is_dropped() {
        let mut ep = endpoint();
        ep.base_url.push('/');
        let req = InferRequest {
            model: "models/gemini-2.5-pro".into(),
            ..simple()
        };
        let wire = Gemini.request(&req, &ep, false);
        assert_eq!(
            wire.url,
            "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-pro:generateContent"
        );
    }

    #[test]
    fn no_key_no_header() {
        let mut ep = endpoint();
        ep.key = None;
        assert!(Gemini.request(&simple(), &ep, false).headers.is_empty());
    }

    #[test]
    fn plain_text_request() {
        assert_eq!(
            wire_body(&simple()),
            json!({"contents": [{"role": "user", "parts": [{"text": "hello"}]}]})
        );
    }

    #[test]
    fn system_prompt_and_system_messages() {
        let req = InferRequest {
            system: Some("be brief".into()),
            messages: vec![
                Message::new(Role::System, vec![Part::text("answer in French")]),
                Message::user("hello"),
            ],
            ..simple()
        };
        let body = wire_body(&req);
        assert_eq!(
            body["systemInstruction"],
            json!({"parts": [{"text": "be brief"}, {"text": "answer in French"}]})
        );
        assert_eq!(
            body["contents"],
            json!([{"role": "user", "parts": [{"text": "hello"}]}])
        );
    }

    #[test]
    fn generation_config_fields() {
        let req = InferRequest {
            temperature: Some(0.25),
            max_tokens: Some(512),
            stop_sequences: vec!["END".into(), "STOP".into()],
            ..simple()
        };
        let body = wire_body(&req);
        assert_eq!(
            body["generationConfig"],
            json!({"temperature": 0.25, "maxOutputTokens": 512, "stopSequences": ["END", "STOP"]})
        );
        assert!(wire_body(&simple()).get("generationConfig").is_none());
    }

    #[test]
    fn extra_is_merged_last() {
        let req = InferRequest {
            temperature: Some(0.5),
            extra: Some(json!({
                "generationConfig": {"temperature": 1.0, "thinkingConfig": {"includeThoughts": true}},
                "safetySettings": [{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_NONE"}],
            })),
            ..simple()
        };
        let body = wire_body(&req);
        assert_eq!(
            body["generationConfig"],
            json!({"temperature": 1.0, "thinkingConfig": {"includeThoughts": true}})
        );
        assert_eq!(body["safetySettings"][0]["threshold"], "BLOCK_NONE");
        assert_eq!(body["contents"][0]["parts"][0]["text"], "hello");
    }

    #[test]
    fn tools_go_out_as_function_declarations() {
        let mut no_params = weather_tool();
        no_params.name = "now".into();
        no_params.description = String::new();
        no_params.parameters = json!({"type": "object", "properties": {}});
        let req = InferRequest {
            tools: vec![weather_tool(), no_params],
            ..simple()
        };
        let body = wire_body(&req);
        assert_eq!(
            body["tools"],
            json!([{"functionDeclarations": [
                {
                    "name": "get_weather",
                    "description": "Weather for a city",
                    "parameters": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}},
                        "required": ["city"],
                    },
                },
                {"name": "now"},
            ]}])
        );
        assert_eq!(
            body["toolConfig"],
            json!({"functionCallingConfig": {"mode": "AUTO"}})
        );
    }

    #[test]
    fn tool_choice_modes() {
        let config = |choice: ToolChoice| {
            let req = InferRequest {
                tools: vec![weather_tool()],
                tool_choice: choice,
                ..simple()
            };
            wire_body(&req)["toolConfig"]["functionCallingConfig"].clone()
        };
        assert_eq!(config(ToolChoice::Auto), json!({"mode": "AUTO"}));
        assert_eq!(config(ToolChoice::None), json!({"mode": "NONE"}));
        assert_eq!(config(ToolChoice::Required), json!({"mode": "ANY"}));
        assert_eq!(
            config(ToolChoice::Tool("get_weather".into())),
            json!({"mode": "ANY", "allowedFunctionNames": ["get_weather"]})
        );
        assert!(wire_body(&simple()).get("toolConfig").is_none());
    }

    #[test]
    fn schema_keys_gemini_rejects_are_stripped() {
        let schema = json!({
            "$schema": "http://json-schema.org/draft-07/schema#",
            "$id": "urn:x",
            "type": "object",
            "additionalProperties": false,
            "properties": {
                // Property names that look like schema keywords are kept.
                "additionalProperties": {"type": "string", "description": "a property named so"},
                "$id": {"type": "integer", "exclusiveMinimum": 0},
                "url": {"type": "string", "format": "uri"},
                "when": {"type": "string", "format": "date-time"},
                "tags": {
                    "type": "array",
                    "items": {"type": "object", "additionalProperties": false, "properties": {"k": {"type": "string"}}},
                },
                "maybe": {"type": ["string", "null"]},
                "kind": {"const": "fixed"},
                "either": {"oneOf": [{"type": "string"}, {"type": "number"}]},
            },
            "required": ["url", "missing"],
        });
        let out = gemini_schema(&schema).expect("has properties");
        assert_eq!(
            out,
            json!({
                "type": "object",
                "properties": {
                    "additionalProperties": {"type": "string", "description": "a property named so"},
                    "$id": {"type": "integer"},
                    "url": {"type": "string"},
                    "when": {"type": "string", "format": "date-time"},
                    "tags": {
                        "type": "array",
                        "items": {"type": "object", "properties": {"k": {"type": "string"}}},
                    },
                    "maybe": {"nullable": true, "type": "string"},
                    "kind": {"enum": ["fixed"]},
                    "either": {"anyOf": [{"type": "string"}, {"type": "number"}]},
                },
                "required": ["url"],
            })
        );
    }

    #[test]
    fn schema_refs_and_all_of_are_inlined() {
        let schema = json!({
            "type": "object",
            "$defs": {"Point": {"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]}},
            "properties": {
                "at": {"$ref": "#/$defs/Point", "description": "where"},
                "opt": {"anyOf": [{"$ref": "#/$defs/Point"}, {"type": "null"}]},
                "both": {"allOf": [{"$ref": "#/$defs/Point"}, {"properties": {"y": {"type": "number"}}}]},
            },
        });
        let out = gemini_schema(&schema).expect("has properties");
        let point =
            json!({"type": "object", "properties": {"x": {"type": "number"}}, "required": ["x"]});
        assert_eq!(out.get("$defs"), None);
        let mut at = point.clone();
        at["description"] = json!("where");
        assert_eq!(out["properties"]["at"], at);
        let mut opt = point.clone();
        opt["nullable"] = json!(true);
        assert_eq!(out["properties"]["opt"], opt);
        assert_eq!(
            out["properties"]["both"]["properties"],
            json!({"x": {"type": "number"}, "y": {"type": "number"}})
        );
    }

    #[test]
    fn recursive_refs_stop() {
        let schema = json!({
            "type": "object",
            "definitions": {"Node": {"type": "object", "properties": {"next": {"$ref": "#/definitions/Node"}}}},
            "properties": {"head": {"$ref": "#/definitions/Node"}},
        });
        let out = gemini_schema(&schema).expect("has properties");
        assert!(out.to_string().len() < 10_000);
    }

    #[test]
    fn assistant_tool_calls_and_results_go_back() {
        let assistant = Message::new(
            Role::Assistant,
            vec![
                Part::text("Let me check."),
                Part::ToolCall(gemini_call(
                    "fc1",
                    "get_weather",
                    r#"{"city":"Paris"}"#,
                    json!({"thoughtSignature": "SIG1"}),
                )),
                Part::ToolCall(gemini_call(
                    "gemini_1_2",
                    "get_weather",
                    r#"{"city":"Tokyo"}"#,
                    json!({"syntheticId": true}),
                )),
            ],
        );
        let tool = Message::new(
            Role::Tool,
            vec![
                result("fc1", "get_weather", r#"{"temp": 21}"#, false),
                result("gemini_1_2", "", "city not found", true),
            ],
        );
        let req = InferRequest {
            messages: vec![Message::user("weather?"), assistant, tool],
            ..simple()
        };
        let body = wire_body(&req);
        assert_eq!(
            body["contents"],
            json!([
                {"role": "user", "parts": [{"text": "weather?"}]},
                {"role": "model", "parts": [
                    {"text": "Let me check."},
                    {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}, "id": "fc1"}, "thoughtSignature": "SIG1"},
                    {"functionCall": {"name": "get_weather", "args": {"city": "Tokyo"}}},
                ]},
                {"role": "user", "parts": [
                    {"functionResponse": {"name": "get_weather", "response": {"result": {"temp": 21}}, "id": "fc1"}},
                    {"functionResponse": {"name": "get_weather", "response": {"error": "city not found"}}},
                ]},
            ])
        );
    }

    #[test]
    fn results_of_one_step_share_one_content_even_across_messages() {
        let call = |id: &str| Part::ToolCall(gemini_call(id, "f", "", json!({})));
        let req = InferRequest {
            messages: vec![
                Message::user("go"),
                Message::new(Role::Assistant, vec![call("a"), call("b")]),
                Message::new(Role::Tool, vec![result("a", "f", "1", false)]),
                Message::new(Role::Tool, vec![result("b", "f", "plain text", false)]),
                Message::user("thanks"),
            ],
            ..simple()
        };
        let contents = wire_body(&req)["contents"].clone();
        assert_eq!(contents.as_array().map(Vec::len), Some(3));
        assert_eq!(contents[1]["parts"][0]["functionCall"]["args"], json!({}));
        assert_eq!(
            contents[2]["parts"],
            json!([
                {"functionResponse": {"name": "f", "response": {"result": 1}, "id": "a"}},
                {"functionResponse": {"name": "f", "response": {"result": "plain text"}, "id": "b"}},
                {"text": "thanks"},
            ])
        );
    }

    #[test]
    fn opaque_goes_back_unchanged_and_only_to_gemini() {
        let foreign = Opaque {
            style: Style::Anthropic,
            data: json!({"type": "thinking", "signature": "ANTHROPIC"}),
        };
        let assistant = Message::new(
            Role::Assistant,
            vec![
                Part::Reasoning {
                    text: "thinking...".into(),
                    opaque: Some(Opaque {
                        style: Style::Gemini,
                        data: json!({"thought": true}),
                    }),
                },
                Part::Reasoning {
                    text: "foreign thoughts".into(),
                    opaque: Some(foreign.clone()),
                },
                Part::Text {
                    text: "answer".into(),
                    opaque: Some(Opaque {
                        style: Style::Gemini,
                        data: json!({"thoughtSignature": "TEXT/SIG+=="}),
                    }),
                },
                Part::Text {
                    text: "more".into(),
                    opaque: Some(foreign.clone()),
                },
                Part::ToolCall(ToolCall {
                    id: "toolu_01".into(),
                    name: "f".into(),
                    arguments: r#"{"a":1}"#.into(),
                    opaque: Some(foreign),
                }),
            ],
        );
        let req = InferRequest {
            messages: vec![Message::user("hi"), assistant],
            ..simple()
        };
        assert_eq!(
            wire_body(&req)["contents"][1]["parts"],
            json!([
                {"text": "thinking...", "thought": true},
                {"text": "answer", "thoughtSignature": "TEXT/SIG+=="},
                {"text": "more"},
                {"functionCall": {"name": "f", "args": {"a": 1}}},
            ])
        );
    }

    #[test]
    fn odd_arguments_still_make_an_object() {
        assert_eq!(args_object(""), json!({}));
        assert_eq!(args_object("[1,2]"), json!({"value": [1, 2]}));
        assert_eq!(args_object("{not json"), json!({"raw": "{not json"}));
    }

    #[test]
    fn gemini3_unsigned_steps_get_the_placeholder_in_the_current_turn_only() {
        let unsigned = |id: &str| {
            Part::ToolCall(ToolCall {
                id: id.into(),
                name: "f".into(),
                arguments: "{}".into(),
                opaque: None,
            })
        };
        let messages = vec![
            Message::user("first"),
            Message::new(Role::Assistant, vec![unsigned("old")]),
            Message::new(Role::Tool, vec![result("old", "f", "1", false)]),
            Message::user("second"),
            Message::new(Role::Assistant, vec![unsigned("a"), unsigned("b")]),
            Message::new(Role::Tool, vec![result("a", "f", "1", false)]),
        ];
        let req = InferRequest {
            model: "gemini-3-pro-preview".into(),
            messages: messages.clone(),
            ..simple()
        };
        let contents = wire_body(&req)["contents"].clone();
        // user, model (old turn), user (result + "second"), model (current turn), user.
        assert_eq!(contents.as_array().map(Vec::len), Some(5));
        assert_eq!(contents[1]["parts"][0].get(SIGNATURE), None);
        assert_eq!(contents[3]["parts"][0][SIGNATURE], SKIP_SIGNATURE);
        assert_eq!(contents[3]["parts"][1].get(SIGNATURE), None);

        let older = InferRequest {
            model: "gemini-2.5-flash".into(),
            messages,
            ..simple()
        };
        assert!(!wire_body(&older).to_string().contains(SKIP_SIGNATURE));
        assert!(validates_signatures("models/gemini-3.1-pro-preview"));
        assert!(!validates_signatures("gemma-3-27b-it"));
    }

    #[test]
    fn models_endpoint() {
        let wire = Gemini.models_request(&endpoint());
        assert_eq!(
            wire.url,
            "https://generativelanguage.googleapis.com/v1beta/models?pageSize=1000"
        );
        assert_eq!(
            wire.headers,
            vec![("x-goog-api-key".to_string(), KEY.to_string())]
        );
        let listed = json!({"models": [
            {"name": "models/gemini-2.5-flash", "supportedGenerationMethods": ["generateContent", "countTokens"]},
            {"name": "models/text-embedding-004", "supportedGenerationMethods": ["embedContent"]},
            {"name": "models/gemini-3-pro-preview"},
        ], "nextPageToken": "x"});
        assert_eq!(
            Gemini.parse_models(&listed),
            vec!["gemini-2.5-flash", "gemini-3-pro-preview"]
        );
        assert!(Gemini.parse_models(&json!({})).is_empty());
    }

    // --- responses ------------------------------------------------------------------------

    #[test]
    fn stop_reasons() {
        let stop = |reason: &str| parse(answer(json!([{"text": "x"}]), reason)).map(|i| i.stop);
        assert_eq!(stop("STOP"), Ok(Stop::EndTurn));
        assert_eq!(stop("MAX_TOKENS"), Ok(Stop::MaxTokens));
        for filtered in [
            "SAFETY",
            "RECITATION",
            "BLOCKLIST",
            "PROHIBITED_CONTENT",
            "SPII",
        ] {
            assert_eq!(stop(filtered), Ok(Stop::ContentFilter), "{filtered}");
        }
        assert_eq!(stop("OTHER"), Ok(Stop::Error));
        let call = json!([{"functionCall": {"name": "f", "args": {}}}]);
        assert_eq!(
            parse(answer(call, "STOP")).map(|i| i.stop),
            Ok(Stop::ToolUse)
        );
    }

    #[test]
    fn malformed_function_call_is_an_error_answer() {
        let body = json!({"candidates": [{
            "content": {"parts": []},
            "finishReason": "MALFORMED_FUNCTION_CALL",
            "finishMessage": "Malformed function call: print(default_api.f(x=))",
        }]});
        let inferred = parse(body).expect("an answer");
        assert_eq!(inferred.stop, Stop::Error);
        assert_eq!(
            inferred.text(),
            "Malformed function call: print(default_api.f(x=))"
        );
        assert!(inferred.tool_calls().is_empty());
    }

    #[test]
    fn blocked_prompt_is_content_filter_with_no_text() {
        let body = json!({
            "promptFeedback": {"blockReason": "SAFETY", "safetyRatings": []},
            "usageMetadata": {"promptTokenCount": 7, "totalTokenCount": 7},
        });
        let inferred = parse(body.clone()).expect("an answer");
        assert_eq!(inferred.stop, Stop::ContentFilter);
        assert_eq!(inferred.text(), "");
        assert_eq!(inferred.usage.input, 7);
        let (streamed, deltas) = stream(&[body]);
        assert_eq!(streamed.map(|i| i.stop), Ok(Stop::ContentFilter));
        assert!(deltas.is_empty());
    }

    #[test]
    fn usage_mapping() {
        let body = json!({
            "candidates": [{"content": {"parts": [{"text": "hi"}]}, "finishReason": "STOP"}],
            "usageMetadata": {
                "promptTokenCount": 100, "cachedContentTokenCount": 60, "toolUsePromptTokenCount": 5,
                "candidatesTokenCount": 20, "thoughtsTokenCount": 30, "totalTokenCount": 155,
            },
            "modelVersion": "gemini-2.5-pro",
        });
        let inferred = parse(body).expect("an answer");
        assert_eq!(
            inferred.usage,
            Usage {
                input: 105,
                output: 50,
                cache_read: 60,
                cache_write: 0,
                reasoning: 30
            }
        );
        assert_eq!(inferred.model.as_deref(), Some("gemini-2.5-pro"));
    }

    #[test]
    fn array_body_is_concatenated() {
        let body = json!([
            {"candidates": [{"content": {"role": "model", "parts": [{"text": "Hel"}]}}]},
            {"candidates": [{"content": {"role": "model", "parts": [{"text": "lo"}]}, "finishReason": "STOP"}],
             "usageMetadata": {"promptTokenCount": 3, "candidatesTokenCount": 2}},
        ]);
        let inferred = parse(body).expect("an answer");
        assert_eq!(inferred.message.parts, vec![Part::text("Hello")]);
        assert_eq!(inferred.usage.output, 2);
    }

    #[test]
    fn thought_parts_become_reasoning_and_signatures_close_runs() {
        let parts = json!([
            {"text": "plan ", "thought": true},
            {"text": "more", "thought": true},
            {"text": "", "thought": true, "thoughtSignature": "T1"},
            {"text": "Hi"},
            {"text": " there", "thoughtSignature": "S1"},
            {"text": "again"},
        ]);
        let inferred = parse(answer(parts, "STOP")).expect("an answer");
        let gemini = |data: Value| {
            Some(Opaque {
                style: Style::Gemini,
                data,
            })
        };
        assert_eq!(
            inferred.message.parts,
            vec![
                Part::Reasoning {
                    text: "plan more".into(),
                    opaque: gemini(json!({"thought": true, "thoughtSignature": "T1"})),
                },
                Part::Text {
                    text: "Hi there".into(),
                    opaque: gemini(json!({"thoughtSignature": "S1"})),
                },
                Part::text("again"),
            ]
        );
    }

    #[test]
    fn function_call_ids_given_or_made_up() {
        let parts = json!([
            {"functionCall": {"name": "a", "args": {"x": 1}, "id": "given"}, "thoughtSignature": "S"},
            {"functionCall": {"name": "b"}},
        ]);
        let inferred = parse(answer(parts, "STOP")).expect("an answer");
        let calls = inferred.tool_calls();
        assert_eq!(calls[0].id, "given");
        assert_eq!(calls[0].arguments, r#"{"x":1}"#);
        assert_eq!(
            calls[0].opaque.as_ref().map(|o| &o.data),
            Some(&json!({"thoughtSignature": "S"}))
        );
        assert!(!calls[1].id.is_empty());
        assert_ne!(calls[1].id, calls[0].id);
        assert_eq!(calls[1].arguments, "{}");
        assert_eq!(
            calls[1].opaque.as_ref().map(|o| &o.data),
            Some(&json!({"syntheticId": true}))
        );
        // Sent back: the given id goes, the made-up one does not.
        let req = InferRequest {
            messages: vec![Message::user("go"), inferred.message],
            ..simple()
        };
        let parts = wire_body(&req)["contents"][1]["parts"].clone();
        assert_eq!(parts[0]["functionCall"]["id"], "given");
        assert_eq!(parts[0][SIGNATURE], "S");
        assert_eq!(parts[1], json!({"functionCall": {"name": "b", "args": {}}}));
    }

    #[test]
    fn streamed_text_deltas_and_latest_usage() {
        let events = [
            json!({"candidates": [{"content": {"parts": [{"text": "thinking", "thought": true}]}}],
                   "usageMetadata": {"promptTokenCount": 4, "thoughtsTokenCount": 9}}),
            json!({"candidates": [{"content": {"parts": [{"text": "Hel"}]}}],
                   "usageMetadata": {"promptTokenCount": 4, "candidatesTokenCount": 1, "thoughtsTokenCount": 9}}),
            json!({"candidates": [{"content": {"parts": [{"text": "lo"}]}, "finishReason": "STOP"}],
                   "usageMetadata": {"promptTokenCount": 4, "candidatesTokenCount": 2, "thoughtsTokenCount": 9}}),
        ];
        let (inferred, deltas) = stream(&events);
        let inferred = inferred.expect("an answer");
        assert_eq!(deltas, vec!["Hel", "lo"]);
        assert_eq!(inferred.text(), "Hello");
        assert_eq!(inferred.usage.output, 11);
        assert_eq!(inferred.usage.reasoning, 9);
    }

    #[test]
    fn stream_without_finish_reason_is_a_fetch_error() {
        let (result, deltas) =
            stream(&[json!({"candidates": [{"content": {"parts": [{"text": "partial"}]}}]})]);
        assert_eq!(deltas, vec!["partial"]);
        assert_eq!(
            result,
            Err(ProviderError::Fetch(
                "the stream ended before a finishReason".into()
            ))
        );
    }

    #[test]
    fn mid_stream_error_is_an_error() {
        let (result, _) = stream(&[
            json!({"candidates": [{"content": {"parts": [{"text": "par"}]}}]}),
            json!({"error": {"code": 503, "message": "The model is overloaded.", "status": "UNAVAILABLE"}}),
        ]);
        let err = result.expect_err("an error");
        assert_eq!(err.kind(), "provider_error");
        assert!(err.is_transient());

        let (result, _) = stream(&[
            json!({"error": {"code": 400, "message": "bad", "status": "INVALID_ARGUMENT"}}),
        ]);
        assert_eq!(result.expect_err("an error").kind(), "api_error");
    }

    #[test]
    fn malformed_input_is_a_parse_error() {
        let bad = [
            json!({"candidates": {"not": "an array"}}),
            json!({"candidates": [{"content": {"parts": "nope"}}]}),
            json!({"candidates": [{"content": {"parts": [{"text": 5}]}}]}),
            json!({"candidates": [{"content": {"parts": [{"functionCall": {"name": 1}}]}}]}),
            json!({"candidates": [{"content": {"parts": [{"functionCall": {"name": "f", "args": [1]}}]}}]}),
            json!({"candidates": [{"content": {"parts": [{"functionCall": {"partialArgs": []}}]}}]}),
            json!("just a string"),
        ];
        for body in bad {
            assert_eq!(
                parse(body.clone()).map_err(|e| e.kind()),
                Err("parse_error"),
                "{body}"
            );
        }
        assert_eq!(
            Gemini.parse(b"{oops").map_err(|e| e.kind()),
            Err("parse_error")
        );
        assert_eq!(
            Gemini.parse(b"{}").map_err(|e| e.kind()),
            Err("parse_error")
        );
        let (result, _) = assemble_bytes(b"data: not json\r\n\r\n", Gemini.assembler());
        assert_eq!(result.map_err(|e| e.kind()), Err("parse_error"));
    }

    #[test]
    fn streamed_partial_arguments_with_nested_paths() {
        let fc =
            |call: Value| json!({"candidates": [{"content": {"parts": [{"functionCall": call}]}}]});
        let events = [
            fc(json!({"name": "cook", "willContinue": true})),
            fc(json!({"partialArgs": [
                {"jsonPath": "$.recipe.name", "stringValue": "Lasa", "willContinue": true}
            ], "willContinue": true})),
            fc(json!({"partialArgs": [
                {"jsonPath": "$.recipe.name", "stringValue": "gna \"x\""},
                {"jsonPath": "$.recipe.ingredients[1]", "stringValue": "cheese"},
                {"jsonPath": "$.recipe.ingredients[0]", "stringValue": "pasta"},
                {"jsonPath": "$.servings", "numberValue": 4},
                {"jsonPath": "$.vegan", "boolValue": false},
                {"jsonPath": "$['odd.key']", "nullValue": null},
            ], "willContinue": true})),
            fc(json!({})),
            json!({"candidates": [{"content": {"parts": [{"text": ""}]}, "finishReason": "STOP"}]}),
        ];
        let (inferred, deltas) = stream(&events);
        let inferred = inferred.expect("an answer");
        assert!(deltas.is_empty());
        assert_eq!(inferred.stop, Stop::ToolUse);
        let calls = inferred.tool_calls();
        assert_eq!(calls.len(), 1);
        assert_eq!(
            calls[0].decoded().expect("JSON"),
            json!({
                "recipe": {"name": "Lasagna \"x\"", "ingredients": ["pasta", "cheese"]},
                "servings": 4, "vegan": false, "odd.key": null,
            })
        );
    }

    #[test]
    fn an_open_streamed_call_is_closed_at_the_end() {
        let events = [json!({"candidates": [{"content": {"parts": [
            {"functionCall": {"name": "f", "willContinue": true}},
            {"functionCall": {"partialArgs": [{"jsonPath": "$.q", "stringValue": "x"}], "willContinue": true}},
        ]}, "finishReason": "MAX_TOKENS"}]})];
        let (inferred, _) = stream(&events);
        let inferred = inferred.expect("an answer");
        assert_eq!(inferred.stop, Stop::MaxTokens);
        assert_eq!(inferred.tool_calls()[0].arguments, r#"{"q":"x"}"#);
    }

    #[test]
    fn json_paths() {
        assert_eq!(
            json_path("$.a[2]['b.c']").ok(),
            Some(vec![
                Step::Key("a".into()),
                Step::Index(2),
                Step::Key("b.c".into())
            ])
        );
        for bad in ["", "$", "a.b", "$..a", "$[x]", "$[1"] {
            assert!(json_path(bad).is_err(), "{bad}");
        }
        let mut root = json!({});
        let huge = json_path("$.a[99999999]").expect("a path");
        assert!(slot(&mut root, &huge).is_err());
    }

    #[test]
    fn per_day_quota_is_not_transient() {
        let body = json!({"error": {
            "code": 429, "message": "Quota exceeded", "status": "RESOURCE_EXHAUSTED",
            "details": [
                {"@type": "type.googleapis.com/google.rpc.QuotaFailure",
                 "violations": [{"quotaId": "GenerateRequestsPerDayPerProjectPerModel-FreeTier"}]},
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "20s"},
            ],
        }});
        let err = errors::classify(429, &Default::default(), &body.to_string());
        assert_eq!(err.kind(), "provider_error");
        assert!(!err.is_transient());
    }
}
