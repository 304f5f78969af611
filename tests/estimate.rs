//! colony's own token estimate (`turn::estimate`) against what real providers counted: every
//! recorded answer under `tests/data/providers/` that reports its output tokens, parsed by its
//! codec, has its assistant message estimated as a request would carry it. The estimate must
//! never fall below the provider's count of the visible output (it is meant to err on the large
//! side, so compaction comes before the window), and stays within a small factor of it.

use std::path::PathBuf;

use colony::providers::codec;
use colony::providers::sse::assemble_bytes;
use colony::turn::estimate;
use colony::vocab::{InferRequest, Inferred, Part, Style};
use serde_json::Value;

fn dir(style: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/providers")
        .join(style)
}

/// A `*.chunks.txt` file (one data payload per line) wrapped into SSE as `style` frames it.
fn wrapped(style: Style, text: &str) -> Vec<u8> {
    let mut out = String::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        match style {
            Style::Anthropic => {
                let payload: Value = serde_json::from_str(line).expect("a JSON chunk");
                let kind = payload["type"].as_str().unwrap_or("message");
                out.push_str(&format!("event: {kind}\ndata: {line}\n\n"));
            }
            Style::Gemini => out.push_str(&format!("data: {line}\r\n\r\n")),
            _ => out.push_str(&format!("data: {line}\n\n")),
        }
    }
    if style == Style::Openai {
        out.push_str("data: [DONE]\n\n");
    }
    out.into_bytes()
}

/// Every recorded answer of `style` that parses, by file name.
fn answers(folder: &str, style: Style) -> Vec<(String, Inferred)> {
    let codec = codec(style).expect("a codec");
    let mut out = Vec::new();
    let mut names: Vec<_> = std::fs::read_dir(dir(folder))
        .expect("the fixtures folder")
        .map(|e| {
            e.expect("an entry")
                .file_name()
                .into_string()
                .expect("a name")
        })
        .collect();
    names.sort();
    for name in names {
        // Error bodies carry no answer; this one streams three choices (`n = 3`) and reports
        // the usage of all three, of which a codec keeps the first.
        if name.contains("error") || name == "oaipy__a491adda08c3.bin" {
            continue;
        }
        let bytes = std::fs::read(dir(folder).join(&name)).expect("a fixture");
        let parsed = if name.ends_with(".chunks.txt") {
            let sse = wrapped(style, &String::from_utf8_lossy(&bytes));
            assemble_bytes(&sse, codec.assembler()).0
        } else if name.ends_with(".json") {
            codec.parse(&bytes)
        } else {
            assemble_bytes(&bytes, codec.assembler()).0
        };
        if let Ok(inferred) = parsed {
            out.push((name, inferred));
        }
    }
    out
}

#[test]
fn the_estimate_never_falls_below_what_providers_counted() {
    let mut checked = 0;
    for (folder, style) in [
        ("anthropic", Style::Anthropic),
        ("openai", Style::Openai),
        ("gemini", Style::Gemini),
    ] {
        for (name, inferred) in answers(folder, style) {
            // Reasoning tokens are the model's thinking, hidden or summarised: compared are the
            // count without them and the estimate of the message without its reasoning parts.
            let visible = inferred
                .usage
                .output
                .saturating_sub(inferred.usage.reasoning);
            let mut message = inferred.message.clone();
            message
                .parts
                .retain(|p| !matches!(p, Part::Reasoning { .. }));
            if visible == 0 {
                continue;
            }
            let req = InferRequest {
                messages: vec![message],
                ..Default::default()
            };
            let estimated = estimate::tokens(&req, Some((style, Default::default())));
            println!("{folder}/{name}: counted {visible}, estimated {estimated}");
            assert!(
                estimated >= visible,
                "{folder}/{name}: estimated {estimated} < counted {visible}"
            );
            assert!(
                estimated <= 4 * visible + 32,
                "{folder}/{name}: estimated {estimated} is far above counted {visible}"
            );
            checked += 1;
        }
    }
    assert!(checked >= 20, "only {checked} recorded answers checked");
}
