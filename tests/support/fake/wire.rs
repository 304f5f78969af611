//! What the three wire styles share: the context of one call, stream frames, and the [`Wire`]
//! trait each style implements. Faults (drop, malformed, mid-stream error) are applied by the
//! server on top of these renderings, so every style gets them the same way.

use axum::http::HeaderMap;
use serde_json::Value;

use super::reply::{Call, Reply};

/// What a rendering needs to know about the request it answers.
pub(crate) struct Ctx<'a> {
    /// The request body (Null when not JSON).
    pub req: &'a Value,
    /// The model asked for (body `model`, or Gemini's path segment).
    pub model: String,
    /// A per-server sequence number, to make ids unique.
    pub seq: u64,
}

impl Ctx<'_> {
    /// A response id such as `msg_01Fake000000000000000003`.
    pub fn id(&self, prefix: &str) -> String {
        format!("{prefix}01Fake{:018}", self.seq)
    }

    /// The call's scripted id, or an invented one with the style's prefix when it is empty.
    pub fn call_id(&self, call: &Call, index: usize, prefix: &str) -> String {
        if call.id.is_empty() {
            format!("{prefix}fake{:04}x{index}", self.seq)
        } else {
            call.id.clone()
        }
    }

    /// A string field of the request body, if present.
    pub fn req_str(&self, pointer: &str) -> Option<&str> {
        self.req.pointer(pointer).and_then(Value::as_str)
    }
}

/// One piece of a stream.
pub(crate) enum Frame {
    /// `event: NAME` + `data: JSON` (Anthropic).
    Event(&'static str, Value),
    /// `data: JSON` alone (OpenAI, Gemini).
    Data(Value),
    /// Bytes sent as they are (`data: [DONE]`, malformed events).
    Raw(String),
}

/// A normal stream: `head` (start and content) then `tail` (stop reason, usage, end marker).
/// A mid-stream error replaces the tail.
pub(crate) struct Stream {
    pub head: Vec<Frame>,
    pub tail: Vec<Frame>,
}

/// The neutral fault kinds, as the styles classify them.
pub(crate) fn is_overload(kind: &str) -> bool {
    kind.contains("overload") || kind == "UNAVAILABLE"
}

pub(crate) fn is_rate_limit(kind: &str) -> bool {
    kind.contains("rate_limit") || kind == "RESOURCE_EXHAUSTED"
}

/// One provider style.
pub(crate) trait Wire: Sync {
    /// `anthropic`, `openai` or `gemini`: also the path prefix.
    fn name(&self) -> &'static str;
    /// The event separator of this style's SSE.
    fn sep(&self) -> &'static str {
        "\n\n"
    }
    /// Whether the request carries this style's API key.
    fn has_key(&self, headers: &HeaderMap, query: &str) -> bool;
    /// The header the key goes in, for the 401 message.
    fn key_header(&self) -> &'static str;
    /// Headers every answer of this style carries (request ids).
    fn headers(&self, seq: u64) -> Vec<(&'static str, String)>;
    /// The model list body.
    fn models(&self) -> Value;
    /// The style's error body for an HTTP status; `kind` overrides the derived type.
    fn error(
        &self,
        status: u16,
        kind: Option<&str>,
        message: &str,
        retry_after: Option<&str>,
    ) -> Value;
    /// The HTTP status a non-streamed request gets for a `stream_error` reply.
    fn error_status(&self, kind: &str) -> u16 {
        if is_overload(kind) {
            503
        } else if is_rate_limit(kind) {
            429
        } else {
            500
        }
    }
    /// The whole non-streamed body.
    fn message(&self, r: &Reply, cx: &Ctx) -> Value;
    /// The streamed rendering.
    fn stream(&self, r: &Reply, cx: &Ctx) -> Stream;
    /// The mid-stream error event.
    fn stream_error(&self, kind: &str, message: &str) -> Frame;
    /// A stream event whose data is not valid JSON.
    fn malformed(&self) -> Frame;
}
