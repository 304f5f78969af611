//! The program's files by content hash: one copy of each file's bytes however many messages,
//! mails and conversations refer to it, and the lookup behind `ai.view_file(ref)` and behind a
//! Lua history that names a file only by its reference.

use std::sync::{Arc, Weak};

use dashmap::DashMap;

use crate::vocab::{FileRef, Message, Part};

/// The shortest reference `view_file` accepts: 8 hex digits of the hash.
pub const MIN_HANDLE: usize = 8;

/// Holds each file's bytes weakly: they live as long as a message, a mail or a conversation
/// refers to them, so a program that attaches files for months does not keep them all.
#[derive(Default)]
pub struct Library {
    by_hash: DashMap<String, Held>,
}

struct Held {
    /// The reference without its bytes.
    file: FileRef,
    bytes: Weak<[u8]>,
}

impl Held {
    fn get(&self) -> Option<FileRef> {
        let data = self.bytes.upgrade()?;
        Some(FileRef {
            data: Some(data),
            ..self.file.clone()
        })
    }
}

/// Why a reference does not name one file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LookupError {
    #[error("{0} is not a file reference (at least {MIN_HANDLE} hex digits of its hash)")]
    Malformed(String),
    #[error("no file has the reference {0}")]
    Unknown(String),
    #[error("the reference {0} names more than one file: give more of its digits")]
    Ambiguous(String),
}

impl Library {
    pub fn new() -> Library {
        Library::default()
    }

    /// Records `bytes` under `name` (see [`super::record`]); a file held already shares its
    /// bytes.
    pub fn record(&self, name: &str, declared: Option<&str>, bytes: Vec<u8>) -> FileRef {
        let mut file = super::record(name, declared, Arc::from(bytes));
        match self
            .by_hash
            .get(&file.sha256)
            .and_then(|h| h.bytes.upgrade())
        {
            Some(shared) => file.data = Some(shared),
            None => self.hold(&file),
        }
        file
    }

    fn hold(&self, file: &FileRef) {
        let Some(data) = &file.data else { return };
        // Entries whose bytes are gone cost a little each: sweep them as the map grows.
        if self.by_hash.len() >= 1024 && self.by_hash.len().is_power_of_two() {
            self.by_hash.retain(|_, h| h.bytes.strong_count() > 0);
        }
        self.by_hash.insert(
            file.sha256.clone(),
            Held {
                file: FileRef {
                    data: None,
                    ..file.clone()
                },
                bytes: Arc::downgrade(data),
            },
        );
    }

    /// Keeps a file that arrived with its bytes from elsewhere (a stored conversation).
    pub fn remember(&self, file: &FileRef) {
        let held = self
            .by_hash
            .get(&file.sha256)
            .is_some_and(|h| h.bytes.strong_count() > 0);
        if !held {
            self.hold(file);
        }
    }

    /// Remembers every file of `messages` that has its bytes.
    pub fn remember_all(&self, messages: &[Message]) {
        for m in messages {
            for p in &m.parts {
                if let Part::File(f) = p {
                    self.remember(f);
                }
            }
        }
    }

    /// The file a reference (a prefix of its hash, as [`FileRef::handle`] gives) names, while
    /// something of this program still holds it.
    pub fn find(&self, handle: &str) -> Result<FileRef, LookupError> {
        find_in(handle, self.by_hash.iter().filter_map(|e| e.value().get()))
    }
}

/// The one file among `files` whose hash starts with `handle`.
pub fn find_in(
    handle: &str,
    files: impl IntoIterator<Item = FileRef>,
) -> Result<FileRef, LookupError> {
    let handle = handle.trim().to_ascii_lowercase();
    if handle.len() < MIN_HANDLE || !handle.chars().all(|c| c.is_ascii_hexdigit()) {
        return Err(LookupError::Malformed(handle));
    }
    let mut found: Option<FileRef> = None;
    for file in files {
        if !file.sha256.starts_with(&handle) {
            continue;
        }
        match &found {
            Some(f) if f.sha256 != file.sha256 => return Err(LookupError::Ambiguous(handle)),
            Some(f) if f.data.is_some() => {}
            _ => found = Some(file),
        }
    }
    found.ok_or(LookupError::Unknown(handle))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_copy_per_content_and_lookup_by_prefix() {
        let lib = Library::new();
        let a = lib.record("a.txt", None, b"same".to_vec());
        let b = lib.record("b.txt", None, b"same".to_vec());
        assert!(Arc::ptr_eq(
            a.data.as_ref().unwrap(),
            b.data.as_ref().unwrap()
        ));
        assert_eq!(lib.find(a.handle()).unwrap().sha256, a.sha256);
        assert_eq!(lib.find("zz"), Err(LookupError::Malformed("zz".into())));
        assert!(matches!(lib.find("00000000"), Err(LookupError::Unknown(_))));
    }

    #[test]
    fn bytes_nobody_holds_are_let_go() {
        let lib = Library::new();
        let kept = lib.record("kept.txt", None, b"kept".to_vec());
        let gone = lib
            .record("gone.txt", None, b"gone".to_vec())
            .handle()
            .to_string();
        assert!(lib.find(kept.handle()).is_ok());
        assert!(matches!(lib.find(&gone), Err(LookupError::Unknown(_))));
    }
}
