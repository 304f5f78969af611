//! Keeping keys out of logs, errors, transcripts, the store and cassettes.
//!
//! Every key colony reads is registered here when it is read; [`redact`] replaces each registered
//! key, and anything shaped like a key in a URL query (`key=...`), with `[redacted]`. Error paths
//! call it on every body and message that came from outside.

use std::sync::{LazyLock, RwLock};

static KNOWN: LazyLock<RwLock<Vec<String>>> = LazyLock::new(|| RwLock::new(Vec::new()));

/// Remembers a key so later text can be scrubbed of it. Short values are ignored: redacting
/// "abc" everywhere would mangle ordinary text, and a three-letter key protects nothing anyway.
pub fn register(key: &str) {
    if key.len() < 8 {
        return;
    }
    // Every request registers its key: the common case (already known) takes only a read lock,
    // so residents calling at once do not queue on a write lock.
    if KNOWN
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .any(|k| k == key)
    {
        return;
    }
    let mut known = KNOWN.write().unwrap_or_else(|e| e.into_inner());
    if !known.iter().any(|k| k == key) {
        known.push(key.to_string());
    }
}

/// `text` with every registered key and every `key=` query value replaced by `[redacted]`.
pub fn redact(text: &str) -> String {
    let mut out = text.to_string();
    {
        let known = KNOWN.read().unwrap_or_else(|e| e.into_inner());
        for key in known.iter() {
            if out.contains(key.as_str()) {
                out = out.replace(key.as_str(), "[redacted]");
            }
        }
    }
    redact_query_keys(&out)
}

fn redact_query_keys(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("key=") {
        let boundary = at == 0 || matches!(rest.as_bytes()[at - 1], b'?' | b'&');
        out.push_str(&rest[..at + 4]);
        rest = &rest[at + 4..];
        if boundary {
            let end = rest
                .find(|c: char| c == '&' || c == '"' || c == ')' || c.is_whitespace())
                .unwrap_or(rest.len());
            if end > 0 {
                out.push_str("[redacted]");
            }
            rest = &rest[end..];
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_keys_and_query_keys_are_scrubbed() {
        register("sk-test-0123456789");
        let s = redact("bad key sk-test-0123456789 at https://x/y?alt=sse&key=AIzaXYZ ok");
        assert_eq!(
            s,
            "bad key [redacted] at https://x/y?alt=sse&key=[redacted] ok"
        );
        assert_eq!(redact("monkey=1"), "monkey=1");
    }
}
