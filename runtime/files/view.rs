//! `view_file`: the tool a turn offers when its conversation holds files older than the newest
//! file-bearing message (those travel as a reference line). It answers with the file attached
//! to its result, which makes that result the newest file-bearing message, so the file is
//! inlined in the next request in the provider's form.

use serde_json::json;

use super::library::{LookupError, find_in};
use crate::turn::{Handler, ToolDef};
use crate::vocab::{FileRef, Message, Part};

pub const NAME: &str = "view_file";

/// The tool's definition (its handler is the turn's own: it reads the conversation's files).
pub fn tool() -> ToolDef {
    let mut def = ToolDef::new(
        NAME,
        "Read again a file attached earlier in this conversation. Give the ref its reference \
         line shows.",
        json!({
            "type": "object",
            "properties": {
                "ref": {"type": "string", "description": "the file's ref, as its line shows it"}
            },
            "required": ["ref"]
        }),
        None,
        Handler::ViewFile,
    )
    .expect("view_file's schema is valid");
    def.idempotent = true;
    def
}

/// The files a conversation holds, newest first.
pub fn files_of(messages: &[Message]) -> Vec<FileRef> {
    messages
        .iter()
        .rev()
        .flat_map(|m| m.parts.iter())
        .filter_map(|p| match p {
            Part::File(f) => Some(f.clone()),
            _ => None,
        })
        .collect()
}

/// The answer to `view_file{ ref }`: a line naming the file, and the file itself.
pub fn answer(handle: &str, files: &[FileRef]) -> Result<(String, FileRef), LookupError> {
    let file = find_in(handle, files.iter().cloned())?;
    Ok((
        format!("The file {} again, attached below.", file.name),
        file,
    ))
}
