//! Client-side compaction: when the next request would pass `context_window * compact_at`,
//! ask the model for a summary and restart the transcript from it.
//!
//! The size is the larger of two counts: what the provider reported for the last step (input plus
//! output tokens) plus what has been appended since and not yet sent, at about 4 bytes a token;
//! and colony's own estimate of the whole request ([`super::estimate`]), so a server that reports
//! a small fixed count, or none, still compacts before the window. The new
//! transcript is one user message (a preamble, the summary, the user's latest request) followed by
//! the last tool round verbatim when it answers that request (a turn compacted between its
//! rounds: the assistant's calls and their results, never one without the other), with its
//! reasoning blocks dropped since their signatures vouch for a context that is gone. Files survive it: the latest request's ride on the new first message, every other
//! compacted file on a message before it (sent as reference lines `view_file` can follow).

use tracing::Instrument;

use super::TurnSpec;
use crate::core::Core;
use crate::infer::DynInfer;
use crate::providers::ProviderError;
use crate::vocab::{InferRequest, Message, Part, Role, ToolChoice, ToolResult, Usage};

pub const PREAMBLE: &str =
    "This session continues an earlier conversation that was compacted to save context.";

/// The transcript's size as the provider last reported it, and what has grown since.
#[derive(Debug, Default)]
pub struct Window {
    reported_tokens: Option<u64>,
    unsent_bytes: usize,
}

impl Window {
    pub fn reported(&mut self, usage: &Usage) {
        self.reported_tokens = Some(usage.input.saturating_add(usage.output));
        self.unsent_bytes = 0;
    }

    pub fn unsent(&mut self, results: &[ToolResult]) {
        self.unsent_bytes += results.iter().map(|r| r.content.len() + 32).sum::<usize>();
    }

    /// A window that starts from an earlier turn's last report (a resident's conversation goes
    /// on across turns), with `new_bytes` appended since.
    pub fn carried(reported: Option<u64>, new_bytes: usize) -> Window {
        Window {
            reported_tokens: reported,
            unsent_bytes: new_bytes,
        }
    }

    /// The size of the last request as reported, if any.
    pub fn reported_tokens(&self) -> Option<u64> {
        self.reported_tokens
    }

    /// Whether the next request would pass the threshold: the provider's count (once there is
    /// one) or `estimated` ([`super::estimate::tokens`] of the request), whichever is larger.
    pub fn would_overflow(&self, c: &super::Compaction, estimated: u64) -> bool {
        let reported = self
            .reported_tokens
            .map_or(0, |r| r + (self.unsent_bytes as u64).div_ceil(4));
        reported.max(estimated) as f64 > threshold(c)
    }
}

/// The size, in tokens, past which the transcript is compacted.
pub fn threshold(c: &super::Compaction) -> f64 {
    c.context_window as f64 * c.compact_at
}

/// Asks for a summary of the turn's transcript (the same system, tools and settings, the
/// compaction prompt after the last results, no tool calls allowed) and returns the compacted
/// transcript; `None` (said in the log) when the model answered no summary: nothing, or a tool
/// call though none was allowed (servers that ignore `tool_choice`). That was a parse error
/// that blocked a resident for good over a model's quirk; the turn goes on uncompacted, and a
/// transcript truly past the window is then refused by the provider, which says so.
pub async fn compact(
    core: &Core,
    stack: &dyn DynInfer,
    spec: &TurnSpec,
    turn: &InferRequest,
    usage: &mut Usage,
) -> Result<Option<Vec<Message>>, ProviderError> {
    let messages = &turn.messages;
    let mut req = turn.clone();
    req.messages
        .push(Message::user(spec.compaction.prompt.to_string()));
    req.tool_choice = ToolChoice::None;
    let ep = core.settle(&spec.ask.overrides, &mut req)?;
    let span = tracing::info_span!("compaction", messages = messages.len());
    let summary = stack.step_boxed(&req, &ep, None).instrument(span).await?;
    usage.add(&summary.usage);
    let text = summary.text();
    if text.trim().is_empty() {
        let calls: Vec<&str> = summary
            .message
            .tool_calls()
            .map(|c| c.name.as_str())
            .collect();
        let answered = match calls.as_slice() {
            [] => "nothing".to_string(),
            names => format!("a tool call ({}) though none was allowed", names.join(", ")),
        };
        tracing::warn!(
            "compaction: the model answered the summary request with {answered}: this turn \
             goes on with the whole transcript ({} messages)",
            messages.len()
        );
        return Ok(None);
    }
    Ok(Some(rebuild(messages, text.trim())))
}

/// What precedes the files a compaction kept from before its summary.
pub const EARLIER_FILES: &str = "[colony] Files attached earlier in this conversation:";

/// The compacted transcript: preamble, summary and latest request, then the last tool round.
pub fn rebuild(messages: &[Message], summary: &str) -> Vec<Message> {
    let latest = latest_request(messages);
    let mut text = format!("{PREAMBLE}\n\n{summary}");
    if let Some((_, latest)) = &latest {
        text.push_str(&format!("\n\nThe user's latest request: {latest}"));
    }
    let latest_at = latest.as_ref().map(|(at, _)| *at);
    // The last round is kept only when it answers the latest request (a turn compacted in the
    // middle of its tool rounds). One before it (a resident's new mail that compacts at its
    // turn's start) belongs to the summary: kept after the request, it was what the model
    // carried on from, and it answered the new mail with the old round's result.
    let (kept_from, round) = last_tool_round(messages)
        .filter(|(at, _)| latest_at.is_none_or(|latest| *at > latest))
        .unwrap_or((messages.len(), Vec::new()));
    let files_of = |m: &Message| m.files().cloned().map(Part::File).collect::<Vec<_>>();
    let earlier: Vec<Part> = messages[..kept_from]
        .iter()
        .enumerate()
        .filter(|(i, _)| Some(*i) != latest_at)
        .flat_map(|(_, m)| files_of(m))
        .collect();
    let mut out = Vec::new();
    if !earlier.is_empty() {
        let mut parts = vec![Part::text(EARLIER_FILES)];
        parts.extend(earlier);
        out.push(Message::new(Role::User, parts));
    }
    let mut first = Message::user(text);
    // The latest request's origin stays with it (a turn resumed after a restart reads it).
    if let Some(at) = latest_at {
        first.mail = messages[at].mail.clone();
    }
    if let Some(at) = latest_at.filter(|at| *at < kept_from) {
        first.parts.extend(files_of(&messages[at]));
    }
    out.push(first);
    out.extend(round);
    out
}

/// The newest user message that a person (not colony) wrote: where it is, and its text.
fn latest_request(messages: &[Message]) -> Option<(usize, String)> {
    messages
        .iter()
        .enumerate()
        .rev()
        .filter(|(_, m)| m.role == Role::User)
        .map(|(i, m)| (i, m.text()))
        .find(|(_, t)| {
            !t.trim().is_empty() && !t.starts_with("[colony]") && !t.starts_with(PREAMBLE)
        })
}

/// The newest assistant message with calls and the results that answer it, reasoning dropped,
/// and where the calls are.
fn last_tool_round(messages: &[Message]) -> Option<(usize, Vec<Message>)> {
    let at = messages
        .iter()
        .rposition(|m| m.role == Role::Assistant && m.tool_calls().next().is_some())?;
    let results = messages.get(at + 1).filter(|m| m.role == Role::Tool)?;
    let calls = Message::new(
        Role::Assistant,
        messages[at]
            .parts
            .iter()
            .filter(|p| !matches!(p, Part::Reasoning { .. }))
            .cloned()
            .collect(),
    );
    Some((at, vec![calls, results.clone()]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::turn::Compaction;
    use crate::vocab::ToolCall;

    fn call(id: &str) -> Part {
        Part::ToolCall(ToolCall {
            id: id.into(),
            name: "t".into(),
            arguments: "{}".into(),
            opaque: None,
        })
    }

    fn result(id: &str) -> Message {
        Message::new(
            Role::Tool,
            vec![Part::ToolResult(ToolResult {
                call_id: id.into(),
                name: "t".into(),
                content: "r".into(),
                is_error: false,
            })],
        )
    }

    #[test]
    fn rebuild_keeps_the_last_round_without_reasoning() {
        let messages = vec![
            Message::user("first question"),
            Message::new(Role::Assistant, vec![call("a")]),
            result("a"),
            Message::user("second question"),
            Message::new(
                Role::Assistant,
                vec![
                    Part::Reasoning {
                        text: "hm".into(),
                        opaque: None,
                    },
                    Part::text("checking"),
                    call("b"),
                ],
            ),
            result("b"),
        ];
        let out = rebuild(&messages, "SUMMARY");
        assert_eq!(out.len(), 3);
        assert_eq!(
            out[0].text(),
            format!("{PREAMBLE}\n\nSUMMARY\n\nThe user's latest request: second question")
        );
        assert_eq!(out[1].parts.len(), 2, "reasoning dropped");
        assert_eq!(out[1].tool_calls().next().unwrap().id, "b");
        assert_eq!(out[2], result("b"));
    }

    /// A resident's new mail that compacts its conversation at the turn's start: the last
    /// round was the previous turn's, and kept after the new request the model carried on from
    /// its result (answering the new mail with the old round's). It goes to the summary.
    #[test]
    fn a_round_before_the_latest_request_is_not_kept_after_it() {
        let messages = vec![
            Message::user("first question"),
            Message::new(Role::Assistant, vec![call("a")]),
            result("a"),
            Message::assistant("done with a"),
            Message {
                mail: Some(Box::new(crate::vocab::MailFrom {
                    source: "desk".into(),
                    hop: 2,
                })),
                ..Message::user("a new mail")
            },
        ];
        let out = rebuild(&messages, "SUMMARY");
        assert_eq!(out.len(), 1, "{out:?}");
        assert_eq!(
            out[0].text(),
            format!("{PREAMBLE}\n\nSUMMARY\n\nThe user's latest request: a new mail")
        );
        assert_eq!(out.last().unwrap().role, Role::User);
        // Where the latest request came from stays with it (a resumed turn reads it).
        assert_eq!(out[0].mail, messages[4].mail);
    }

    #[test]
    fn rebuild_keeps_every_file() {
        use std::sync::Arc;
        let file =
            |name: &str| Part::File(crate::files::record(name, None, Arc::from(name.as_bytes())));
        let messages = vec![
            Message::new(Role::User, vec![Part::text("first"), file("a.csv")]),
            Message::assistant("ok"),
            Message::new(Role::User, vec![Part::text("second"), file("b.csv")]),
            Message::new(Role::Assistant, vec![call("c")]),
            Message::new(
                Role::Tool,
                vec![result("c").parts[0].clone(), file("c.csv")],
            ),
        ];
        let out = rebuild(&messages, "SUMMARY");
        let names = |m: &Message| m.files().map(|f| f.name.clone()).collect::<Vec<_>>();
        assert_eq!(out.len(), 4);
        assert_eq!(out[0].text(), EARLIER_FILES);
        assert_eq!(names(&out[0]), ["a.csv"]);
        assert!(out[1].text().ends_with("The user's latest request: second"));
        assert_eq!(names(&out[1]), ["b.csv"]);
        assert_eq!(names(&out[3]), ["c.csv"], "the last round is kept whole");
    }

    #[test]
    fn the_window_counts_reported_and_unsent() {
        let c = Compaction {
            context_window: 1000,
            compact_at: 0.5,
            ..Compaction::default()
        };
        let mut w = Window::default();
        assert!(!w.would_overflow(&c, 0));
        w.reported(&Usage {
            input: 400,
            output: 50,
            ..Usage::default()
        });
        assert!(!w.would_overflow(&c, 0));
        w.unsent(&[ToolResult {
            call_id: "a".into(),
            name: "t".into(),
            content: "x".repeat(400),
            is_error: false,
        }]);
        assert!(w.would_overflow(&c, 0));
    }

    #[test]
    fn the_estimate_wins_over_a_small_report() {
        let c = Compaction {
            context_window: 1000,
            compact_at: 0.5,
            ..Compaction::default()
        };
        let mut w = Window::default();
        w.reported(&Usage {
            input: 11,
            ..Usage::default()
        });
        assert!(!w.would_overflow(&c, 500));
        assert!(w.would_overflow(&c, 501));
        // No report at all: the estimate alone.
        assert!(Window::default().would_overflow(&c, 501));
    }
}
