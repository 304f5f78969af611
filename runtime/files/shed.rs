//! Shedding: when a provider refuses a call because of an attachment (a 400, or a 413, whose
//! error names the file, its type, its size in bytes, or its kind when only one file of that
//! kind was sent), the call is retried once with that attachment shed: the reference stays in
//! the conversation, marked with why, and travels as a note saying it was removed. A resident
//! keeps the shed form; the message still holds a file, so the window does not move.
//!
//! Only files the request carried as attachments (inlined in the provider's own form, not as
//! text or a note) can be what a provider refused, and a name counts only as a whole word.

use super::forms::{self, Form, Reads};
use super::{FileKind, kind_of};
use crate::providers::ProviderError;
use crate::vocab::{FileRef, InferRequest, Part, Style};

/// How much of the provider's message the note keeps.
const REASON_CHARS: usize = 300;

/// The shortest file name matched on its own: shorter ones (`a`, `x.y`) are everywhere.
const MIN_NAME: usize = 4;

/// The attachments a refusal names, as (message, part) positions.
pub fn culprits(
    req: &InferRequest,
    err: &ProviderError,
    style: Style,
    reads: Reads,
) -> Vec<(usize, usize)> {
    let ProviderError::Api {
        status: 400 | 413,
        message,
        body,
    } = err
    else {
        return Vec::new();
    };
    let said = format!("{message}\n{body}").to_lowercase();
    let from = super::window::window_start(req);
    let mut sent: Vec<(usize, usize, &FileRef, String)> = Vec::new();
    for (m, message) in req.messages.iter().enumerate().skip(from) {
        // OpenAI-style tool messages carry text only: their files went as notes.
        if style == Style::Openai && message.role == crate::vocab::Role::Tool {
            continue;
        }
        for (p, part) in message.parts.iter().enumerate() {
            if let Part::File(f) = part
                && f.shed.is_none()
                && f.data.is_some()
                && let Form::Inline { media_type } = forms::form(style, reads, f)
            {
                sent.push((m, p, f, media_type));
            }
        }
    }
    let named = |f: &FileRef, wire: &str| {
        (f.name.chars().count() >= MIN_NAME && word_in(&said, &f.name.to_lowercase()))
            || said.contains(&f.content_type)
            || said.contains(wire)
            || said.contains(&format!("{} bytes", f.size))
    };
    let mut found: Vec<(usize, usize)> = sent
        .iter()
        .filter(|(_, _, f, wire)| named(f, wire))
        .map(|(m, p, _, _)| (*m, *p))
        .collect();
    if found.is_empty() {
        // "The PDF specified was not valid", "Unable to process input image": the kind named,
        // which says which file only when one file of that kind was sent.
        for kind in [
            FileKind::Image,
            FileKind::Pdf,
            FileKind::Audio,
            FileKind::Video,
        ] {
            let word = match kind {
                FileKind::Pdf => "pdf",
                other => other.as_str(),
            };
            let of_kind: Vec<(usize, usize)> = sent
                .iter()
                .filter(|(_, _, f, _)| kind_of(f) == kind)
                .map(|(m, p, _, _)| (*m, *p))
                .collect();
            if of_kind.len() == 1 && word_in(&said, word) {
                found.push(of_kind[0]);
            }
        }
    }
    found
}

/// Whether `word` occurs in `text` with no letter or digit right before or after it.
fn word_in(text: &str, word: &str) -> bool {
    !word.is_empty()
        && text.match_indices(word).any(|(at, _)| {
            let before = text[..at].chars().next_back();
            let after = text[at + word.len()..].chars().next();
            !before.is_some_and(char::is_alphanumeric) && !after.is_some_and(char::is_alphanumeric)
        })
}

/// Marks each named attachment as shed, with why.
pub fn shed(req: &mut InferRequest, at: &[(usize, usize)], err: &ProviderError) {
    let reason: String = err.to_string().chars().take(REASON_CHARS).collect();
    for &(m, p) in at {
        if let Some(Part::File(file)) = req.messages.get_mut(m).and_then(|msg| msg.parts.get_mut(p))
        {
            file.shed = Some(reason.trim().to_string());
        }
    }
}

/// Sheds what `err` names; whether anything was shed (and the call is worth one more try).
pub fn shed_named(req: &mut InferRequest, err: &ProviderError, style: Style, reads: Reads) -> bool {
    let at = culprits(req, err, style, reads);
    shed(req, &at, err);
    if !at.is_empty() {
        // Named: with several attachments, which one went is what the operator asks.
        let names: Vec<String> = at
            .iter()
            .filter_map(|&(m, p)| match req.messages.get(m)?.parts.get(p)? {
                Part::File(file) => Some(format!("{:?}", file.name)),
                _ => None,
            })
            .collect();
        tracing::warn!(
            "{} refused by the provider and shed (sent as a note from now on): {err}",
            names.join(", ")
        );
    }
    !at.is_empty()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::files::record;
    use crate::vocab::{Message, Role};

    fn api(status: u16, message: &str) -> ProviderError {
        ProviderError::Api {
            status,
            message: message.into(),
            body: String::new(),
        }
    }

    fn request() -> InferRequest {
        InferRequest {
            messages: vec![
                Message::new(
                    Role::User,
                    vec![Part::File(record(
                        "older.png",
                        None,
                        Arc::from(&b"\x89PNG\r\n\x1a\nold"[..]),
                    ))],
                ),
                Message::assistant("ok"),
                Message::new(
                    Role::User,
                    vec![
                        Part::text("look"),
                        Part::File(record(
                            "chart.png",
                            None,
                            Arc::from(&b"\x89PNG\r\n\x1a\n...."[..]),
                        )),
                        Part::File(record("notes.csv", None, Arc::from(&b"a,b\n"[..]))),
                    ],
                ),
            ],
            ..Default::default()
        }
    }

    fn culprits_of(message: &str) -> Vec<(usize, usize)> {
        culprits(
            &request(),
            &api(400, message),
            Style::Anthropic,
            Reads::default(),
        )
    }

    #[test]
    fn a_refusal_naming_the_file_sheds_it_only() {
        let mut req = request();
        let err = api(400, "Could not process image chart.png");
        assert!(shed_named(
            &mut req,
            &err,
            Style::Anthropic,
            Reads::default()
        ));
        let shed = req.messages[2].files().next().unwrap();
        assert_eq!(shed.name, "chart.png");
        assert!(
            shed.shed
                .as_deref()
                .unwrap()
                .contains("Could not process image chart.png")
        );
        assert_eq!(
            req.messages[2].files().filter(|f| f.shed.is_some()).count(),
            1
        );
        // The message still holds its files: the window stays where it was.
        assert_eq!(
            super::super::window::newest_with_files(&req.messages),
            Some(2)
        );
    }

    #[test]
    fn the_type_or_the_kind_names_it_too() {
        assert_eq!(culprits_of("unsupported MIME type image/png"), vec![(2, 1)]);
        assert_eq!(culprits_of("Unable to process input image"), vec![(2, 1)]);
    }

    #[test]
    fn only_attachments_of_the_window_and_whole_words_count() {
        // The CSV went as text: a provider cannot have refused it as an attachment.
        assert!(culprits_of("notes.csv is malformed").is_empty());
        // The older PNG went as a reference line.
        assert!(culprits_of("older.png is too large").is_empty());
        assert!(culprits_of("max_tokens: 8192 > 4096").is_empty());
        assert!(culprits_of("xchart.pngx").is_empty());
        assert!(
            culprits(
                &request(),
                &api(401, "chart.png"),
                Style::Anthropic,
                Reads::default()
            )
            .is_empty()
        );
        let outage = ProviderError::Provider {
            status: Some(500),
            message: "chart.png".into(),
            transient: true,
            retry_after: None,
        };
        assert!(culprits(&request(), &outage, Style::Anthropic, Reads::default()).is_empty());
        // OpenAI chat got only notes: nothing to shed.
        assert!(
            culprits(
                &request(),
                &api(400, "chart.png"),
                Style::Openai,
                Reads::default()
            )
            .is_empty()
        );
    }
}
