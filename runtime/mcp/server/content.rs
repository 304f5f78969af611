//! Resources, templates and prompts as the client reads them, made by the script's functions:
//! a resource's `read(args, ctx)` answers its text (or `{ text | blob, mime_type }`), a
//! prompt's `get(args, ctx)` its text (one user message) or a list of `{ role, content }`.

use base64::Engine;
use rmcp::ErrorData;
use serde_json::{Map, Value, json};

use super::exports::{PromptExport, ResourceExport};
use super::handler::Offer;
use crate::script::{FnId, HandlerOutcome, ToolContext};
use crate::vocab::FileRef;

/// A file a tool answered, as a content block: images and audio inline, others embedded.
pub fn file_block(f: &FileRef) -> Option<Value> {
    let data = f.data.as_ref()?;
    let b64 = base64::engine::general_purpose::STANDARD.encode(data);
    let kind = f.content_type.split('/').next().unwrap_or("");
    Some(match kind {
        "image" | "audio" => json!({ "type": kind, "data": b64, "mimeType": f.content_type }),
        _ => json!({ "type": "resource", "resource": {
            "uri": format!("colony://files/{}", f.handle()),
            "mimeType": f.content_type,
            "blob": b64,
        }}),
    })
}

/// A resource (`key` = `uri`) or template (`uriTemplate`) in a list.
pub fn resource_entry(r: &ResourceExport, key: &str) -> Value {
    let mut v = json!({ key: r.uri, "name": r.name });
    if let Some(d) = &r.description {
        v["description"] = json!(d);
    }
    if let Some(m) = &r.mime_type {
        v["mimeType"] = json!(m);
    }
    v
}

pub fn prompt_entry(p: &PromptExport) -> Value {
    let args: Vec<Value> = p
        .arguments
        .iter()
        .map(|a| {
            let mut v = json!({ "name": a.name, "required": a.required });
            if let Some(d) = &a.description {
                v["description"] = json!(d);
            }
            v
        })
        .collect();
    let mut v = json!({ "name": p.name, "arguments": args });
    if let Some(d) = &p.description {
        v["description"] = json!(d);
    }
    v
}

/// Matches `uri` against an RFC 6570 level-1 template (`file:///{path}`): the variables'
/// values, or `None`. A variable takes at least one character and no `/`.
pub fn match_template(template: &str, uri: &str) -> Option<Map<String, Value>> {
    let mut vars = Map::new();
    let mut rest = uri;
    let mut t = template;
    while !t.is_empty() {
        match t.find('{') {
            Some(0) => {
                let close = t.find('}')?;
                let name = &t[1..close];
                t = &t[close + 1..];
                let until = t.find('{').unwrap_or(t.len());
                let literal = &t[..until];
                let end = if literal.is_empty() {
                    rest.find('/').unwrap_or(rest.len())
                } else {
                    rest.find(literal)?
                };
                let value = &rest[..end];
                if value.is_empty() || value.contains('/') {
                    return None;
                }
                vars.insert(name.to_string(), json!(value));
                rest = &rest[end..];
            }
            Some(n) => {
                rest = rest.strip_prefix(&t[..n])?;
                t = &t[n..];
            }
            None => {
                rest = rest.strip_prefix(t)?;
                t = "";
            }
        }
    }
    rest.is_empty().then_some(vars)
}

/// Runs a script function for the server; its value as JSON (text that is not JSON as a
/// string), or the error the client is answered.
async fn run(offer: &Offer, func: FnId, name: &str, args: Value) -> Result<Value, ErrorData> {
    let cx = ToolContext {
        call_id: super::call::call_id(),
        name: name.to_string(),
        deadline: std::time::Instant::now().checked_add(crate::turn::tools::DEFAULT_TIMEOUT),
        ..ToolContext::default()
    };
    let run = offer.route.script().call_handler(func, args, cx);
    match tokio::time::timeout(crate::turn::tools::DEFAULT_TIMEOUT, run).await {
        Ok(HandlerOutcome::Value(text)) | Ok(HandlerOutcome::Attached(text, _)) => {
            Ok(serde_json::from_str(&text).unwrap_or(Value::String(text)))
        }
        Ok(HandlerOutcome::Refused(m)) | Ok(HandlerOutcome::Thrown(m)) => {
            Err(ErrorData::internal_error(format!("{name}: {m}"), None))
        }
        Ok(HandlerOutcome::Raised(f)) => Err(ErrorData::internal_error(
            format!("{name}: {}", f.message),
            None,
        )),
        Ok(HandlerOutcome::Gone) => Err(ErrorData::internal_error(crate::script::GONE, None)),
        Ok(HandlerOutcome::Deadline(_)) | Err(_) => Err(ErrorData::internal_error(
            format!("{name}: no answer within its deadline"),
            None,
        )),
    }
}

/// Reads `uri` from `offer` if it has it (a resource, else the first template that matches).
pub async fn read(offer: &Offer, uri: &str) -> Option<Result<Value, ErrorData>> {
    let resources = offer.exports.resources();
    let (r, vars) = resources
        .iter()
        .find(|r| !r.template && r.uri == uri)
        .map(|r| (r, Map::new()))
        .or_else(|| {
            resources
                .iter()
                .filter(|r| r.template)
                .find_map(|r| match_template(&r.uri, uri).map(|v| (r, v)))
        })?;
    let mut args = vars;
    args.insert("uri".into(), json!(uri));
    Some(
        run(offer, r.read, &r.name, Value::Object(args))
            .await
            .map(|v| {
                let mime = r.mime_type.clone();
                let mut c = match v {
                    Value::Object(o) if o.contains_key("text") || o.contains_key("blob") => {
                        let mut c = json!({ "uri": uri });
                        if let Some(t) = o.get("text") {
                            c["text"] = t.clone();
                        }
                        if let Some(b) = o.get("blob") {
                            c["blob"] = b.clone();
                        }
                        if let Some(m) = o.get("mime_type").or(o.get("mimeType")) {
                            c["mimeType"] = m.clone();
                        }
                        c
                    }
                    Value::String(s) => json!({ "uri": uri, "text": s }),
                    other => json!({ "uri": uri, "text": other.to_string() }),
                };
                if c.get("mimeType").is_none()
                    && let Some(m) = mime
                {
                    c["mimeType"] = json!(m);
                }
                json!({ "contents": [c] })
            }),
    )
}

/// A message's content: text as a text block, a block as it is.
fn block(v: &Value) -> Value {
    match v {
        Value::String(s) => json!({ "type": "text", "text": s }),
        Value::Object(_) => v.clone(),
        other => json!({ "type": "text", "text": other.to_string() }),
    }
}

/// `prompts/get`: the required arguments checked, then the script's answer as messages.
pub async fn prompt(
    offer: &Offer,
    p: &PromptExport,
    args: Map<String, Value>,
) -> Result<Value, ErrorData> {
    if let Some(missing) = p
        .arguments
        .iter()
        .find(|a| a.required && !args.contains_key(&a.name))
    {
        return Err(ErrorData::invalid_params(
            format!(
                "prompt {}: the argument {:?} is required",
                p.name, missing.name
            ),
            None,
        ));
    }
    let v = run(offer, p.get, &p.name, Value::Object(args)).await?;
    let list = match &v {
        Value::Object(o) if o.contains_key("messages") => o["messages"].clone(),
        Value::Array(_) => v.clone(),
        other => json!([{ "role": "user", "content": other }]),
    };
    let messages: Vec<Value> = list
        .as_array()
        .into_iter()
        .flatten()
        .map(|m| {
            json!({
                "role": m.get("role").and_then(Value::as_str).unwrap_or("user"),
                "content": block(m.get("content").unwrap_or(&Value::Null)),
            })
        })
        .collect();
    let mut out = json!({ "messages": messages });
    if let Some(d) = v
        .get("description")
        .or(p.description.as_ref().map(|_| &Value::Null))
    {
        out["description"] = if d.is_null() {
            json!(p.description)
        } else {
            d.clone()
        };
    }
    Ok(out)
}

/// `completion/complete` for a prompt's argument: the script's `complete(argument, value)`.
pub async fn complete(
    offer: &Offer,
    p: &PromptExport,
    argument: &str,
    value: &str,
) -> Result<Vec<String>, ErrorData> {
    let Some(func) = p.complete else {
        return Ok(Vec::new());
    };
    let v = run(
        offer,
        func,
        &p.name,
        json!({ "argument": argument, "value": value }),
    )
    .await?;
    Ok(v.as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(str::to_string))
        .collect())
}

/// Why a handler's `{ content = { blocks... } }` answer cannot be shown, if it cannot: an image
/// or audio block whose `data` is not base64 (MCP's schema) reached the client as it was, which
/// then failed to show it without a word of why. Whitespace and missing padding are taken.
pub fn unshowable_blocks(answer: &str) -> Option<String> {
    let Ok(Value::Object(o)) = serde_json::from_str::<Value>(answer) else {
        return None;
    };
    let Some(Value::Array(blocks)) = o.get("content") else {
        return None;
    };
    let lenient = base64::engine::GeneralPurpose::new(
        &base64::alphabet::STANDARD,
        base64::engine::GeneralPurposeConfig::new()
            .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
    );
    blocks.iter().enumerate().find_map(|(i, b)| {
        let kind = b["type"].as_str()?;
        if !matches!(kind, "image" | "audio") {
            return None;
        }
        let data: String = b["data"]
            .as_str()
            .unwrap_or("")
            .chars()
            .filter(|c| !c.is_ascii_whitespace())
            .collect();
        if !data.is_empty() && lenient.decode(&data).is_ok() {
            return None;
        }
        Some(format!(
            "the tool answered an {kind} block (content[{}]) whose data is not base64: give \
             the bytes base64-encoded, or answer `{{ text = ..., files = {{ path }} }}`",
            i + 1
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_template_matches_what_fills_its_variables() {
        let m = match_template("test://template/{id}/data", "test://template/42/data").unwrap();
        assert_eq!(m["id"], "42");
        assert!(match_template("test://template/{id}/data", "test://template//data").is_none());
        assert!(match_template("test://template/{id}/data", "test://template/4/2/data").is_none());
        assert!(match_template("file:///{name}", "file:///notes.txt").is_some());
        assert!(match_template("file:///{name}", "http://x/notes.txt").is_none());
    }
}
