//! Keeping keys out of logs, errors, transcripts, the store and cassettes.
//!
//! Every key colony reads is registered here when it is read; [`redact`] replaces each registered
//! key, a URL query's credentials (`key=`, `api_key=`, `token=`, `sig=` ...) and a URL's password
//! (`user:password@`) with `[redacted]`. Error paths
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

/// Whether a query parameter of this name carries a credential: `key`, `api_key`, `token`,
/// `access_token`, `secret`, `password`, `sig`, `signature`, `auth` and the like (a signed URL
/// is as good as a key while it lasts).
fn credential_name(name: &str) -> bool {
    let name = name.to_ascii_lowercase();
    [
        "key",
        "token",
        "secret",
        "password",
        "passwd",
        "sig",
        "signature",
        "auth",
        "credential",
    ]
    .iter()
    .any(|end| {
        name.strip_suffix(end).is_some_and(|head| {
            head.is_empty() || head.ends_with(['_', '-', '.']) || (*end == "key" && head == "api")
        })
    }) || name == "apikey"
}

/// `text` with the value of every credential query parameter ([`credential_name`]) and the
/// password of every `scheme://user:password@host` replaced by `[redacted]`.
fn redact_query_keys(text: &str) -> String {
    // A text that starts with `key=...` has its parameter at a boundary too: a `&` in front
    // makes it one like the others, and is taken off again at the end.
    let text = format!("&{}", redact_passwords(text));
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    let mut i = 0;
    while i < bytes.len() {
        if !matches!(bytes[i], b'?' | b'&') {
            i += 1;
            continue;
        }
        let name_start = i + 1;
        let name_end = name_start
            + text[name_start..]
                .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
                .unwrap_or(text.len() - name_start);
        if bytes.get(name_end) != Some(&b'=') || !credential_name(&text[name_start..name_end]) {
            i = name_end.max(i + 1);
            continue;
        }
        let value_start = name_end + 1;
        let mut value_end = value_start
            + text[value_start..]
                .find(|c: char| c == '&' || c == '"' || c == ')' || c == '#' || c.is_whitespace())
                .unwrap_or(text.len() - value_start);
        // A URL quoted in a message is followed by `: why` (reqwest's `... for url (URL):`,
        // colony's `URL: error`): that colon ends the value, or the redaction took the
        // separator with it.
        if text[value_start..value_end].ends_with(':') {
            value_end -= 1;
        }
        if value_end > value_start {
            out.push_str(&text[copied..value_start]);
            out.push_str("[redacted]");
            copied = value_end;
        }
        i = value_end;
    }
    out.push_str(&text[copied..]);
    out.split_off(1)
}

/// `scheme://user:password@host` as `scheme://user:[redacted]@host`, wherever it appears.
fn redact_passwords(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find("://") {
        out.push_str(&rest[..at + 3]);
        rest = &rest[at + 3..];
        // The authority ends at the path, the query, or the end of the URL.
        let authority_end = rest
            .find(|c: char| matches!(c, '/' | '?' | '#' | '"' | ')') || c.is_whitespace())
            .unwrap_or(rest.len());
        let authority = &rest[..authority_end];
        if let Some(userinfo_end) = authority.rfind('@')
            && let Some(colon) = authority[..userinfo_end].find(':')
        {
            out.push_str(&authority[..colon + 1]);
            out.push_str("[redacted]");
            out.push_str(&authority[userinfo_end..]);
            rest = &rest[authority_end..];
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
        assert_eq!(
            redact("key=AIzaXYZ at the start"),
            "key=[redacted] at the start"
        );
    }

    #[test]
    fn credential_parameters_and_url_passwords_are_scrubbed() {
        let s = redact(
            "GET http://user:s3cret@h:1/p?q=1&api_key=A&token=T&access_token=X&sig=S&X-Amz-Signature=Z&monkey=m&tokens=9 failed",
        );
        assert_eq!(
            s,
            "GET http://user:[redacted]@h:1/p?q=1&api_key=[redacted]&token=[redacted]&access_token=[redacted]&sig=[redacted]&X-Amz-Signature=[redacted]&monkey=m&tokens=9 failed"
        );
        // A user without a password, and an address in text, are left as they are.
        assert_eq!(
            redact("http://user@h/p and a@b:c"),
            "http://user@h/p and a@b:c"
        );
        assert_eq!(
            redact("postgres://u:pw@db/x?sslmode=require"),
            "postgres://u:[redacted]@db/x?sslmode=require"
        );
        // The `: why` after a quoted URL stays (it was taken with the value).
        assert_eq!(
            redact("http://h/a?token=abc123: error sending request"),
            "http://h/a?token=[redacted]: error sending request"
        );
    }
}
