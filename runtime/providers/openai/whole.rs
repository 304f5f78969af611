//! A whole (non-streamed) chat completion of the usual shape, read straight into a [`Draft`].
//!
//! Every step reads one, and through a `serde_json::Value` tree it cost about 35 K
//! instructions: every field of the answer (ids, fingerprints, token details) allocated as a
//! tree, read, then freed. Here the fields colony reads are deserialised in place and the rest
//! skipped. Anything else (an error body, a field of an unexpected type, a duplicate field)
//! makes [`read`] answer `None`, and the caller reads the body through `parse_value`, which
//! accepts every shape the general reader does and names what is wrong; on the shapes both
//! accept they give the same answer (the tests below hold them to it).

use std::borrow::Cow;
use std::fmt;

use serde::Deserialize;
use serde::de::{Deserializer, IgnoredAny, MapAccess, Visitor};
use serde_json::{Map, Value};

use super::{Draft, DraftCall, REASONING_FIELDS, TOOL_CALL_FIELDS};
use crate::vocab::Usage;

/// The answer in `body` when it has the usual shape.
pub(super) fn read(body: &[u8]) -> Option<Draft> {
    let whole: Whole = serde_json::from_slice(body).ok()?;
    if whole.error.is_some() {
        return None;
    }
    let choice = whole
        .choices?
        .into_iter()
        .find(|c| c.index.unwrap_or(0) == 0)?;
    let message = choice.message?;
    let mut draft = Draft::default();
    if let Some(model) = whole.model.filter(|m| !m.is_empty()) {
        draft.model = Some(model.into_owned());
    }
    if let Some(usage) = whole.usage {
        draft.usage = usage.read();
    }
    let reasoning = [&message.reasoning_content, &message.reasoning];
    if let Some((field, text)) = REASONING_FIELDS
        .iter()
        .zip(reasoning)
        .find_map(|(field, value)| value.as_ref()?.as_str().map(|text| (*field, text)))
    {
        draft.add_reasoning(field, text);
    }
    if let Some(content) = &message.content {
        draft.text.push_str(content);
    }
    if let Some(refusal) = message.refusal.filter(|r| !r.is_empty()) {
        draft.text.push_str(&refusal);
        draft.refused = true;
    }
    for (position, call) in message.tool_calls.into_iter().flatten().enumerate() {
        draft.calls.push(call.into_draft(position as u64));
    }
    draft.finish_reason = choice.finish_reason.map(Cow::into_owned);
    Some(draft)
}

#[derive(Deserialize)]
struct Whole<'a> {
    #[serde(default)]
    error: Option<IgnoredAny>,
    #[serde(default, borrow)]
    model: Option<Cow<'a, str>>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(default, borrow)]
    choices: Option<Vec<Choice<'a>>>,
}

#[derive(Deserialize)]
struct Choice<'a> {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default, borrow)]
    message: Option<WireMessage<'a>>,
    #[serde(default, borrow)]
    finish_reason: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct WireMessage<'a> {
    #[serde(default, borrow)]
    content: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    refusal: Option<Cow<'a, str>>,
    // Values: a reasoning field that is not text is passed over, as the general reader does.
    #[serde(default)]
    reasoning_content: Option<Value>,
    #[serde(default)]
    reasoning: Option<Value>,
    #[serde(default, borrow)]
    tool_calls: Option<Vec<WireCall<'a>>>,
}

/// A call: its id and function, and any field beyond `index` / `id` / `type` / `function`
/// kept (not null) as opaque data.
struct WireCall<'a> {
    id: Option<Cow<'a, str>>,
    function: Option<WireFunction<'a>>,
    extra: Map<String, Value>,
}

#[derive(Deserialize)]
struct WireFunction<'a> {
    #[serde(default, borrow)]
    name: Option<Cow<'a, str>>,
    #[serde(default, borrow)]
    arguments: Option<Cow<'a, str>>,
}

impl WireCall<'_> {
    fn into_draft(self, index: u64) -> DraftCall {
        let mut call = DraftCall {
            index,
            extra: self.extra,
            ..DraftCall::default()
        };
        if let Some(id) = self.id.filter(|id| !id.is_empty()) {
            call.id = id.into_owned();
        }
        if let Some(function) = self.function {
            if let Some(name) = function.name.filter(|n| !n.is_empty()) {
                call.name = name.into_owned();
            }
            if let Some(arguments) = function.arguments {
                call.arguments = arguments.into_owned();
            }
        }
        call
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for WireCall<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_map(CallVisitor(std::marker::PhantomData))
    }
}

struct CallVisitor<'a>(std::marker::PhantomData<&'a ()>);

impl<'de: 'a, 'a> Visitor<'de> for CallVisitor<'a> {
    type Value = WireCall<'a>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a tool call object")
    }

    fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<WireCall<'a>, M::Error> {
        use serde::de::Error;
        let mut call = WireCall {
            id: None,
            function: None,
            extra: Map::new(),
        };
        let (mut seen_id, mut seen_function) = (false, false);
        while let Some(key) = map.next_key::<Cow<'de, str>>()? {
            match key.as_ref() {
                "id" if !seen_id => {
                    seen_id = true;
                    call.id = map.next_value()?;
                }
                "function" if !seen_function => {
                    seen_function = true;
                    call.function = map.next_value()?;
                }
                // A second id or function: the general reader decides which counts.
                "id" | "function" => return Err(M::Error::custom("a repeated field")),
                other if TOOL_CALL_FIELDS.contains(&other) => {
                    map.next_value::<IgnoredAny>()?;
                }
                _ => {
                    let value: Value = map.next_value()?;
                    if !value.is_null() {
                        call.extra.insert(key.into_owned(), value);
                    }
                }
            }
        }
        Ok(call)
    }
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    prompt_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens: Option<u64>,
    #[serde(default)]
    prompt_tokens_details: Option<PromptDetails>,
    #[serde(default)]
    prompt_cache_hit_tokens: Option<u64>,
    #[serde(default)]
    cached_tokens: Option<u64>,
    #[serde(default)]
    completion_tokens_details: Option<CompletionDetails>,
}

#[derive(Deserialize)]
struct PromptDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
    #[serde(default)]
    cache_write_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct CompletionDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

impl WireUsage {
    /// As `read_usage` reads the same fields.
    fn read(self) -> Usage {
        let prompt = self.prompt_tokens_details.as_ref();
        Usage {
            input: self.prompt_tokens.unwrap_or(0),
            output: self.completion_tokens.unwrap_or(0),
            cache_read: prompt
                .and_then(|p| p.cached_tokens)
                .or(self.prompt_cache_hit_tokens)
                .or(self.cached_tokens)
                .unwrap_or(0),
            cache_write: prompt.and_then(|p| p.cache_write_tokens).unwrap_or(0),
            reasoning: self
                .completion_tokens_details
                .and_then(|c| c.reasoning_tokens)
                .unwrap_or(0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse_value;
    use super::*;

    /// Bodies of the usual shape: `read` takes them and answers as the general reader does.
    const USUAL: &[&str] = &[
        // The fake server of the peers benchmark: a call, then the text.
        r#"{"id":"chatcmpl-1","object":"chat.completion","created":1,"model":"fake-model","choices":[{"index":0,"message":{"role":"assistant","content":null,"refusal":null,"annotations":[],"tool_calls":[{"id":"call_1","type":"function","function":{"name":"add","arguments":"{\"a\":2,\"b\":3}"}}]},"logprobs":null,"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":8,"completion_tokens":12,"total_tokens":20,"prompt_tokens_details":{"cached_tokens":3,"audio_tokens":0},"completion_tokens_details":{"reasoning_tokens":5}},"system_fingerprint":"fp"}"#,
        r#"{"model":"m","choices":[{"message":{"role":"assistant","content":"The answer is 5."},"finish_reason":"stop"}]}"#,
        // Escapes in every string colony keeps.
        r#"{"model":"m\u00e9","choices":[{"index":0,"message":{"content":"a\n\"b\"","tool_calls":[{"id":"c\t1","function":{"name":"n\u00e9","arguments":"{\"q\":\"\\u00e9\"}"}}]},"finish_reason":"tool_calls"}]}"#,
        // Reasoning (DeepSeek, OpenRouter), a non-text first field passed over; refusal.
        r#"{"choices":[{"message":{"reasoning_content":"think","reasoning":"other","content":"x"}}]}"#,
        r#"{"choices":[{"message":{"reasoning_content":{"a":1},"reasoning":"r","content":""}}]}"#,
        r#"{"choices":[{"message":{"content":null,"refusal":"I can't."},"finish_reason":"stop"}]}"#,
        // Opaque call fields (Gemini's compatibility layer), a null extra dropped, no id.
        r#"{"choices":[{"message":{"tool_calls":[{"index":0,"type":"function","function":{"name":"f","arguments":""},"extra_content":{"google":{"thought_signature":"sig"}},"nothing":null}]}}]}"#,
        // Usage variants: DeepSeek's and Kimi's cache fields, OpenRouter's cache writes.
        r#"{"usage":{"prompt_tokens":1,"prompt_cache_hit_tokens":4},"choices":[{"message":{"content":"x"}}]}"#,
        r#"{"usage":{"cached_tokens":6,"prompt_tokens_details":{"cache_write_tokens":2}},"choices":[{"message":{"content":"x"}}]}"#,
        // The first choice is the one with index 0.
        r#"{"choices":[{"index":1,"message":{"content":"second"}},{"index":0,"message":{"content":"first"}}]}"#,
        // Two calls; one without a name (an error either way).
        r#"{"choices":[{"message":{"tool_calls":[{"id":"a","function":{"name":"x","arguments":"{}"}},{"id":"b","function":{"name":"y"}}]}}]}"#,
        r#"{"choices":[{"message":{"tool_calls":[{"id":"a","function":{"arguments":"{}"}}]}}]}"#,
        r#"{"error":null,"usage":null,"model":null,"choices":[{"message":{"content":"x"},"finish_reason":null}]}"#,
    ];

    /// Bodies the general reader must see: errors, odd types, repeated fields.
    const OTHERS: &[&str] = &[
        r#"{"error":{"message":"overloaded","type":"server_error"}}"#,
        r#"not json"#,
        r#"[]"#,
        r#"{"choices":{}}"#,
        r#"{"choices":[]}"#,
        r#"{"choices":[{"message":null}]}"#,
        r#"{"choices":[{"index":"0","message":{"content":"x"}}]}"#,
        r#"{"choices":[{"message":{"content":["parts"]}}]}"#,
        r#"{"choices":[{"message":{"content":"x","refusal":7}}]}"#,
        r#"{"choices":[{"message":{"tool_calls":{"id":"a"}}}]}"#,
        r#"{"choices":[{"message":{"tool_calls":[{"id":"a","function":{"name":"f","arguments":{"q":1}}}]}}]}"#,
        r#"{"choices":[{"message":{"tool_calls":[{"id":"a","id":"b","function":{"name":"f"}}]}}]}"#,
        r#"{"model":5,"choices":[{"message":{"content":"x"}}]}"#,
        r#"{"usage":{"prompt_tokens":1.5},"choices":[{"message":{"content":"x"}}]}"#,
        r#"{"usage":"none","choices":[{"message":{"content":"x"}}]}"#,
    ];

    #[test]
    fn the_usual_shape_is_read_as_the_general_reader_reads_it() {
        for body in USUAL {
            let draft = read(body.as_bytes()).unwrap_or_else(|| panic!("not taken: {body}"));
            assert_eq!(
                format!("{:?}", draft.into_inferred()),
                format!("{:?}", parse_value(body.as_bytes())),
                "{body}"
            );
        }
    }

    #[test]
    fn anything_else_goes_to_the_general_reader() {
        for body in OTHERS {
            assert!(read(body.as_bytes()).is_none(), "taken: {body}");
        }
    }
}
