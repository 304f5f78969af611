//! Shedding: when a provider refuses a call because of an attachment (a 400, or a 413, whose
//! error names the file, its type or its size), the call is retried once with that attachment
//! replaced by a note saying it was removed and why. The note replaces the file in the
//! conversation itself, so a resident keeps the shed form and never sends the file again.

use super::{FileKind, human_size, kind_of};
use crate::providers::ProviderError;
use crate::vocab::{FileRef, Message, Part};

/// How much of the provider's message the note keeps.
const REASON_CHARS: usize = 300;

/// The attachments a refusal names, as (message, part) positions: files of the newest
/// file-bearing message (the only ones whose content was sent). Empty when the error is not a
/// refusal of the request, or names none of them.
pub fn culprits(messages: &[Message], err: &ProviderError) -> Vec<(usize, usize)> {
    let ProviderError::Api {
        status: 400 | 413,
        message,
        body,
    } = err
    else {
        return Vec::new();
    };
    let Some(newest) = super::window::newest_with_files(messages) else {
        return Vec::new();
    };
    let said = format!("{message}\n{body}").to_lowercase();
    let files: Vec<(usize, &FileRef)> = messages[newest]
        .parts
        .iter()
        .enumerate()
        .filter_map(|(i, p)| match p {
            Part::File(f) => Some((i, f)),
            _ => None,
        })
        .collect();
    let named = |f: &FileRef| {
        let name = f.name.to_lowercase();
        (!name.is_empty() && said.contains(&name))
            || said.contains(&f.content_type)
            || (f.size >= 1000 && said.contains(&f.size.to_string()))
    };
    let mut found: Vec<(usize, usize)> = files
        .iter()
        .filter(|(_, f)| named(f))
        .map(|(i, _)| (newest, *i))
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
            let of_kind: Vec<usize> = files
                .iter()
                .filter(|(_, f)| kind_of(f) == kind)
                .map(|(i, _)| *i)
                .collect();
            if of_kind.len() == 1 && said.contains(word) {
                found.push((newest, of_kind[0]));
            }
        }
    }
    found
}

/// Replaces each named attachment with the note saying it was removed and why.
pub fn shed(messages: &mut [Message], at: &[(usize, usize)], err: &ProviderError) {
    let reason: String = err.to_string().chars().take(REASON_CHARS).collect();
    for &(m, p) in at {
        if let Some(Part::File(file)) = messages.get(m).and_then(|msg| msg.parts.get(p)) {
            let note = format!(
                "[file {} ({}, {}) was removed: the provider refused it ({})]",
                file.name,
                file.content_type,
                human_size(file.size),
                reason.trim()
            );
            messages[m].parts[p] = Part::text(note);
        }
    }
}

/// Sheds what `err` names from `messages`; whether anything was shed (and the call is worth
/// one more try).
pub fn shed_named(messages: &mut [Message], err: &ProviderError) -> bool {
    let at = culprits(messages, err);
    shed(messages, &at, err);
    if !at.is_empty() {
        tracing::warn!("a file was refused by the provider and shed: {err}");
    }
    !at.is_empty()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::files::record;
    use crate::vocab::Role;

    fn api(status: u16, message: &str) -> ProviderError {
        ProviderError::Api {
            status,
            message: message.into(),
            body: String::new(),
        }
    }

    fn conversation() -> Vec<Message> {
        vec![Message::new(
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
        )]
    }

    #[test]
    fn a_refusal_naming_the_file_sheds_it_only() {
        let mut m = conversation();
        let err = api(400, "Could not process image chart.png");
        assert_eq!(culprits(&m, &err), vec![(0, 1)]);
        assert!(shed_named(&mut m, &err));
        let text = m[0].text();
        assert!(
            text.contains("[file chart.png (image/png, 12 B) was removed"),
            "{text}"
        );
        assert_eq!(m[0].files().count(), 1);
    }

    #[test]
    fn the_type_or_the_kind_names_it_too() {
        let m = conversation();
        assert_eq!(
            culprits(&m, &api(400, "unsupported MIME type image/png")),
            vec![(0, 1)]
        );
        assert_eq!(
            culprits(&m, &api(400, "Unable to process input image")),
            vec![(0, 1)]
        );
    }

    #[test]
    fn other_refusals_shed_nothing() {
        let m = conversation();
        assert!(culprits(&m, &api(400, "max_tokens is too large")).is_empty());
        assert!(culprits(&m, &api(401, "chart.png")).is_empty());
        let outage = ProviderError::Provider {
            status: Some(500),
            message: "chart.png".into(),
            transient: true,
            retry_after: None,
        };
        assert!(culprits(&m, &outage).is_empty());
    }
}
