//! Token counts as the servers write them, read the same way for every wire style.
//!
//! A count that is there and is no count (negative, fractional, text, past any `u64`) makes the
//! whole usage unreadable: taken as not reported, which a token budget does not pass. Read as 0
//! (and the other fields counted), a server that sent garbage let every turn through a token
//! budget without a word.

use serde_json::Value;

/// A token count: an integer, or a float with an integer's value (`100.0`); `None` for
/// anything else.
pub fn count(v: &Value) -> Option<u64> {
    v.as_u64().or_else(|| {
        v.as_f64()
            .filter(|f| f.is_finite() && *f >= 0.0 && f.fract() == 0.0 && *f < u64::MAX as f64)
            .map(|f| f as u64)
    })
}

/// The first of `fields` that `usage` holds as something other than a count (absent and `null`
/// are fine), said on stderr: the usage cannot be read.
pub fn garbled(usage: &Value, fields: &[&str]) -> bool {
    let Some((field, v)) = fields.iter().find_map(|f| {
        usage
            .get(*f)
            .filter(|v| !v.is_null() && count(v).is_none())
            .map(|v| (*f, v))
    }) else {
        return false;
    };
    let mut shown = v.to_string();
    if shown.len() > 200 {
        let mut end = 200;
        while !shown.is_char_boundary(end) {
            end -= 1;
        }
        shown.truncate(end);
        shown.push_str("...");
    }
    tracing::warn!(
        "the server's usage says {field} = {shown}, which is no token count: its usage is not \
         counted"
    );
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn counts_are_whole_numbers_and_anything_else_is_garbled() {
        assert_eq!(count(&json!(100)), Some(100));
        assert_eq!(count(&json!(100.0)), Some(100));
        for bad in [json!(-1), json!(1.5), json!(1e23), json!("100"), json!([1])] {
            assert_eq!(count(&bad), None, "{bad}");
        }
        let usage = json!({"a": 1, "b": null, "c": "many"});
        assert!(!garbled(&usage, &["a", "b", "missing"]));
        assert!(garbled(&usage, &["a", "c"]));
    }
}
