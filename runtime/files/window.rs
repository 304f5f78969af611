//! What one request carries of a conversation's files.
//!
//! Every step re-sends the whole conversation, so only the newest file-bearing message inlines
//! its files (in the form [`super::forms`] gives for the provider); older ones become a
//! [`reference_line`](super::forms::reference_line) that `view_file` can follow. A turn fixes
//! where its window starts ([`InferRequest::files_from`], see [`turn_window`]): files its steps
//! append (a tool's result, `view_file`'s answer) are inlined where they are and nothing before
//! them changes, so appending a call or a result leaves every earlier byte of the request
//! identical. Rendering a message depends only on the message, the provider and which side of
//! the window it is on.
//!
//! The conversation itself keeps its references: this renders a copy for the wire, and only
//! when the request holds a file at all.

use std::borrow::Cow;

use super::forms::{self, Form, Reads};
use crate::vocab::{FileRef, InferRequest, Message, Part, Role, Style};

/// The newest message holding a file.
pub fn newest_with_files(messages: &[Message]) -> Option<usize> {
    messages.iter().rposition(has_files)
}

fn has_files(m: &Message) -> bool {
    m.parts.iter().any(|p| matches!(p, Part::File(_)))
}

/// Where a turn's window starts, fixed for the whole turn: the first file-bearing message of
/// the turn's new input (the trailing user messages: a prompt, or a resident's batch of mail),
/// else the newest file-bearing message before it, else the end (only what the turn appends).
pub fn turn_window(messages: &[Message]) -> usize {
    let input = messages
        .iter()
        .rposition(|m| m.role != Role::User)
        .map_or(0, |i| i + 1);
    if let Some(first) = messages[input..].iter().position(has_files) {
        return input + first;
    }
    newest_with_files(messages).unwrap_or(messages.len())
}

/// The first message whose files are inlined in `req`.
pub fn window_start(req: &InferRequest) -> usize {
    req.files_from
        .or_else(|| newest_with_files(&req.messages))
        .unwrap_or(req.messages.len())
}

/// Whether a file of `req` sits before its window (a reference line): `view_file` is worth
/// offering. The window starts at the end only when no message holds a file (it starts at the
/// newest one otherwise), so a conversation without files is not walked a second time.
pub fn has_older_files(req: &InferRequest) -> bool {
    let from = window_start(req);
    from < req.messages.len() && req.messages[..from].iter().any(has_files)
}

/// The request as `style`'s wire should see it: borrowed unchanged when it holds no file.
pub fn render(req: &InferRequest, style: Style, reads: Reads) -> Cow<'_, InferRequest> {
    if newest_with_files(&req.messages).is_none() {
        return Cow::Borrowed(req);
    }
    let from = window_start(req);
    let mut out = req.clone();
    // Bytes inlined so far, newest first: when the request's budget runs out, the newest
    // files are the ones that still travel.
    let mut inlined = 0u64;
    for (i, message) in out.messages.iter_mut().enumerate().rev() {
        if has_files(message) {
            render_message(message, i >= from, style, reads, &mut inlined);
        }
    }
    Cow::Owned(out)
}

/// What one file becomes: still a file (to be inlined by the codec, under its wire media type),
/// or text.
enum Rendered {
    File(FileRef),
    Text(String),
}

fn render_file(
    file: &FileRef,
    inline: bool,
    in_results: bool,
    style: Style,
    reads: Reads,
    inlined: &mut u64,
) -> Rendered {
    if let Some(reason) = &file.shed {
        return Rendered::Text(forms::shed_note(file, reason));
    }
    if !inline {
        return Rendered::Text(forms::reference_line(file));
    }
    let Some(bytes) = file.data.as_deref() else {
        return Rendered::Text(forms::missing(file));
    };
    match forms::form(style, reads, file) {
        Form::Text => Rendered::Text(forms::inline_text(file, bytes)),
        Form::Note => noted(file, style, &forms::unreadable(file)),
        // OpenAI-style tool results are text only, whatever the model reads elsewhere.
        Form::Inline { .. } if in_results && style == Style::Openai => {
            noted(file, style, forms::TEXT_ONLY_RESULTS)
        }
        Form::Inline { media_type } => {
            let limits = forms::size_limits(style, super::kind_of(file));
            if file.size > limits.file {
                return too_large(file, style, limits.file, false);
            }
            if *inlined + file.size > limits.request {
                return too_large(file, style, limits.request, true);
            }
            *inlined += file.size;
            let mut wire = file.clone();
            wire.content_type = media_type;
            Rendered::File(wire)
        }
    }
}

/// The most files [`noted`] remembers having told of (about 100 bytes each).
const TOLD_AT_MOST: usize = 4096;

/// A file the model is told of instead of given (`why`), said once a process for each file and wire:
/// the person who attached it saw only the model's answer, which may not say why it did not
/// look (every step renders the window again, hence once). A service that runs for months sees
/// files without end: past [`TOLD_AT_MOST`] the set starts again, and a file may be told of twice.
fn noted(file: &FileRef, style: Style, why: &str) -> Rendered {
    if first_telling(file, style) {
        tracing::warn!(
            "{} ({}) is not sent: {why}, so the model is told its content is absent",
            file.name,
            file.content_type,
        );
    }
    Rendered::Text(forms::note_because(file, why))
}

/// A file too large for the API, told of as [`noted`] tells (it went without a word on
/// stderr, unlike a file of a type the API cannot read).
fn too_large(file: &FileRef, style: Style, limit: u64, per_request: bool) -> Rendered {
    if first_telling(file, style) {
        tracing::warn!(
            "{} ({}) is not sent: {}, so the model is told its content is absent",
            file.name,
            file.content_type,
            forms::too_large_why(limit, per_request)
        );
    }
    Rendered::Text(forms::too_large(file, limit, per_request))
}

/// The files (by content, name and wire) [`noted`] has told of.
static TOLD: std::sync::LazyLock<
    std::sync::Mutex<std::collections::HashSet<(String, String, Style)>>,
> = std::sync::LazyLock::new(Default::default);

/// Whether `file` sent as `style` is told of for the first time (remembered now). By its name
/// too: two files of the same bytes under two names (`a.wma`, `a.heic`) were told of as one.
fn first_telling(file: &FileRef, style: Style) -> bool {
    let mut told = TOLD.lock().unwrap_or_else(|e| e.into_inner());
    if told.len() >= TOLD_AT_MOST {
        told.clear();
    }
    told.insert((file.sha256.clone(), file.name.clone(), style))
}

/// Renders a message's files in place. Text a file becomes joins the text around it with a
/// blank line; in a message of tool results it joins the result it belongs to (the one before
/// it), so every style carries it in the result.
fn render_message(
    message: &mut Message,
    inline: bool,
    style: Style,
    reads: Reads,
    inlined: &mut u64,
) {
    let in_results = message.role == Role::Tool;
    let parts = std::mem::take(&mut message.parts);
    let mut out: Vec<Part> = Vec::with_capacity(parts.len());
    for part in parts {
        let Part::File(file) = part else {
            push_joined(&mut out, part);
            continue;
        };
        match render_file(&file, inline, in_results, style, reads, inlined) {
            Rendered::File(wire) => out.push(Part::File(wire)),
            Rendered::Text(text) => match out.last_mut() {
                Some(Part::ToolResult(result)) if in_results => {
                    result.content.push_str("\n\n");
                    result.content.push_str(&text);
                }
                _ => push_joined(&mut out, Part::text(text)),
            },
        }
    }
    message.parts = out;
}

/// Pushes `part`, separating text from any text before it in the message by a blank line
/// (styles that join a message's text parts would otherwise run them together).
fn push_joined(out: &mut Vec<Part>, part: Part) {
    let after_text = out.iter().any(|p| matches!(p, Part::Text { .. }));
    let part = match part {
        Part::Text { text, opaque } if after_text => Part::Text {
            text: format!("\n\n{text}"),
            opaque,
        },
        part => part,
    };
    out.push(part);
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::files::record;

    fn with_file(text: &str, name: &str, bytes: &[u8]) -> Message {
        Message::new(
            Role::User,
            vec![
                Part::text(text),
                Part::File(record(name, None, Arc::from(bytes))),
            ],
        )
    }

    #[test]
    fn only_the_newest_file_bearing_message_inlines() {
        let req = InferRequest {
            messages: vec![
                with_file("one", "a.csv", b"x,y\n1,2\n"),
                Message::assistant("ok"),
                with_file("two", "b.csv", b"p,q\n"),
                Message::assistant("ok"),
                Message::user("and?"),
            ],
            ..Default::default()
        };
        assert!(has_older_files(&req));
        let out = render(&req, Style::Anthropic, Reads::default());
        let first = out.messages[0].text();
        let second = out.messages[2].text();
        assert!(
            first.contains("ref ") && first.contains("attached earlier"),
            "{first}"
        );
        assert!(!first.contains("x,y"));
        assert!(second.contains("\np,q\n"), "{second}");
        assert_eq!(second.matches("\n\n[file b.csv").count(), 1, "{second}");
        assert_eq!(out.messages[4], req.messages[4]);
    }

    #[test]
    fn a_request_without_files_is_not_copied() {
        let req = InferRequest {
            messages: vec![Message::user("hi")],
            ..Default::default()
        };
        assert!(matches!(
            render(&req, Style::Openai, Reads::default()),
            Cow::Borrowed(_)
        ));
        assert!(!has_older_files(&req));
    }

    #[test]
    fn a_turn_window_starts_at_its_first_new_file() {
        let older = with_file("one", "a.csv", b"x");
        let a = Message::assistant("ok");
        let mut m = vec![older.clone(), a.clone(), Message::user("mail 1")];
        m.push(with_file("mail 2", "b.csv", b"y"));
        m.push(with_file("mail 3", "c.csv", b"z"));
        assert_eq!(turn_window(&m), 3, "both mails of the batch inline");
        assert_eq!(turn_window(&[older, a, Message::user("hi")]), 0);
        assert_eq!(turn_window(&[Message::user("hi")]), 1);
    }

    /// A file sent only as a note is warned of once, and what is remembered for that stays
    /// bounded however many files a long-running service sees.
    #[test]
    fn files_told_of_are_told_once_and_remembered_within_a_bound() {
        let file = |name: &str, sha256: String| FileRef {
            name: name.into(),
            content_type: "audio/x-ms-wma".into(),
            size: 1,
            sha256,
            data: None,
            shed: None,
        };
        let mine = file("a.wma", format!("{:064x}", 0x5eed_u64));
        assert!(first_telling(&mine, Style::Replay));
        assert!(!first_telling(&mine, Style::Replay), "once");
        assert!(first_telling(&mine, Style::Gemini), "once a wire");
        let same_bytes = file("a.heic", mine.sha256.clone());
        assert!(first_telling(&same_bytes, Style::Replay), "once a name");
        for i in 0..TOLD_AT_MOST + 10 {
            first_telling(&file("n", format!("{i:064x}")), Style::Replay);
        }
        let remembered = TOLD.lock().unwrap().len();
        assert!(remembered <= TOLD_AT_MOST, "{remembered}");
    }
}
