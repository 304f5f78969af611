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
//! | `MALFORMED_FUNCTION_CALL`, `OTHER`, anything else | `Error`, `REASON: finishMessage` (or the reason) appended as a text part, not streamed as a delta |
//! | none, prompt blocked (`promptFeedback.blockReason`, no candidates) | `ContentFilter`, empty text |
//! | none, stream cut | [`ProviderError::Fetch`] "the stream ended before a finishReason" |
//!
//! `MALFORMED_FUNCTION_CALL` is an answer, not a [`ProviderError`] here: the request was fine and
//! the same request may well succeed, and the `finishMessage` (the call the model botched) is
//! what the caller needs to see, so it is kept as the message's text with `Stop::Error`. A turn
//! and `ai.ask` make it a transient `provider_error` carrying that text
//! ([`ProviderError::failed_answer`]), never a reply.
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
//!
//! # Files
//! `request` builds the body; `schema` converts a tool's JSON Schema; `response` reads an
//! answer, whole or streamed; `streamed_call` joins a call's arguments streamed in pieces;
//! `opaque` keeps what goes back beside a part.

mod opaque;
mod request;
mod response;
mod schema;
mod streamed_call;

use serde_json::Value;

use super::{Assembler, Codec, Endpoint, ProviderError, WireRequest};
use crate::vocab::{InferRequest, Inferred};
use request::{key_headers, model_path, request_body};
use response::Answer;

pub use schema::gemini_schema;

pub struct Gemini;

impl Codec for Gemini {
    fn request(&self, req: &InferRequest, ep: &Endpoint, stream: bool) -> WireRequest {
        let method = if stream {
            "streamGenerateContent?alt=sse"
        } else {
            "generateContent"
        };
        WireRequest::with_json(
            format!("{}/{}:{method}", ep.base(), model_path(&req.model)),
            key_headers(ep),
            &request_body(req),
        )
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
            body: Vec::new(),
        }
    }

    /// Model ids without the `models/` prefix. Models that list their generation methods and
    /// cannot `generateContent` (embedding, AQA) are left out: they cannot answer a chat.
    fn parse_models(&self, body: &Value) -> Result<Vec<String>, String> {
        Ok(super::list_of(body, "models")?
            .iter()
            .filter(|m| {
                m.get("supportedGenerationMethods")
                    .and_then(Value::as_array)
                    .is_none_or(|methods| methods.iter().any(|x| x == "generateContent"))
            })
            .filter_map(|m| m.get("name").and_then(Value::as_str))
            .map(|name| name.strip_prefix("models/").unwrap_or(name).to_string())
            .collect())
    }
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
mod tests;
