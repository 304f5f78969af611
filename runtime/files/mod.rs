//! Files a program attaches to what it sends a model (ARCHITECTURE.md, "Files").
//!
//! A file's content type is taken from the caller when given, else sniffed from its bytes
//! (`infer`), else guessed from its name (`mime_guess`); it is normalised (case and parameters
//! dropped, `image/jpg` read as `image/jpeg`) and mapped to a closed [`FileKind`]. A message holds
//! a [`FileRef`] (recorded once: name, type, size, hash; the bytes shared beside it).
//!
//! - [`forms`]: the per-provider table: which kinds and types each API takes, in which form.
//! - [`window`]: what one request carries: only the newest file-bearing message inlines its
//!   files; older ones become a reference line, so appending leaves earlier bytes identical.
//! - [`view`]: the `view_file` tool that re-reads an older file on demand.
//! - [`shed`]: a call refused because of an attachment is retried with a note in its place.
//! - [`library`]: the program's files by hash (for `ai.view_file` and histories from Lua).

pub mod forms;
pub mod library;
pub mod shed;
pub mod view;
pub mod window;

use std::path::Path;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub use library::Library;

use crate::vocab::FileRef;

/// The bytes of a file to attach, read only when something could send them: a folder, a device
/// or a pipe is refused (`/dev/zero` never ended), and so is a file larger than any API takes
/// ([`forms::LARGEST_FILE`]), before a byte is read (it was read whole: a 3 GB file took 6 GB of
/// memory on its way to becoming a note). The error's text ends a message naming the path.
pub fn read_to_attach(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read;
    let meta = attachable(path)?;
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    std::fs::File::open(path)?
        .take(forms::LARGEST_FILE + 1)
        .read_to_end(&mut bytes)?;
    // A file that grew as it was read.
    if bytes.len() as u64 > forms::LARGEST_FILE {
        return Err(std::io::Error::other(TooLarge(bytes.len() as u64)));
    }
    Ok(bytes)
}

/// What the file at `path` is, if it could be attached: not a folder, a device or a pipe, nor
/// larger than any API takes. Asked of the path alone (opening a pipe waits for a writer), so a
/// command can refuse a file before it starts, as [`read_to_attach`] would when it reads it.
pub fn attachable(path: &Path) -> std::io::Result<std::fs::Metadata> {
    let refuse = |why: String| Err(std::io::Error::other(why));
    let meta = std::fs::metadata(path)?;
    if meta.is_dir() {
        return refuse("a folder, not a file".into());
    }
    if !meta.is_file() {
        return refuse("not a regular file (a device or a pipe)".into());
    }
    if meta.len() > forms::LARGEST_FILE {
        return Err(std::io::Error::other(TooLarge(meta.len())));
    }
    Ok(meta)
}

/// A file larger than any API takes ([`forms::LARGEST_FILE`]): the error [`attachable`] and
/// [`read_to_attach`] carry, so each front end can say how to attach a part of it in its own
/// terms.
#[derive(Debug)]
pub struct TooLarge(pub u64);

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} is more than any model's API takes in one file ({}): attach a part of it",
            human_size(self.0),
            human_size(forms::LARGEST_FILE)
        )
    }
}

impl std::error::Error for TooLarge {}

impl TooLarge {
    /// The [`TooLarge`] an I/O error from [`attachable`] or [`read_to_attach`] carries, if any.
    pub fn of(e: &std::io::Error) -> Option<&TooLarge> {
        e.get_ref().and_then(|inner| inner.downcast_ref())
    }
}

/// The closed set of kinds a provider's rules are written against.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FileKind {
    Image,
    Pdf,
    Text,
    Audio,
    Video,
    Other,
}

impl FileKind {
    pub fn as_str(self) -> &'static str {
        match self {
            FileKind::Image => "image",
            FileKind::Pdf => "pdf",
            FileKind::Text => "text",
            FileKind::Audio => "audio",
            FileKind::Video => "video",
            FileKind::Other => "other",
        }
    }
}

/// A content type as colony compares it: lowercase, parameters dropped, surrounding spaces
/// trimmed, and the common misspelling `image/jpg` read as `image/jpeg`. Something that is not
/// `type/subtype` becomes `application/octet-stream`.
pub fn normalize(content_type: &str) -> String {
    let bare = content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase();
    let parsed: Option<mime::Mime> = bare.parse().ok();
    let Some(m) = parsed else {
        return mime::APPLICATION_OCTET_STREAM.to_string();
    };
    let essence = m.essence_str().to_string();
    match essence.as_str() {
        "image/jpg" | "image/pjpeg" => "image/jpeg".into(),
        "audio/x-wav" | "audio/wave" => "audio/wav".into(),
        _ => essence,
    }
}

/// Whether `declared` reads as a content type (`type/subtype`, parameters allowed). A caller's
/// declared type must: anything else ([`normalize`] makes it `application/octet-stream`) would
/// send an image declared `"png"` as an unknown blob without a word.
pub fn is_content_type(declared: &str) -> bool {
    let bare = declared.split(';').next().unwrap_or("").trim();
    bare.parse::<mime::Mime>().is_ok()
}

/// The kind of a content type (normalised first).
pub fn classify(content_type: &str) -> FileKind {
    let ct = normalize(content_type);
    let (top, sub) = ct.split_once('/').unwrap_or((ct.as_str(), ""));
    match (top, sub) {
        ("application", "pdf") => FileKind::Pdf,
        // XML, whatever the family says: no API reads it as a picture.
        ("image", "svg+xml") => FileKind::Text,
        ("image", _) => FileKind::Image,
        ("audio", _) => FileKind::Audio,
        ("video", _) => FileKind::Video,
        ("text", _) => FileKind::Text,
        ("application", s)
            if matches!(
                s,
                "json"
                    | "xml"
                    | "csv"
                    | "yaml"
                    | "x-yaml"
                    | "toml"
                    | "javascript"
                    | "x-sh"
                    | "sql"
                    | "graphql"
                    | "ld+json"
                    | "x-ndjson"
                    | "jsonl"
            ) || s.ends_with("+json")
                || s.ends_with("+xml") =>
        {
            FileKind::Text
        }
        _ => FileKind::Other,
    }
}

/// The content type of a file: `declared` if the caller gave one, else what its bytes say, else
/// what its name says, else `application/octet-stream` (or `text/plain` for valid UTF-8 without
/// a NUL byte).
pub fn content_type_of(declared: Option<&str>, name: &str, bytes: &[u8]) -> String {
    if let Some(ct) = declared.filter(|c| !c.trim().is_empty()) {
        return normalize(ct);
    }
    if let Some(t) = ::infer::get(bytes) {
        return normalize(t.mime_type());
    }
    if let Some(guess) = mime_guess::from_path(Path::new(name)).first_raw() {
        let guess = normalize(guess);
        // A name is only a claim: bytes with NULs in them (and no UTF-16 mark) are not text
        // whatever they are called, and inlined they were pages of replacement characters.
        let kind = classify(&guess);
        if kind == FileKind::Text && looks_binary(bytes) {
            return mime::APPLICATION_OCTET_STREAM.to_string();
        }
        // Nor is a name the last word the other way: source code whose extension names a type
        // no API reads (.ts as MPEG video, .sql, .java, .php, .tex) went as a note, "content
        // absent". Plain text under such a name is text.
        if matches!(kind, FileKind::Other | FileKind::Video | FileKind::Audio)
            && !bytes.is_empty()
            && !bytes.contains(&0)
            && std::str::from_utf8(bytes).is_ok()
        {
            return "text/plain".into();
        }
        return guess;
    }
    if (!bytes.contains(&0) && std::str::from_utf8(bytes).is_ok()) || utf16_order(bytes).is_some() {
        return "text/plain".into();
    }
    mime::APPLICATION_OCTET_STREAM.to_string()
}

/// Whether `bytes` hold a NUL in their first 8,000 (git's test for a binary file), not counting
/// text in UTF-16 with its byte-order mark, where NULs are every other byte of ASCII.
fn looks_binary(bytes: &[u8]) -> bool {
    let head = &bytes[..bytes.len().min(8000)];
    head.contains(&0) && utf16_order(bytes).is_none()
}

/// Whether `bytes` start with a UTF-16 byte-order mark: `Some(true)` little-endian.
fn utf16_order(bytes: &[u8]) -> Option<bool> {
    match bytes {
        [0xFF, 0xFE, ..] => Some(true),
        [0xFE, 0xFF, ..] => Some(false),
        _ => None,
    }
}

/// A text file's bytes as text: UTF-16 when it starts with that byte-order mark (Windows
/// editors write it), else UTF-8 (a UTF-8 mark dropped); anything undecodable becomes U+FFFD.
pub fn text_of(bytes: &[u8]) -> std::borrow::Cow<'_, str> {
    if let Some(little) = utf16_order(bytes) {
        let units = bytes[2..].chunks_exact(2).map(|pair| {
            let pair = [pair[0], pair[1]];
            if little {
                u16::from_le_bytes(pair)
            } else {
                u16::from_be_bytes(pair)
            }
        });
        return char::decode_utf16(units)
            .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
            .collect::<String>()
            .into();
    }
    String::from_utf8_lossy(bytes.strip_prefix(b"\xEF\xBB\xBF").unwrap_or(bytes))
}

/// Records `bytes` under `name`, with the caller's content type if any: the reference a message
/// holds, with the bytes beside it.
pub fn record(name: &str, declared: Option<&str>, bytes: Arc<[u8]>) -> FileRef {
    FileRef {
        name: name.to_string(),
        content_type: content_type_of(declared, name, &bytes),
        size: bytes.len() as u64,
        sha256: sha256_hex(&bytes),
        data: Some(bytes),
        shed: None,
    }
}

pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The kind of a recorded file.
pub fn kind_of(file: &FileRef) -> FileKind {
    classify(&file.content_type)
}

/// A size as people read it: `812 B`, `12.4 KB`, `3.1 MB`.
pub fn human_size(size: u64) -> String {
    match size {
        s if s < 1000 => format!("{s} B"),
        s if s < 1_000_000 => format!("{:.1} KB", s as f64 / 1e3),
        s if s < 1_000_000_000 => format!("{:.1} MB", s as f64 / 1e6),
        s => format!("{:.1} GB", s as f64 / 1e9),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Source code whose extension names a type no API reads is text when its bytes are: it
    /// went as a note, "content absent" (.ts as MPEG video, .sql, .java, .php, .tex); an SVG is
    /// XML. Bytes that are not text keep the name's type, and an empty file too.
    #[test]
    fn plain_text_under_a_name_no_api_reads_is_text() {
        for name in [
            "add.ts",
            "q.sql",
            "Main.java",
            "index.php",
            "paper.tex",
            "notes.dat",
        ] {
            assert_eq!(
                content_type_of(None, name, b"export const x = 1;\n"),
                "text/plain",
                "{name}"
            );
        }
        assert_eq!(classify("image/svg+xml"), FileKind::Text);
        assert_eq!(
            content_type_of(None, "clip.ts", b"\x47\x00\x11\x10\xff\x00"),
            "video/vnd.dlna.mpeg-tts"
        );
        assert_eq!(content_type_of(None, "q.sql", b""), "application/x-sql");
    }

    #[test]
    fn a_text_name_on_binary_bytes_is_not_text_and_utf16_is_read_as_text() {
        let utf16 = |little: bool, text: &str| -> Vec<u8> {
            let mut out = if little {
                vec![0xFF, 0xFE]
            } else {
                vec![0xFE, 0xFF]
            };
            for u in text.encode_utf16() {
                out.extend(if little {
                    u.to_le_bytes()
                } else {
                    u.to_be_bytes()
                });
            }
            out
        };
        // Bytes with NULs called .txt: not text, so a note rather than replacement characters.
        let binary = [0x00, 0x9c, 0x01, 0xff, 0x00, 0x42];
        assert_eq!(
            content_type_of(None, "dump.txt", &binary),
            "application/octet-stream"
        );
        // Declared by the caller, the type stands.
        assert_eq!(
            content_type_of(Some("text/plain"), "dump.txt", &binary),
            "text/plain"
        );
        for little in [true, false] {
            let bytes = utf16(little, "caf\u{e9} \u{1F600}");
            assert_eq!(content_type_of(None, "notes.txt", &bytes), "text/plain");
            assert_eq!(content_type_of(None, "notes", &bytes), "text/plain");
            assert_eq!(text_of(&bytes), "caf\u{e9} \u{1F600}");
        }
        assert_eq!(text_of(b"\xEF\xBB\xBFplain"), "plain");
        assert_eq!(text_of(b"caf\xe9"), "caf\u{FFFD}");
        assert_eq!(content_type_of(None, "a.csv", b"a,b\n1,2\n"), "text/csv");
    }

    #[test]
    fn content_types_are_normalised() {
        assert_eq!(normalize("IMAGE/JPG; q=1"), "image/jpeg");
        assert_eq!(normalize(" Text/Plain; charset=UTF-8 "), "text/plain");
        assert_eq!(normalize("application/pdf"), "application/pdf");
        assert_eq!(normalize("nonsense"), "application/octet-stream");
        assert_eq!(normalize(""), "application/octet-stream");
    }

    #[test]
    fn kinds_are_closed() {
        let cases = [
            ("image/png", FileKind::Image),
            ("IMAGE/JPG; q=1", FileKind::Image),
            ("application/pdf", FileKind::Pdf),
            ("text/csv", FileKind::Text),
            ("text/markdown", FileKind::Text),
            ("application/json", FileKind::Text),
            ("application/xml", FileKind::Text),
            ("application/vnd.api+json", FileKind::Text),
            ("audio/wav", FileKind::Audio),
            ("audio/x-wav", FileKind::Audio),
            ("video/mp4", FileKind::Video),
            ("application/zip", FileKind::Other),
            ("application/octet-stream", FileKind::Other),
            ("garbage", FileKind::Other),
        ];
        for (ct, kind) in cases {
            assert_eq!(classify(ct), kind, "{ct}");
        }
    }

    #[test]
    fn the_caller_then_the_bytes_then_the_name_decide() {
        let png = [
            0x89, b'P', b'N', b'G', 0x0d, 0x0a, 0x1a, 0x0a, 0, 0, 0, 0x0d,
        ];
        let pdf = b"%PDF-1.4\n%...";
        let gif = b"GIF89a\x01\x00\x01\x00";
        let wav = b"RIFF\x24\x00\x00\x00WAVEfmt ";
        assert_eq!(
            content_type_of(Some("image/jpg"), "x.png", &png),
            "image/jpeg"
        );
        assert_eq!(content_type_of(None, "photo.jpg", &png), "image/png");
        assert_eq!(content_type_of(None, "doc", pdf), "application/pdf");
        assert_eq!(content_type_of(None, "a", gif), "image/gif");
        assert_eq!(classify(&content_type_of(None, "a", wav)), FileKind::Audio);
        assert_eq!(content_type_of(None, "n.csv", b"a,b\n1,2\n"), "text/csv");
        assert_eq!(
            content_type_of(None, "notes", "héllo ✓".as_bytes()),
            "text/plain"
        );
        assert_eq!(
            content_type_of(None, "blob", &[0, 159, 146, 150, 0, 1]),
            "application/octet-stream"
        );
    }

    #[test]
    fn a_record_has_size_and_hash() {
        let r = record("n.csv", None, Arc::from(&b"a,b\n"[..]));
        assert_eq!(r.size, 4);
        assert_eq!(r.sha256.len(), 64);
        assert_eq!(r.handle().len(), 12);
        assert_eq!(kind_of(&r), FileKind::Text);
    }
}
