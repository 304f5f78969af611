//! A `tools/call` result as the text a model reads: `structuredContent` as JSON when present, else
//! the content blocks joined by newlines (text as it is, other blocks as JSON). Images, audio and
//! embedded resources become files attached to the result (ARCHITECTURE.md, "Files"), each in the
//! form the provider's API takes.

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::Value;

use crate::vocab::FileRef;

/// What a call answered: the text for the model, the structured value if any, the files its
/// content carried, and whether the server flagged it as an error (`isError: true`).
#[derive(Debug, Clone, PartialEq)]
pub struct CallOutput {
    pub text: String,
    /// The content blocks joined by newlines (text as it is, other blocks as JSON): what a
    /// person reads, where `text` prefers the structured value a model reads.
    pub content: String,
    pub structured: Option<Value>,
    pub files: Vec<FileRef>,
    pub is_error: bool,
}

/// Shapes a `CallToolResult` (as JSON, so this does not depend on the SDK's types). A secret
/// the server was given (its `env`, its headers) that it echoes is `[redacted]` here, before the
/// model, a log, a cassette or the store can see it.
pub fn shape(result: &Value) -> CallOutput {
    let structured = result
        .get("structuredContent")
        .filter(|v| !v.is_null())
        .map(|v| {
            let text = crate::secrets::redact(&v.to_string());
            serde_json::from_str(&text).unwrap_or(Value::String(text))
        });
    let is_error = result
        .get("isError")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let blocks: &[Value] = result
        .get("content")
        .and_then(Value::as_array)
        .map(Vec::as_slice)
        .unwrap_or(&[]);
    let mut files = Vec::new();
    let mut texts = Vec::new();
    for (i, block) in blocks.iter().enumerate() {
        match content_to_file(block, i + 1) {
            Some(file) => files.push(file),
            None => texts.push(content_to_text(block)),
        }
    }
    let content = crate::secrets::redact(&texts.join("\n"));
    let text = match &structured {
        Some(v) => v.to_string(),
        None => content.clone(),
    };
    CallOutput {
        text,
        content,
        structured,
        files,
        is_error,
    }
}

/// One content block as text: text as it is, anything else as JSON.
pub fn content_to_text(block: &Value) -> String {
    match (
        block.get("type").and_then(Value::as_str),
        block.get("text").and_then(Value::as_str),
    ) {
        (Some("text"), Some(text)) => text.to_string(),
        _ => block.to_string(),
    }
}

/// An `image` or `audio` block (base64 `data`, `mimeType`) or an embedded `resource` (`uri`,
/// `mimeType`, `text` or base64 `blob`) as a file; `None` for anything else, or a block whose
/// data does not decode (it stays JSON text, so nothing is lost).
pub fn content_to_file(block: &Value, n: usize) -> Option<FileRef> {
    let field = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    let (name, declared, bytes) = match block.get("type").and_then(Value::as_str)? {
        kind @ ("image" | "audio") => {
            let mime = field(block, "mimeType");
            let ext = mime
                .as_deref()
                .and_then(|m| mime_guess::get_mime_extensions_str(m))
                .and_then(|e| e.first())
                .map(|e| format!(".{e}"))
                .unwrap_or_default();
            let bytes = STANDARD.decode(field(block, "data")?).ok()?;
            (format!("{kind}-{n}{ext}"), mime, bytes)
        }
        "resource" => {
            let resource = block.get("resource")?;
            let uri = field(resource, "uri").unwrap_or_default();
            let name = uri
                .rsplit(['/', ':'])
                .find(|s| !s.is_empty())
                .map(str::to_string)
                .unwrap_or_else(|| format!("resource-{n}"));
            let bytes = match (field(resource, "text"), field(resource, "blob")) {
                (Some(text), _) => text.into_bytes(),
                (None, Some(blob)) => STANDARD.decode(blob).ok()?,
                (None, None) => return None,
            };
            (name, field(resource, "mimeType"), bytes)
        }
        _ => return None,
    };
    Some(crate::files::record(
        &name,
        declared.as_deref(),
        Arc::from(bytes),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_secret_the_server_was_given_is_redacted_from_its_result() {
        crate::secrets::register("server-token-0123456789");
        let r =
            shape(&json!({"content": [{"type": "text", "text": "token server-token-0123456789"}]}));
        assert_eq!(r.text, "token [redacted]");
        let r =
            shape(&json!({"content": [], "structuredContent": {"t": "server-token-0123456789"}}));
        assert_eq!(r.structured, Some(json!({"t": "[redacted]"})));
        assert_eq!(r.text, r#"{"t":"[redacted]"}"#);
    }

    #[test]
    fn structured_content_wins_then_blocks_join() {
        let r = shape(
            &json!({"content": [{"type": "text", "text": "{\"a\":1}"}], "structuredContent": {"a": 1}}),
        );
        assert_eq!(r.text, "{\"a\":1}");
        assert_eq!(r.structured, Some(json!({"a": 1})));
        let r = shape(&json!({"content": [
            {"type": "text", "text": "one"},
            {"type": "image", "data": "AAA", "mimeType": "image/png"},
            {"type": "text", "text": "two"}]}));
        assert_eq!(
            r.text,
            "one\n{\"data\":\"AAA\",\"mimeType\":\"image/png\",\"type\":\"image\"}\ntwo"
        );
        assert!(!r.is_error);
        let r = shape(&json!({"content": [{"type": "text", "text": "bad"}], "isError": true}));
        assert!(r.is_error);
        assert_eq!(r.text, "bad");
    }
}
