//! Files from Lua, through the binary, against the fake provider in each wire style: every
//! kind of small real file in exactly the form each API documents (or the honest note), the
//! text cap and its marker, content-type normalisation, the window (only the newest
//! file-bearing message inlines; `view_file` re-reads an older file; appending a call and its
//! result leaves every earlier byte of the request identical), and shedding a refused file.

mod support;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use support::fake::{FakeProvider, Reply};
use support::script::Sandbox;
use support::{STYLES, model_calls, styled};

/// A 1x1 PNG.
const PNG: &str = "89504e470d0a1a0a0000000d4948445200000001000000010806000000\
                   1f15c4890000000a49444154789c63000100000500010d0a2db40000000049454e44ae426082";
/// A 1x1 GIF.
const GIF: &str = "474946383961010001008000000000000000ffffff21f90401000000002c\
                   00000000010001000002024401003b";
/// The start of a JFIF JPEG (SOI, APP0) and its end (EOI).
const JPEG: &str = "ffd8ffe000104a46494600010100000100010000ffd9";

fn hex(s: &str) -> Vec<u8> {
    let s: String = s.chars().filter(|c| !c.is_whitespace()).collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

/// A WAV: a RIFF header, a 16-bit mono fmt chunk and eight samples.
fn wav() -> Vec<u8> {
    let samples = [0u8; 16];
    let mut w = b"RIFF".to_vec();
    w.extend((36 + samples.len() as u32).to_le_bytes());
    w.extend(b"WAVEfmt ");
    w.extend(16u32.to_le_bytes());
    w.extend(1u16.to_le_bytes()); // PCM
    w.extend(1u16.to_le_bytes()); // mono
    w.extend(8000u32.to_le_bytes());
    w.extend(16000u32.to_le_bytes());
    w.extend(2u16.to_le_bytes());
    w.extend(16u16.to_le_bytes());
    w.extend(b"data");
    w.extend((samples.len() as u32).to_le_bytes());
    w.extend(samples);
    w
}

const PDF: &[u8] = b"%PDF-1.4\n1 0 obj <</Type /Catalog /Pages 2 0 R>> endobj\n\
    2 0 obj <</Type /Pages /Kids [] /Count 0>> endobj\ntrailer <</Root 1 0 R>>\n%%EOF\n";
const CSV: &[u8] = b"city,temp\nParis,21\nOslo,12\n";
/// Past the 24,000 code point cap, in two-byte characters.
const LONG_CHARS: usize = 24_010;

/// Deterministic bytes no sniffer recognises.
fn blob() -> Vec<u8> {
    let mut x: u32 = 7;
    (0..64)
        .map(|i| {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            if i == 0 { 0 } else { (x >> 16) as u8 }
        })
        .collect()
}

fn handle(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<String>()[..12]
        .to_string()
}

/// Writes every test file into the sandbox.
fn write_files(sb: &Sandbox) {
    let files: Vec<(&str, Vec<u8>)> = vec![
        ("a.png", hex(PNG)),
        ("b.jpg", hex(JPEG)),
        ("c.gif", hex(GIF)),
        ("d.pdf", PDF.to_vec()),
        ("e.csv", CSV.to_vec()),
        ("long.txt", "ü".repeat(LONG_CHARS).into_bytes()),
        ("g.wav", wav()),
        ("blob.bin", blob()),
    ];
    for (name, bytes) in files {
        std::fs::write(sb.path(name), bytes).unwrap();
    }
}

/// A sandbox pointed at the fake in `style`, with that style as the `general` provider.
fn sandbox(fake: &FakeProvider, style: &str) -> Sandbox {
    let sb = styled(fake, style);
    sb.write(
        "config.toml",
        &format!("[use.general]\nprovider = \"{style}\"\nmodel = \"m\"\n"),
    );
    write_files(&sb);
    sb
}

const ALL_FILES: &str = r#"{ "a.png", "b.jpg", "c.gif", "d.pdf", "e.csv", "long.txt", "g.wav", "blob.bin",
  { path = "b.jpg", name = "declared", content_type = "IMAGE/JPG; q=1" } }"#;

fn b64(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

fn note(name: &str, ct: &str) -> String {
    format!("[file {name} ({ct}, ")
}

fn assert_note(text: &str, name: &str, ct: &str) {
    let head = note(name, ct);
    let at = text
        .find(&head)
        .unwrap_or_else(|| panic!("no note for {name} in {text}"));
    let line = text[at..].lines().next().unwrap();
    assert!(
        line.ends_with(&format!(
            "this model's API cannot read {ct} files, so its content is absent]"
        )),
        "{line}"
    );
}

/// The inlined CSV and the capped text, as every style carries them.
fn assert_texts(text: &str) {
    assert!(
        text.contains(
            "[file e.csv (text/csv, 27 B)]\ncity,temp\nParis,21\nOslo,12\n\n[end of file e.csv]"
        ),
        "{text}"
    );
    let long = text
        .find("[file long.txt (text/plain, ")
        .expect("the long text is inlined");
    let long = &text[long..];
    assert_eq!(
        long.matches('ü').count(),
        24_000,
        "capped at 24,000 code points"
    );
    assert!(long.contains(&format!(
        "\n[truncated: long.txt has {LONG_CHARS} characters; only the first 24000 are shown]\n[end of file long.txt]"
    )));
}

fn ask_all(style: &str) -> Value {
    let fake = FakeProvider::start();
    fake.push(Reply::text("seen"));
    let run = sandbox(&fake, style)
        .lua(
            &format!(
                r#"local r, err = ai.ask({{ {{ role = "user", content = "look", files = {ALL_FILES} }} }})
                   print(r or err.message)"#
            ),
            &[],
        )
        .ok();
    assert_eq!(run.stdout, "seen\n", "{style}: {}", run.stderr);
    model_calls(&fake).remove(0)
}

#[test]
fn anthropic_gets_image_and_document_blocks_and_notes() {
    let body = ask_all("anthropic");
    let blocks = body["messages"][0]["content"].as_array().unwrap().clone();
    let image = |ct: &str, bytes: &[u8]| json!({"type": "image", "source": {"type": "base64", "media_type": ct, "data": b64(bytes)}});
    assert_eq!(blocks[0], json!({"type": "text", "text": "look"}));
    assert_eq!(blocks[1], image("image/png", &hex(PNG)));
    assert_eq!(blocks[2], image("image/jpeg", &hex(JPEG)));
    assert_eq!(blocks[3], image("image/gif", &hex(GIF)));
    assert_eq!(
        blocks[4],
        json!({"type": "document", "title": "d.pdf",
               "source": {"type": "base64", "media_type": "application/pdf", "data": b64(PDF)}})
    );
    // The caller's `IMAGE/JPG; q=1`, normalised.
    assert_eq!(blocks.last().unwrap(), &image("image/jpeg", &hex(JPEG)));
    let text: String = blocks
        .iter()
        .filter_map(|b| b["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n");
    assert_texts(&text);
    assert_note(&text, "g.wav", "audio/wav");
    assert_note(&text, "blob.bin", "application/octet-stream");
    assert_eq!(blocks.len(), 10, "{blocks:#?}");
}

#[test]
fn gemini_gets_inline_data_for_what_it_documents() {
    let body = ask_all("gemini");
    let parts = body["contents"][0]["parts"].as_array().unwrap().clone();
    let inline =
        |ct: &str, bytes: &[u8]| json!({"inlineData": {"mimeType": ct, "data": b64(bytes)}});
    assert_eq!(parts[0], json!({"text": "look"}));
    assert_eq!(parts[1], inline("image/png", &hex(PNG)));
    assert_eq!(parts[2], inline("image/jpeg", &hex(JPEG)));
    assert!(parts.contains(&inline("application/pdf", PDF)));
    assert!(parts.contains(&inline("audio/wav", &wav())));
    assert_eq!(parts.last().unwrap(), &inline("image/jpeg", &hex(JPEG)));
    let text: String = parts
        .iter()
        .filter_map(|p| p["text"].as_str())
        .collect::<Vec<_>>()
        .join("\n");
    assert_texts(&text);
    // GIF is an image Gemini does not list.
    assert_note(&text, "c.gif", "image/gif");
    assert_note(&text, "blob.bin", "application/octet-stream");
    let inlined = parts
        .iter()
        .filter(|p| p.get("inlineData").is_some())
        .count();
    assert_eq!(inlined, 5, "{parts:#?}");
}

#[test]
fn openai_chat_gets_text_and_notes_only() {
    let body = ask_all("openai");
    let text = body["messages"][0]["content"]
        .as_str()
        .expect("text content")
        .to_string();
    assert!(text.starts_with("look\n\n[file a.png"), "{}", &text[..200]);
    assert_texts(&text);
    for (name, ct) in [
        ("a.png", "image/png"),
        ("b.jpg", "image/jpeg"),
        ("c.gif", "image/gif"),
        ("d.pdf", "application/pdf"),
        ("g.wav", "audio/wav"),
        ("blob.bin", "application/octet-stream"),
        ("declared", "image/jpeg"),
    ] {
        assert_note(&text, name, ct);
    }
    assert!(!text.contains(&b64(&hex(PNG))));
}

/// The messages (or contents) of a request, as the wire carries them.
fn conversation(body: &Value) -> &Value {
    body.get("contents").unwrap_or(&body["messages"])
}

/// The serialized conversation of `earlier` is a byte prefix of `later`'s, and everything else
/// in the body (system, tools, settings) is the same.
fn assert_prefix(style: &str, earlier: &Value, later: &Value) {
    let a = serde_json::to_string(conversation(earlier)).unwrap();
    let b = serde_json::to_string(conversation(later)).unwrap();
    let open = &a[..a.len() - 1];
    assert!(
        b.starts_with(open),
        "{style}: the earlier request is not a prefix:\n{a}\n{b}"
    );
    assert!(b.len() > a.len());
    let rest = |body: &Value| {
        let mut body = body.clone();
        let map = body.as_object_mut().unwrap();
        map.remove("messages");
        map.remove("contents");
        body
    };
    assert_eq!(rest(earlier), rest(later), "{style}");
}

#[test]
fn only_the_newest_file_bearing_message_inlines_and_view_file_reads_an_older_one() {
    for style in STYLES {
        let fake = FakeProvider::start();
        let csv = handle(CSV);
        fake.push(Reply::tool_call("e1", "echo", json!({"text": "hi"})));
        fake.push(Reply::tool_call("v1", "view_file", json!({"ref": csv})));
        fake.push(Reply::text("done"));
        let run = sandbox(&fake, style)
            .lua(
                r#"
local echo = ai.tool{ name = "echo", parameters = { text = "string" },
  handler = function(args) return args.text end }
local history = {
  { role = "user", content = "first", files = { "e.csv" } },
  { role = "assistant", content = "ok" },
  { role = "user", content = "second", files = { "d.pdf" } },
  { role = "assistant", content = "ok" },
}
local r = ai.take_turn{ messages = history, prompt = "third", files = { "a.png" }, tools = { echo } }
print(r.reply, r.stop)
for _, e in ipairs(r.tool_events) do print(e.name, e.kind, e.outcome) end
local last = r.messages[#r.messages - 1]
print(last.role, last.files and last.files[1].name, last.files and last.files[1].ref)
local f = ai.view_file(last.files[1].ref)
print(f.name, f.kind, f.content_type, #f.data, f.text == f.data)
print(ai.view_file("00000000"))
"#,
                &[],
            )
            .ok();
        let lines = run.lines();
        assert_eq!(lines[0], "done\tend_turn", "{style}: {}", run.stdout);
        assert_eq!(lines[1], "echo\tok\thi", "{style}");
        assert_eq!(
            lines[2], "view_file\tok\tThe file e.csv again, attached below.",
            "{style}"
        );
        assert_eq!(lines[3], format!("tool\te.csv\t{csv}"), "{style}");
        assert_eq!(lines[4], "e.csv\ttext\ttext/csv\t27\ttrue", "{style}");
        assert_eq!(
            lines[5], "nil\tno file has the reference 00000000",
            "{style}"
        );

        let calls = model_calls(&fake);
        assert_eq!(calls.len(), 3, "{style}");
        let first = serde_json::to_string(conversation(&calls[0])).unwrap();
        // The two older files travel as reference lines; the newest (the PNG) is inlined
        // where the style reads images, and the CSV's content is absent.
        assert!(
            first.contains(&format!(
                "[file e.csv (text/csv, 27 B), ref {csv}: attached earlier"
            )),
            "{style}: {first}"
        );
        assert!(
            first.contains(&format!(
                "[file d.pdf (application/pdf, {} B), ref {}",
                PDF.len(),
                handle(PDF)
            )),
            "{style}"
        );
        assert!(!first.contains("Paris,21"), "{style}");
        assert!(!first.contains(&b64(PDF)), "{style}");
        if style != "openai" {
            assert!(first.contains(&b64(&hex(PNG))), "{style}");
        }
        let tools = serde_json::to_string(&calls[0]["tools"]).unwrap();
        assert!(
            tools.contains("view_file"),
            "{style}: view_file offered: {tools}"
        );
        // A call and its result appended: every earlier byte is the same.
        assert_prefix(style, &calls[0], &calls[1]);
        // view_file's result carries the CSV, inlined in the result, and nothing before it
        // changes (the PNG stays inlined for the rest of the turn).
        assert_prefix(style, &calls[1], &calls[2]);
        let third = serde_json::to_string(conversation(&calls[2])).unwrap();
        assert!(third.contains("Paris,21"), "{style}: {third}");
        if style != "openai" {
            assert!(third.contains(&b64(&hex(PNG))), "{style}");
        }
    }
}

#[test]
fn a_refused_attachment_is_shed_and_the_call_retried_once() {
    for style in STYLES {
        let fake = FakeProvider::start();
        let message =
            "messages.0.content.1.image.source.base64.data: image a.png could not be decoded";
        let body = match style {
            "anthropic" => {
                json!({"type": "error", "error": {"type": "invalid_request_error", "message": message}})
            }
            "openai" => json!({"error": {"message": message, "type": "invalid_request_error"}}),
            _ => json!({"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}}),
        };
        fake.push(Reply::status(400).body(body.to_string()));
        fake.push(Reply::text("read the CSV"));
        let sb = sandbox(&fake, style);
        // OpenAI chat sends images as a note unless the model reads them: opt in, so there is
        // an attachment to refuse.
        sb.write(
            "config.toml",
            &format!("[use.general]\nprovider = \"{style}\"\nmodel = \"m\"\nimages = true\n"),
        );
        let run = sb
            .lua(
                r#"local r, err = ai.ask({ { role = "user", content = "look", files = { "a.png", "e.csv" } } })
                   print(r or err.message)"#,
                &[],
            )
            .ok();
        assert_eq!(run.stdout, "read the CSV\n", "{style}: {}", run.stderr);
        let calls = model_calls(&fake);
        assert_eq!(calls.len(), 2, "{style}: retried once");
        let retried = serde_json::to_string(conversation(&calls[1])).unwrap();
        assert!(!retried.contains(&b64(&hex(PNG))), "{style}");
        assert!(
            retried.contains("[file a.png (image/png, 67 B) was removed: the provider refused it (API error 400: "),
            "{style}: {retried}"
        );
        assert!(retried.contains("Paris,21"), "{style}: the CSV stays");
        // The log names which file went (with several, it did not say).
        assert!(
            run.stderr
                .contains("\"a.png\" refused by the provider and shed"),
            "{style}: {}",
            run.stderr
        );
    }
}

#[test]
fn a_refusal_that_names_no_file_is_not_retried() {
    let fake = FakeProvider::start();
    fake.push(Reply::status(400));
    fake.push(Reply::text("never"));
    let run = sandbox(&fake, "anthropic")
        .lua(
            r#"local r, err = ai.ask({ { role = "user", content = "look", files = { "e.csv" } } })
               print(r, err and err.kind)"#,
            &[],
        )
        .ok();
    assert_eq!(run.stdout, "nil\tapi_error\n");
    assert_eq!(model_calls(&fake).len(), 1);
}

#[test]
fn a_resident_keeps_the_shed_form_and_its_files_across_a_restart() {
    let fake = FakeProvider::start();
    fake.push(
        Reply::status(400).body(
            json!({"type": "error", "error": {"type": "invalid_request_error",
               "message": "Could not process image"}})
            .to_string(),
        ),
    );
    fake.push(Reply::text("reviewed"));
    fake.push(Reply::text("still have the CSV"));
    let sb = sandbox(&fake, "anthropic");
    let state = sb.path("state-dir").display().to_string();
    let script = sb
        .write(
            "review.lua",
            r#"
local word = ...
ai.spawn{ name = "reviewer", persist_conversation = true,
  deliver_to = function(reply, info)
    if info.kind == "reply" then print(reply) ; ai.stop("done") end
  end,
  sources = { function(self)
    if word == "first" then
      assert(ai.mail{ to = self, source = "t", content = "review", hop = 0, files = { "a.png", "e.csv" } })
    else
      assert(ai.mail{ to = self, source = "t", content = "again?", hop = 0 })
    end
  end } }
ai.watch{}
"#,
        )
        .display()
        .to_string();
    let run = sb
        .colony(&["run", "--state", &state, &script, "first"])
        .ok();
    assert_eq!(run.stdout, "reviewed\n", "{}", run.stderr);
    // The file is gone from the sources' folder: the store has its bytes.
    std::fs::remove_file(sb.path("e.csv")).unwrap();
    let run = sb
        .colony(&["run", "--state", &state, &script, "second"])
        .ok();
    assert_eq!(run.stdout, "still have the CSV\n", "{}", run.stderr);
    let calls = model_calls(&fake);
    assert_eq!(calls.len(), 3);
    let after = serde_json::to_string(conversation(&calls[2])).unwrap();
    assert!(
        after.contains("[file a.png (image/png, 67 B) was removed"),
        "{after}"
    );
    assert!(!after.contains(&b64(&hex(PNG))));
    // The CSV's message is the newest file-bearing one: still inlined, from the store.
    assert!(after.contains("Paris,21"), "{after}");
    let shown = sb
        .colony(&[
            "conversations",
            &script,
            "--state",
            &state,
            "show",
            "reviewer",
        ])
        .ok();
    assert!(
        shown.stdout.contains("user attached e.csv (text/csv, 27 B"),
        "{}",
        shown.stdout
    );
    assert!(
        shown.stdout.contains("user attached a.png (image/png, 67 B, ref ebf4f635a17d): shed, the provider refused it (API error 400: Could not process image"),
        "{}",
        shown.stdout
    );
}

#[test]
fn what_no_api_could_take_is_refused_before_it_is_read() {
    // A file larger than any API takes was read whole (3 GB of it, to become a note), a folder
    // failed with the OS's words, and /dev/zero was read for ever.
    let fake = FakeProvider::start();
    let sb = sandbox(&fake, "gemini");
    let big = std::fs::File::create(sb.path("huge.log")).unwrap();
    big.set_len(3_000_000_000).unwrap(); // sparse: no disk used
    std::fs::create_dir(sb.path("notes")).unwrap();
    let at = sb.path("script.lua").display().to_string();
    let d = sb.dir.path().display().to_string();
    let run = sb
        .lua(
            r#"for _, p in ipairs{ "huge.log", "notes", "/dev/zero" } do
                 print(select(2, pcall(ai.ask, { { role = "user", content = "x", files = { p } } })))
               end"#,
            &[],
        )
        .ok();
    let refused = |path: &str, why: &str| {
        format!("{at}:2: ai.ask: history[1].files[1]: cannot read {path}: {why}")
    };
    assert_eq!(
        run.lines(),
        [
            refused(
                &format!("{d}/huge.log"),
                "3.0 GB is more than any model's API takes in one file (75.0 MB): attach a part of \
                 it (as { name = ..., data = ... } holding some of its bytes)"
            ),
            refused(&format!("{d}/notes"), "a folder, not a file"),
            refused("/dev/zero", "not a regular file (a device or a pipe)"),
        ],
        "{}",
        run.stderr
    );
    assert!(fake.requests().is_empty(), "nothing reached the provider");
}

#[test]
fn bad_file_lists_name_the_field() {
    let fake = FakeProvider::start();
    let sb = sandbox(&fake, "openai");
    let run = sb
        .lua(
            r#"ai.ask({ { role = "user", content = "x", files = { "missing.pdf" } } })"#,
            &[],
        )
        .failed();
    assert!(
        run.stderr
            .contains("ai.ask: history[1].files[1]: cannot read "),
        "{}",
        run.stderr
    );
    assert!(run.stderr.contains("missing.pdf"), "{}", run.stderr);
    let run = sb
        .lua(
            r#"ai.take_turn{ prompt = "x", files = { { data = "abc" } } }"#,
            &[],
        )
        .failed();
    assert!(
        run.stderr
            .contains("ai.take_turn: files[1]: data needs a name"),
        "{}",
        run.stderr
    );
    // A blank name names nothing (it went as `[file  (text/plain, 3 B)]`).
    let run = sb
        .lua(
            r#"ai.take_turn{ prompt = "x", files = { { name = " ", data = "abc" } } }"#,
            &[],
        )
        .failed();
    assert!(
        run.stderr.contains("ai.take_turn: files[1]: name is empty"),
        "{}",
        run.stderr
    );
    // A path and data both: one of them was dropped without a word (the path's bytes went).
    sb.write("e.csv", "a,b\n");
    let run = sb
        .lua(
            r#"ai.take_turn{ prompt = "x", files = { { path = "e.csv", name = "a.txt", data = "other" } } }"#,
            &[],
        )
        .failed();
    assert!(
        run.stderr.contains(
            "ai.take_turn: files[1] gives both a path and data: give one (data with a name)"
        ),
        "{}",
        run.stderr
    );
    // A name that is not UTF-8 (as fs.list hands back) is named as such: it was mlua's "error
    // converting Lua string to String", naming nothing.
    let run = sb
        .lua(
            r#"ai.take_turn{ prompt = "x", files = { { name = "b\255.txt", data = "x" } } }"#,
            &[],
        )
        .failed();
    assert!(
        run.stderr
            .contains("ai.take_turn: files[1]: name is not UTF-8 text"),
        "{}",
        run.stderr
    );
    // A declared type that is not type/subtype went as application/octet-stream without a word.
    let run = sb
        .lua(
            r#"ai.take_turn{ prompt = "x", files = { { path = "e.csv", content_type = "csv" } } }"#,
            &[],
        )
        .failed();
    assert!(
        run.stderr.contains(
            "ai.take_turn: files[1]: content_type \"csv\" is not a content type (type/subtype, such as image/png)"
        ),
        "{}",
        run.stderr
    );
    // An empty path is named as one, not as the script's folder.
    let run = sb
        .lua(r#"ai.take_turn{ prompt = "x", files = { "" } }"#, &[])
        .failed();
    assert!(
        run.stderr
            .contains("ai.take_turn: files[1]: the path is empty"),
        "{}",
        run.stderr
    );
    let run = sb
        .lua(
            r#"ai.ask({ { role = "assistant", content = "x", files = { "e.csv" } } })"#,
            &[],
        )
        .failed();
    assert!(
        run.stderr.contains(
            "ai.ask: history[1].files: only user and tool entries carry files, not assistant"
        ),
        "{}",
        run.stderr
    );
    let run = sb.lua("ai.view_file(nil)", &[]).failed();
    assert!(
        run.stderr
            .contains("ai.view_file: ref must be a string (a file table's ref), not nil"),
        "{}",
        run.stderr
    );
    assert_eq!(fake.calls(), 0);
}

#[test]
fn a_result_table_with_other_fields_is_a_value_not_attachments() {
    let fake = FakeProvider::start();
    fake.push(Reply::tool_call("c1", "list", json!({})));
    fake.push(Reply::text("two files"));
    let run = sandbox(&fake, "openai")
        .lua(
            r#"
local list = ai.tool{ name = "list", parameters = {},
  handler = function() return { count = 2, files = { "nope1.txt", "nope2.txt" } } end }
local r = ai.take_turn{ prompt = "list", tools = { list } }
print(r.reply, r.tool_events[1].kind)
"#,
            &[],
        )
        .ok();
    assert_eq!(run.stdout, "two files\tok\n", "{}", run.stderr);
    let calls = model_calls(&fake);
    let result = &calls[1]["messages"][2];
    assert_eq!(result["role"], "tool");
    let content: Value = serde_json::from_str(result["content"].as_str().unwrap()).unwrap();
    assert_eq!(
        content,
        json!({"count": 2, "files": ["nope1.txt", "nope2.txt"]})
    );
}

/// `{ text = ..., files = "a.png" }` or `{ files = "a.png" }`, one path given for the list: the
/// call fails saying so. It was sent as the JSON `{"files":"a.png",...}`, nothing attached, the
/// event `ok`.
#[test]
fn a_result_whose_files_is_one_path_fails_saying_so() {
    for result in [
        r#"{ text = "the chart", files = "a.png" }"#,
        r#"{ files = "a.png" }"#,
    ] {
        let fake = FakeProvider::start();
        fake.push(Reply::tool_call("c1", "chart", json!({})));
        fake.push(Reply::text("no chart"));
        let run = sandbox(&fake, "openai")
            .lua(
                &r#"
local chart = ai.tool{ name = "chart", parameters = {},
  handler = function() return RESULT end }
local r = ai.take_turn{ prompt = "chart", tools = { chart } }
print(r.tool_events[1].kind)
"#
                .replace("RESULT", result),
                &[],
            )
            .ok();
        assert_eq!(run.stdout, "error\n", "{result}: {}", run.stderr);
        let calls = model_calls(&fake);
        let told = calls[1]["messages"][2]["content"].as_str().unwrap();
        assert!(
            told.contains("the result's files must be a list of files, not a string"),
            "{result}: {told}"
        );
    }
}

#[test]
fn classify_file_gives_the_closed_kind() {
    let run = Sandbox::new()
        .lua(
            r#"
for _, ct in ipairs({ "IMAGE/JPG; q=1", "application/pdf", "text/csv", "application/json",
                      "audio/x-wav", "video/mp4", "application/zip", "nonsense" }) do
  io.write(ai.classify_file(ct), " ")
end
print()
"#,
            &[],
        )
        .ok();
    assert_eq!(run.stdout, "image pdf text text audio video other other \n");
}

#[test]
fn an_openai_compatible_vision_model_opts_in_to_images() {
    let fake = FakeProvider::start();
    fake.push(Reply::text("seen"));
    let sb = sandbox(&fake, "openai");
    sb.write(
        "config.toml",
        "[use.general]\nprovider = \"openai\"\nmodel = \"m\"\nimages = true\n",
    );
    let run = sb
        .lua(
            r#"print(ai.ask({ { role = "user", content = "look", files = { "a.png", "d.pdf", "c.gif" } } }))"#,
            &[],
        )
        .ok();
    assert!(run.stdout.starts_with("seen"), "{}", run.stderr);
    let body = model_calls(&fake).remove(0);
    let content = body["messages"][0]["content"]
        .as_array()
        .expect("content parts")
        .clone();
    assert_eq!(content[0]["type"], "text");
    let text = content[0]["text"].as_str().unwrap();
    assert!(text.starts_with("look\n\n"), "{text}");
    assert_note(text, "d.pdf", "application/pdf");
    let url = |ct: &str, bytes: &[u8]| json!({"type": "image_url", "image_url": {"url": format!("data:{ct};base64,{}", b64(bytes))}});
    assert_eq!(content[1], url("image/png", &hex(PNG)));
    assert_eq!(content[2], url("image/gif", &hex(GIF)));
    assert_eq!(content.len(), 3);
}

#[test]
fn a_tool_result_carries_files() {
    for style in STYLES {
        let fake = FakeProvider::start();
        fake.push(Reply::tool_call("c1", "fetch", json!({})));
        fake.push(Reply::text("got it"));
        let run = sandbox(&fake, style)
            .lua(
                r#"
local fetch = ai.tool{ name = "fetch", parameters = {},
  handler = function() return { text = "the figures and the chart", files = { "e.csv", "a.png" } } end }
local r = ai.take_turn{ prompt = "fetch them", files = { "d.pdf" }, tools = { fetch } }
print(r.reply)
local result = r.messages[3]
print(result.role, result.content, result.files[1].name, result.files[2].name)
"#,
                &[],
            )
            .ok();
        assert_eq!(
            run.lines(),
            ["got it", "tool\tthe figures and the chart\te.csv\ta.png"],
            "{style}: {}",
            run.stderr
        );
        let calls = model_calls(&fake);
        // Files a step appends leave every earlier byte (the prompt's PDF included) the same.
        assert_prefix(style, &calls[0], &calls[1]);
        let second = serde_json::to_string(conversation(&calls[1])).unwrap();
        assert!(second.contains("the figures and the chart"), "{style}");
        assert!(
            second.contains("Paris,21"),
            "{style}: the CSV rides in the result: {second}"
        );
        let png = b64(&hex(PNG));
        match style {
            // Inside the tool_result's content, beside its text.
            "anthropic" => {
                let result = &calls[1]["messages"][2]["content"][0];
                assert_eq!(calls[1]["messages"][0]["content"][1]["type"], "document");
                assert_eq!(result["type"], "tool_result");
                assert_eq!(result["content"][1]["source"]["data"], png.as_str());
            }
            "gemini" => assert!(second.contains(&png), "{style}"),
            // Tool messages are text only.
            _ => {
                assert!(!second.contains(&png));
                assert!(second.contains("this model's API cannot read image/png files"));
            }
        }
    }
}

/// With `images = true`, OpenAI reads a PNG in a user message, and an image a tool returns is a
/// note saying why it is absent there: tool messages carry text only. The note said the API
/// "cannot read image/png files", which the same use-type had just sent.
#[test]
fn an_image_in_an_openai_tool_result_is_told_of_as_text_only_results() {
    let fake = FakeProvider::start();
    fake.push(Reply::tool_call("c1", "fetch", json!({})));
    fake.push(Reply::text("got it"));
    let sb = sandbox(&fake, "openai");
    sb.write(
        "config.toml",
        "[use.general]\nprovider = \"openai\"\nmodel = \"m\"\nimages = true\n",
    );
    let run = sb
        .lua(
            r#"
local fetch = ai.tool{ name = "fetch", parameters = {},
  handler = function() return { text = "the chart", files = { "a.png" } } end }
print(ai.take_turn{ prompt = "fetch it", tools = { fetch } }.reply)
"#,
            &[],
        )
        .ok();
    assert_eq!(run.lines(), ["got it"], "{}", run.stderr);
    let second = serde_json::to_string(conversation(&model_calls(&fake)[1])).unwrap();
    assert!(
        second.contains("this API's tool results carry text only, so its content is absent"),
        "{second}"
    );
    assert!(!second.contains("cannot read image/png"), "{second}");
    assert!(
        run.stderr
            .contains("a.png (image/png) is not sent: this API's tool results carry text only"),
        "{}",
        run.stderr
    );
}

#[test]
fn a_transcript_given_back_keeps_its_files_without_reading_them_again() {
    let fake = FakeProvider::start();
    fake.push(Reply::text("first"));
    fake.push(Reply::text("second"));
    fake.push(Reply::text("third"));
    let sb = sandbox(&fake, "anthropic");
    let csv = sb.path("e.csv").display().to_string();
    let run = sb
        .lua(
            &format!(
                r#"
local r = ai.take_turn{{ prompt = "read", files = {{ "e.csv" }} }}
assert(os.remove({csv:?}))                       -- gone from disk: the transcript holds it
collectgarbage()
local again = ai.take_turn{{ messages = r.messages, prompt = "again" }}
print(r.reply, again.reply, again.messages[1].files[1].name)
-- the transcript stays plain data: it encodes, and a decoded copy finds its files by ref
local copy = json.decode(json.encode(r.messages))
print(copy[1].files[1].ref == r.messages[1].files[1].ref, copy[1].files[1].kind)
local third = ai.take_turn{{ messages = copy, prompt = "once more" }}
print(third.reply)
"#
            ),
            &[],
        )
        .ok();
    assert_eq!(
        run.stdout, "first\tsecond\te.csv\ntrue\ttext\nthird\n",
        "{}",
        run.stderr
    );
    let calls = model_calls(&fake);
    for call in &calls[1..] {
        let body = serde_json::to_string(conversation(call)).unwrap();
        assert!(body.contains("Paris,21"), "{body}");
    }
}

/// A file the model gets only as a note is said on stderr, once for the run however many
/// requests carry it: the person who attached a PDF to a model that cannot read one saw only
/// the model's answer.
#[test]
fn a_file_the_model_cannot_read_is_said_once_on_stderr() {
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("seen"));
    let run = sandbox(&fake, "openai")
        .lua(
            r#"for _ = 1, 3 do
                 local r, err = ai.ask({ { role = "user", content = "look", files = { "d.pdf", "e.csv" } } })
                 print(r or err.message)
               end"#,
            &[],
        )
        .ok();
    assert_eq!(run.stdout, "seen\nseen\nseen\n", "{}", run.stderr);
    let told: Vec<&str> = run
        .stderr
        .lines()
        .filter(|l| l.contains("is not sent"))
        .collect();
    assert_eq!(told.len(), 1, "{}", run.stderr);
    assert!(
        told[0].contains(
            "d.pdf (application/pdf) is not sent: this model's API cannot read application/pdf \
             files, so the model is told its content is absent"
        ),
        "{}",
        run.stderr
    );
    assert_eq!(model_calls(&fake).len(), 3);
}

/// A handler may answer with files alone, `{ files = {...} }` (a chart has nothing to add):
/// that table was sent as the JSON `{"files":["e.csv"]}`, its file never attached.
#[test]
fn a_tool_result_may_be_files_alone() {
    let fake = FakeProvider::start();
    fake.push(Reply::tool_call("c1", "chart", json!({})));
    fake.push(Reply::text("seen"));
    let run = sandbox(&fake, "anthropic")
        .lua(
            r#"
local chart = ai.tool{ name = "chart", parameters = {},
  handler = function() return { files = { "e.csv" } } end }
local r = ai.take_turn{ prompt = "chart it", tools = { chart } }
local result = r.messages[3]
print(r.reply, result.content == "", result.files[1].name)
"#,
            &[],
        )
        .ok();
    assert_eq!(run.lines(), ["seen\ttrue\te.csv"], "{}", run.stderr);
    let second = serde_json::to_string(conversation(&model_calls(&fake)[1])).unwrap();
    assert!(
        second.contains("Paris,21"),
        "the CSV rides in the result: {second}"
    );
    assert!(!second.contains(r#"{\"files\""#), "{second}");
}
