//! colony's own estimate of a request's size in tokens, so compaction does not depend on what
//! the provider reports: some OpenAI-compatible servers report a small fixed `prompt_tokens`, and
//! others nothing at all when streaming. Compaction decides on the larger of the two.
//!
//! The rule is deliberately conservative: every byte of text the request carries counts at
//! [`BYTES_PER_TOKEN`] bytes a token (tokenizers average about four bytes a token on English
//! prose and about three on JSON, code and non-Latin scripts), plus tokens for the framing a
//! provider adds around each message, tool call and result, file and tool definition (role
//! markers, call ids, the markup a tool call is rendered in). The framing figures are set from
//! what providers counted for recorded answers (`tests/estimate.rs` checks every recorded answer
//! under `tests/data/providers/`): Anthropic counts about thirty tokens for a tool call beyond its
//! name and arguments, and a short reply costs a few tokens more than its text. Text is the
//! system prompt, the tools' names, descriptions and schemas, message text and reasoning, tool
//! calls' names and arguments, and tool results. Files count by what the request inlines of them
//! on the endpoint's wire: a text file inside the window by its inlined text (capped, see
//! [`crate::files::forms::TEXT_CAP`]), a file the API cannot read by its note, a file before the
//! window by its reference line. Files sent as binary data (images, PDFs, audio and video) are
//! not counted: providers measure them in pixels, pages or seconds, not bytes, and the ones that
//! read them report their usage; a request inlines the files of one message at most.

use crate::files::forms::{self, Form, Reads};
use crate::files::window::window_start;
use crate::vocab::{FileRef, InferRequest, Message, Part, Style};

/// Bytes of text a token is taken to cover: fewer than any tokenizer averages, so the estimate
/// errs on the large side.
pub const BYTES_PER_TOKEN: u64 = 3;

/// Tokens added for each message (its role, separators, the end-of-turn marker).
pub const MESSAGE_TOKENS: u64 = 8;

/// Tokens added for each tool call and each tool result (its id and the markup around it).
pub const CALL_TOKENS: u64 = 32;

/// Tokens added for each file (its part's framing; its text is counted as bytes).
pub const PART_TOKENS: u64 = 4;

/// Tokens added for each tool definition beyond its text (the function framing).
pub const TOOL_TOKENS: u64 = 8;

/// How a request's files travel, for counting them: the endpoint's style and what it reads.
/// `None` (not resolved) counts every file that is not text as a note.
pub type Wire = Option<(Style, Reads)>;

/// The estimated size of `req` in tokens.
pub fn tokens(req: &InferRequest, wire: Wire) -> u64 {
    let mut bytes = req.system.as_ref().map_or(0, |s| s.len() as u64);
    let mut framing = 0;
    for tool in &req.tools {
        bytes += (tool.name.len() + tool.description.len()) as u64;
        bytes += json_len(&tool.parameters);
        framing += TOOL_TOKENS;
    }
    let from = window_start(req);
    for (i, m) in req.messages.iter().enumerate() {
        let (b, f) = message(m, i >= from, wire);
        bytes += b;
        framing += f;
    }
    bytes.div_ceil(BYTES_PER_TOKEN) + framing
}

/// The length of `value` as compact JSON, counted as it is written (every step estimates its
/// request: no string is built for it).
fn json_len(value: &serde_json::Value) -> u64 {
    struct Count(u64);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer(&mut count, value).map_or(0, |()| count.0)
}

/// The text bytes of one message and its framing tokens; `inlined`: its files travel inlined.
fn message(m: &Message, inlined: bool, wire: Wire) -> (u64, u64) {
    let mut bytes = 0;
    let mut framing = MESSAGE_TOKENS;
    for part in &m.parts {
        match part {
            Part::Text { text, .. } | Part::Reasoning { text, .. } => bytes += text.len() as u64,
            Part::ToolCall(c) => {
                bytes += (c.name.len() + c.arguments.len()) as u64;
                framing += CALL_TOKENS;
            }
            Part::ToolResult(r) => {
                bytes += (r.name.len() + r.content.len()) as u64;
                framing += CALL_TOKENS;
            }
            Part::File(f) => {
                bytes += file(f, inlined, wire);
                framing += PART_TOKENS;
            }
        }
    }
    (bytes, framing)
}

/// The text bytes a file adds to the request (see the module's documentation).
fn file(f: &FileRef, inlined: bool, wire: Wire) -> u64 {
    if !inlined {
        return forms::reference_line(f).len() as u64;
    }
    if let Some(reason) = &f.shed {
        return forms::shed_note(f, reason).len() as u64;
    }
    let form = match wire {
        Some((style, reads)) => forms::form(style, reads, f),
        None if crate::files::kind_of(f) == crate::files::FileKind::Text => Form::Text,
        None => Form::Note,
    };
    match form {
        Form::Inline { .. } => 0,
        Form::Note => forms::note(f).len() as u64,
        Form::Text => match &f.data {
            Some(data) => forms::inline_text(f, data).len() as u64,
            None => forms::missing(f).len() as u64,
        },
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::vocab::{Role, ToolCall, ToolResult, ToolSpec};

    fn request(messages: Vec<Message>) -> InferRequest {
        InferRequest {
            model: "m".into(),
            messages,
            ..Default::default()
        }
    }

    #[test]
    fn text_counts_at_three_bytes_a_token_plus_framing() {
        let mut req = request(vec![Message::user("x".repeat(300))]);
        assert_eq!(tokens(&req, None), 100 + MESSAGE_TOKENS);
        req.system = Some("y".repeat(30));
        req.tools.push(ToolSpec {
            name: "t".into(),
            description: "d".into(),
            parameters: serde_json::json!({}),
        });
        // 300 + 30 + 1 + 1 + 2 ("{}") bytes.
        assert_eq!(
            tokens(&req, None),
            334u64.div_ceil(3) + MESSAGE_TOKENS + TOOL_TOKENS
        );
    }

    #[test]
    fn calls_and_results_count_their_text() {
        let req = request(vec![
            Message::new(
                Role::Assistant,
                vec![Part::ToolCall(ToolCall {
                    id: "c1".into(),
                    name: "note".into(),
                    arguments: "{\"text\":\"hi\"}".into(),
                    opaque: None,
                })],
            ),
            Message::new(
                Role::Tool,
                vec![Part::ToolResult(ToolResult {
                    call_id: "c1".into(),
                    name: "note".into(),
                    content: "z".repeat(600),
                    is_error: false,
                })],
            ),
        ]);
        let bytes = 4 + 13 + 4 + 600;
        assert_eq!(
            tokens(&req, None),
            (bytes as u64).div_ceil(3) + 2 * (MESSAGE_TOKENS + CALL_TOKENS)
        );
    }

    #[test]
    fn files_count_by_what_the_request_inlines() {
        let csv = crate::files::record("big.csv", None, Arc::from(vec![b'1'; 90_000]));
        let png =
            crate::files::record("chart.png", Some("image/png"), Arc::from(vec![0u8; 90_000]));
        let with = |f: &FileRef| Message::new(Role::User, vec![Part::File(f.clone())]);
        let anthropic = Some((Style::Anthropic, Reads::default()));
        let openai = Some((Style::Openai, Reads::default()));
        // Inside the window: the text file by its inlined text, capped; the image not at all on
        // Anthropic (binary data), by its note on OpenAI chat.
        let req = request(vec![with(&csv)]);
        let inlined = forms::inline_text(&csv, csv.data.as_ref().unwrap()).len() as u64;
        assert!(inlined < 90_000, "capped at TEXT_CAP code points");
        assert_eq!(
            tokens(&req, anthropic),
            inlined.div_ceil(3) + MESSAGE_TOKENS + PART_TOKENS
        );
        let req = request(vec![with(&png)]);
        assert_eq!(tokens(&req, anthropic), MESSAGE_TOKENS + PART_TOKENS);
        assert_eq!(
            tokens(&req, openai),
            (forms::note(&png).len() as u64).div_ceil(3) + MESSAGE_TOKENS + PART_TOKENS
        );
        // Before the window: the reference line.
        let req = request(vec![with(&csv), Message::user("later"), with(&png)]);
        let line = forms::reference_line(&csv).len() as u64;
        assert_eq!(
            tokens(&req, anthropic),
            (line + 5).div_ceil(3) + 3 * MESSAGE_TOKENS + 2 * PART_TOKENS
        );
    }
}
