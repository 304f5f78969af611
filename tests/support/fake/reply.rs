//! What a scripted model call answers, in provider-neutral terms. The style modules render a
//! [`Reply`] as Anthropic, OpenAI or Gemini wire output; the server applies the faults.

use std::time::Duration;

use serde_json::Value;

/// One tool call the fake model makes. An empty `id` means "let the style invent one" (and, for
/// Gemini, send the call without an `id`, as older models do).
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    pub id: String,
    pub name: String,
    pub args: Value,
    /// Argument text sent as is instead of `args` where the wire carries text (OpenAI, and
    /// Anthropic streams), to script a model that sends broken JSON.
    pub raw: Option<String>,
}

impl Call {
    /// The arguments as the wire's text carries them.
    pub fn args_text(&self) -> String {
        self.raw.clone().unwrap_or_else(|| self.args.to_string())
    }
}

/// How the answer misbehaves, if it does.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Kind {
    /// A normal 200 answer.
    Normal,
    /// Any status with a custom or style-default error body.
    Status,
    /// Half the answer, then the connection is cut.
    DropMidStream,
    /// 200 with a body (or one stream event) that is not JSON.
    Malformed,
    /// 200 stream that starts, then carries the style's mid-stream error.
    StreamError { kind: String, message: String },
}

/// A scripted answer. Build with a constructor, then chain modifiers:
/// `Reply::tool_call("toolu_1", "get_weather", json!({"city": "Paris"})).with_text("Let me check").usage(20, 7)`.
#[derive(Clone, Debug)]
pub struct Reply {
    pub(crate) kind: Kind,
    pub(crate) text: String,
    pub(crate) calls: Vec<Call>,
    pub(crate) reasoning: Option<(String, String)>,
    pub(crate) usage: (u64, u64),
    /// How many of the input tokens the reply reports as read from a prompt cache.
    pub(crate) cache_read: u64,
    pub(crate) stop: Option<String>,
    pub(crate) status: u16,
    pub(crate) headers: Vec<(String, String)>,
    pub(crate) body: Option<String>,
    pub(crate) delay: Duration,
    pub(crate) stream_delay: Duration,
}

impl Reply {
    fn base(kind: Kind) -> Reply {
        Reply {
            kind,
            text: String::new(),
            calls: Vec::new(),
            reasoning: None,
            usage: (10, 5),
            cache_read: 0,
            stop: None,
            status: 200,
            headers: Vec::new(),
            body: None,
            delay: Duration::ZERO,
            stream_delay: Duration::ZERO,
        }
    }

    /// A text answer. Streamed, it arrives as one delta per word (spaces lead: `"a b"` is
    /// `"a"`, `" b"`).
    pub fn text(text: impl Into<String>) -> Reply {
        Reply {
            text: text.into(),
            ..Reply::base(Kind::Normal)
        }
    }

    /// One tool call; `args` is the JSON object of arguments.
    pub fn tool_call(id: impl Into<String>, name: impl Into<String>, args: Value) -> Reply {
        Reply::tool_calls(vec![(id.into(), name.into(), args)])
    }

    /// Several tool calls in one answer (parallel calls), in order.
    pub fn tool_calls<I, N>(calls: Vec<(I, N, Value)>) -> Reply
    where
        I: Into<String>,
        N: Into<String>,
    {
        Reply {
            calls: calls
                .into_iter()
                .map(|(id, name, args)| Call {
                    id: id.into(),
                    name: name.into(),
                    args,
                    raw: None,
                })
                .collect(),
            ..Reply::base(Kind::Normal)
        }
    }

    /// One tool call whose argument text is `raw` exactly (which need not be JSON). Gemini
    /// carries arguments as an object and cannot send this: it sends `{}` there.
    pub fn tool_call_raw(id: impl Into<String>, name: impl Into<String>, raw: &str) -> Reply {
        let mut reply = Reply::tool_call(id, name, Value::Object(Default::default()));
        reply.calls[0].raw = Some(raw.to_string());
        reply
    }

    /// Any HTTP status. The body defaults to the style's error JSON for that status (Gemini's
    /// carries a `RetryInfo` detail when a `retry-after` header is set); see [`Reply::body`].
    pub fn status(code: u16) -> Reply {
        Reply {
            status: code,
            ..Reply::base(Kind::Status)
        }
    }

    /// Streamed: roughly the first half of the stream (at least one event), then the connection
    /// is closed without the end marker. Not streamed: a `Content-Length` larger than the half
    /// body that is sent, then close.
    pub fn drop_mid_stream(text: impl Into<String>) -> Reply {
        Reply {
            text: text.into(),
            ..Reply::base(Kind::DropMidStream)
        }
    }

    /// 200 whose body is cut-off JSON; streamed, the normal stream with one event whose data is
    /// not JSON inserted before the end.
    pub fn malformed() -> Reply {
        Reply {
            text: "this answer will not parse".into(),
            ..Reply::base(Kind::Malformed)
        }
    }

    /// A 200 stream that starts (message start, and the text of `.with_text` if any), then
    /// carries the style's mid-stream error and ends without the end marker. `kind` is the
    /// Anthropic error type (`overloaded_error`, `rate_limit_error`, `api_error`, ...); OpenAI
    /// uses it as `error.type`, Gemini maps it to a code and status (overloaded: 503
    /// `UNAVAILABLE`, rate limit: 429 `RESOURCE_EXHAUSTED`, else 500 `INTERNAL`). A
    /// non-streamed request gets that error as an HTTP status instead (Anthropic overloaded: 529).
    pub fn stream_error(kind: impl Into<String>, message: impl Into<String>) -> Reply {
        Reply::base(Kind::StreamError {
            kind: kind.into(),
            message: message.into(),
        })
    }

    /// Text before the tool calls (or the partial text of a `stream_error`).
    pub fn with_text(mut self, text: impl Into<String>) -> Reply {
        self.text = text.into();
        self
    }

    /// Input and output token counts (default 10 and 5).
    pub fn usage(mut self, input: u64, output: u64) -> Reply {
        self.usage = (input, output);
        self
    }

    /// Reports `read` of the input tokens as read from a prompt cache, in each provider's style:
    /// Anthropic apart from `input_tokens` (`cache_read_input_tokens`), OpenAI among
    /// `prompt_tokens` (`prompt_tokens_details.cached_tokens`).
    #[allow(dead_code)]
    pub fn cache_read(mut self, read: u64) -> Reply {
        self.cache_read = read;
        self
    }

    /// Overrides the stop reason, by neutral name: `end_turn`, `tool_use`, `max_tokens`,
    /// `stop_sequence`, `content_filter`, `refusal`. Any other name is sent verbatim (e.g.
    /// `"MALFORMED_FUNCTION_CALL"` for Gemini). Default: `tool_use` with calls, else `end_turn`.
    pub fn stop(mut self, reason: impl Into<String>) -> Reply {
        self.stop = Some(reason.into());
        self
    }

    /// Reasoning before the answer: Anthropic `thinking` block with `signature`; OpenAI
    /// `reasoning_content` (signature dropped); Gemini a `thought: true` part, with the signature
    /// as `thoughtSignature` on the first functionCall/text part.
    pub fn reasoning(mut self, thinking: impl Into<String>, signature: impl Into<String>) -> Reply {
        self.reasoning = Some((thinking.into(), signature.into()));
        self
    }

    /// Adds (or replaces) a response header; works on every kind of reply.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Reply {
        self.headers
            .push((name.into().to_ascii_lowercase(), value.into()));
        self
    }

    /// The exact response body of a [`Reply::status`] reply.
    pub fn body(mut self, body: impl Into<String>) -> Reply {
        self.body = Some(body.into());
        self
    }

    /// Wait this long before sending the status and headers.
    pub fn delay(mut self, ms: u64) -> Reply {
        self.delay = Duration::from_millis(ms);
        self
    }

    /// Wait this long between stream chunks.
    pub fn stream_delay(mut self, ms: u64) -> Reply {
        self.stream_delay = Duration::from_millis(ms);
        self
    }

    /// The neutral stop reason this reply ends with.
    pub(crate) fn stop_reason(&self) -> &str {
        match &self.stop {
            Some(s) => s,
            None if self.calls.is_empty() => "end_turn",
            None => "tool_use",
        }
    }

    /// The text as stream deltas: one per word, each space attached to the word after it.
    pub(crate) fn text_deltas(&self) -> Vec<String> {
        words(&self.text)
    }
}

/// `"Hello big  world"` -> `["Hello", " big", "  world"]`.
pub(crate) fn words(text: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let mut prev_space = false;
    for c in text.chars() {
        let space = c.is_whitespace();
        if space && !prev_space || out.is_empty() {
            out.push(String::new());
        }
        out.last_mut().unwrap().push(c);
        prev_space = space;
    }
    out
}

/// Serialized arguments cut into up to three fragments at arbitrary character positions (they
/// may split a string or an escape, as real streams do).
pub(crate) fn arg_fragments(call: &Call) -> Vec<String> {
    let s = call.args_text();
    let chars: Vec<char> = s.chars().collect();
    let size = chars.len().div_ceil(3).max(1);
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}
