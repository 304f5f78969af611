//! A `tools/call` result as the text a model reads: `structuredContent` as JSON when present, else
//! the content blocks joined by newlines (text as it is, other blocks as JSON).

use serde_json::Value;

/// What a call answered: the text for the model, the structured value if any, and whether the
/// server flagged it as an error (`isError: true`).
#[derive(Debug, Clone, PartialEq)]
pub struct CallOutput {
    pub text: String,
    pub structured: Option<Value>,
    pub is_error: bool,
}

/// Shapes a `CallToolResult` (as JSON, so this does not depend on the SDK's types).
pub fn shape(result: &Value) -> CallOutput {
    let structured = result
        .get("structuredContent")
        .filter(|v| !v.is_null())
        .cloned();
    let is_error = result
        .get("isError")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let text = match &structured {
        Some(v) => v.to_string(),
        None => result
            .get("content")
            .and_then(Value::as_array)
            .map(|blocks| {
                blocks
                    .iter()
                    .map(content_to_text)
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_default(),
    };
    CallOutput {
        text,
        structured,
        is_error,
    }
}

/// One content block as text. Images, audio and embedded resources are JSON for now; this is
/// where they become files once the files issue lands (`files::` content types).
pub fn content_to_text(block: &Value) -> String {
    match (
        block.get("type").and_then(Value::as_str),
        block.get("text").and_then(Value::as_str),
    ) {
        (Some("text"), Some(text)) => text.to_string(),
        _ => block.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
