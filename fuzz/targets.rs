//! The fuzz targets: every parser colony runs on bytes from outside, fed inputs a property-based
//! harness (proptest) makes: real captures from `tests/data/providers` mutated (bytes flipped,
//! ranges cut, duplicated or spliced, nesting piled up), arbitrary JSON, and plain noise.
//!
//! Each target's property is the same: the parser answers (`Ok` or a typed error) without a
//! panic, a hang or an unbounded allocation. A panic fails the case, and proptest shrinks it to
//! a small input to keep as a regression test. `tests/fuzz.rs` runs each target briefly;
//! `fuzz/README.md` says how to run them long.
//!
//! This file is shared by `tests/fuzz.rs` (`#[path]`), so it holds no `#[test]` of its own.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use colony::providers::{codec, sse, text_tools};
use colony::vocab::{Inferred, Message, Stop, Style};
use proptest::prelude::*;
use serde_json::Value;

/// Executions so far, across the targets (the long run prints it).
pub static EXECUTIONS: AtomicU64 = AtomicU64::new(0);

fn count() {
    EXECUTIONS.fetch_add(1, Ordering::Relaxed);
}

/// The captured provider answers, by style (`tests/data/providers/<style>/*`).
pub fn captures(style: Style) -> &'static [Vec<u8>] {
    static CAPTURES: std::sync::OnceLock<Vec<(Style, Vec<Vec<u8>>)>> = std::sync::OnceLock::new();
    let all = CAPTURES.get_or_init(|| {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/providers");
        [
            ("anthropic", Style::Anthropic),
            ("openai", Style::Openai),
            ("gemini", Style::Gemini),
        ]
        .into_iter()
        .map(|(dir, style)| {
            let mut paths: Vec<PathBuf> = std::fs::read_dir(root.join(dir))
                .expect("the captures' folder")
                .map(|e| e.expect("an entry").path())
                .collect();
            paths.sort();
            let files = paths
                .into_iter()
                .map(|p| std::fs::read(p).expect("a capture"))
                .collect();
            (style, files)
        })
        .collect()
    });
    &all.iter()
        .find(|(s, _)| *s == style)
        .expect("captures of each style")
        .1
}

/// One change to a byte string.
#[derive(Debug, Clone)]
pub enum Mutation {
    Flip {
        at: usize,
        bits: u8,
    },
    Cut {
        at: usize,
        len: usize,
    },
    Insert {
        at: usize,
        bytes: Vec<u8>,
    },
    Duplicate {
        at: usize,
        len: usize,
    },
    Truncate {
        at: usize,
    },
    /// Nests what follows `at` inside `depth` brackets (the "100,000 deep" family).
    Nest {
        at: usize,
        depth: usize,
    },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let at = any::<usize>();
    prop_oneof![
        (at, 1u8..=255).prop_map(|(at, bits)| Mutation::Flip { at, bits }),
        (at, 1usize..64).prop_map(|(at, len)| Mutation::Cut { at, len }),
        (at, interesting_bytes()).prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
        (at, 1usize..256).prop_map(|(at, len)| Mutation::Duplicate { at, len }),
        at.prop_map(|at| Mutation::Truncate { at }),
        (at, 1usize..4096).prop_map(|(at, depth)| Mutation::Nest { at, depth }),
    ]
}

/// Bytes a parser has opinions about.
fn interesting_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        proptest::collection::vec(any::<u8>(), 1..16),
        Just(b"\xff\xfe".to_vec()),
        Just(b"\xed\xa0\x80".to_vec()),
        Just(b"\\ud800".to_vec()),
        Just(b"\n\n".to_vec()),
        Just(b"\r".to_vec()),
        Just(b"data: ".to_vec()),
        Just(b"event: ".to_vec()),
        Just(b"data: [DONE]\n\n".to_vec()),
        Just(b"1e999999".to_vec()),
        Just(b"-0".to_vec()),
        Just(b"null".to_vec()),
        Just(b"\"".to_vec()),
        Just(b"{".to_vec()),
        Just(b"[".to_vec()),
        Just(b"```".to_vec()),
        Just(b"```json\n{\"name\":\"x\",\"arguments\":{}}\n```".to_vec()),
    ]
}

pub fn apply(mut bytes: Vec<u8>, mutations: &[Mutation]) -> Vec<u8> {
    for m in mutations {
        let n = bytes.len();
        let pos = |at: usize| if n == 0 { 0 } else { at % (n + 1) };
        match m {
            Mutation::Flip { at, bits } => {
                if n > 0 {
                    bytes[at % n] ^= bits;
                }
            }
            Mutation::Cut { at, len } => {
                let start = pos(*at);
                let end = (start + len).min(n);
                bytes.drain(start..end);
            }
            Mutation::Insert { at, bytes: new } => {
                let at = pos(*at);
                bytes.splice(at..at, new.iter().copied());
            }
            Mutation::Duplicate { at, len } => {
                let start = pos(*at);
                let end = (start + len).min(n);
                let copy = bytes[start..end].to_vec();
                bytes.splice(end..end, copy);
            }
            Mutation::Truncate { at } => bytes.truncate(pos(*at)),
            Mutation::Nest { at, depth } => {
                let at = pos(*at);
                let open = if at % 2 == 0 { b'[' } else { b'{' };
                bytes.splice(at..at, std::iter::repeat_n(open, *depth));
            }
        }
    }
    bytes
}

/// A capture of `style`, mutated.
pub fn mutated_capture(style: Style) -> impl Strategy<Value = Vec<u8>> {
    let n = captures(style).len();
    (0..n, proptest::collection::vec(mutation(), 0..6))
        .prop_map(move |(i, ms)| apply(captures(style)[i].clone(), &ms))
}

/// Arbitrary JSON, serialised.
pub fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        ".{0,24}".prop_map(Value::String),
        prop_oneof![
            Just("text"),
            Just("tool_use"),
            Just("function"),
            Just("content"),
            Just("delta"),
            Just("message_start"),
            Just("content_block_delta"),
            Just("candidates"),
            Just("parts"),
            Just("functionCall"),
            Just("role"),
            Just("assistant"),
            Just("user"),
            Just("tool")
        ]
        .prop_map(|s| Value::String(s.into())),
    ];
    leaf.prop_recursive(6, 64, 8, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::vec((key(), inner), 0..6)
                .prop_map(|kv| Value::Object(kv.into_iter().collect())),
        ]
    })
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        prop_oneof![
            Just("type"),
            Just("id"),
            Just("name"),
            Just("input"),
            Just("text"),
            Just("choices"),
            Just("delta"),
            Just("message"),
            Just("content"),
            Just("tool_calls"),
            Just("function"),
            Just("arguments"),
            Just("index"),
            Just("usage"),
            Just("candidates"),
            Just("parts"),
            Just("functionCall"),
            Just("args"),
            Just("finish_reason"),
            Just("stop_reason"),
            Just("role"),
            Just("messages"),
            Just("backlog"),
            Just("result"),
            Just("isError"),
            Just("mimeType"),
            Just("data"),
            Just("uri"),
            Just("structuredContent"),
            Just("fingerprint"),
            Just("response"),
            Just("mcpServers"),
            Just("command"),
            Just("url"),
            Just("headers")
        ]
        .prop_map(str::to_string),
        "[a-z_]{1,10}",
    ]
}

/// Inputs for a byte parser of `style`: mostly mutated captures, some JSON, some noise.
pub fn provider_input(style: Style) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        6 => mutated_capture(style),
        2 => json_value().prop_map(|v| v.to_string().into_bytes()),
        1 => proptest::collection::vec(any::<u8>(), 0..512),
    ]
}

// --- the targets ---

/// A whole (non-streamed) answer body, through the style's codec.
pub fn provider_body(style: Style, bytes: &[u8]) {
    count();
    let _ = codec(style).expect("a wire style").parse(bytes);
}

/// A streamed answer, through the SSE decoder and the style's assembler.
pub fn provider_stream(style: Style, bytes: &[u8]) {
    count();
    let _ = sse::assemble_bytes(bytes, codec(style).expect("a wire style").assembler());
}

/// Events handed straight to the style's assembler (past the SSE framing).
pub fn provider_events(style: Style, events: &[(String, String)]) {
    count();
    let mut assembler = codec(style).expect("a wire style").assembler();
    for (event, data) in events {
        if assembler.event(event, data, &mut |_| {}).is_err() {
            return;
        }
    }
    let _ = assembler.finish();
}

/// The text-fallback tool-call parser, on an answer's text.
pub fn text_tool_calls(text: &str) {
    count();
    let mut inferred = Inferred {
        message: Message::assistant(text),
        stop: Stop::EndTurn,
        usage: Default::default(),
        model: None,
    };
    text_tools::parse_calls(&mut inferred);
}

/// `json.decode`, in a VM with the `json` module.
pub fn json_decode(bytes: &[u8]) {
    count();
    thread_local! {
        static LUA: mlua::Lua = {
            let lua = mlua::Lua::new();
            let json = colony::lua::json::register(&lua).expect("the json module");
            lua.globals().set("json", json).expect("a global");
            lua
        };
    }
    LUA.with(|lua| {
        let decode: mlua::Function = lua
            .globals()
            .get::<mlua::Table>("json")
            .and_then(|j| j.get("decode"))
            .expect("json.decode");
        let text = lua.create_string(bytes).expect("a Lua string");
        let _ = decode.call::<mlua::MultiValue>(text);
    });
}

/// A cassette file.
pub fn cassette(dir: &Path, text: &[u8]) {
    count();
    let path = dir.join("fuzz.jsonl");
    std::fs::write(&path, text).expect("a scratch cassette");
    let _ = colony::providers::replay::Cassette::load(&path);
}

/// A config file's text (TOML), as `Config::load_from` reads it.
pub fn config(dir: &Path, text: &[u8]) {
    count();
    let path = dir.join("config.toml");
    std::fs::write(&path, text).expect("a scratch config");
    let _ = colony::config::Config::load_from(&path);
}

/// JSON the store keeps (a conversation, a mail, a journal line, a breaker state, a bucket of
/// usage), as the store decodes it when it reads a row back.
pub fn stored(text: &[u8]) {
    count();
    let _ = serde_json::from_slice::<Vec<Message>>(text);
    let _ = serde_json::from_slice::<colony::residents::Mail>(text);
    let _ = serde_json::from_slice::<colony::store::JournalEntry>(text);
    let _ = serde_json::from_slice::<colony::infer::breaker::BreakerState>(text);
    let _ = serde_json::from_slice::<colony::residents::budget::Spent>(text);
}

/// What colony reads of MCP itself: a tool's result shaped for the model (text, files, errors)
/// and an `mcpServers` file.
pub fn mcp(value: &Value, text: &str) {
    count();
    let _ = colony::mcp::result::shape(value);
    let _ = colony::mcp::spec::import_mcp_servers(text);
}
