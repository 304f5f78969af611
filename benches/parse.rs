//! Parse throughput over the recorded provider traffic in `tests/data/providers`: every fixture
//! run through its style's parser (whole bodies) or stream assembler (SSE), many times over.
//! Prints MB/s per style and overall.
//!
//! Run: `cargo bench --bench parse`

use std::path::Path;
use std::time::{Duration, Instant};

use colony::providers::{codec, sse};
use colony::vocab::Style;

/// One fixture, prepared as the bytes its parser sees.
struct Case {
    style: Style,
    stream: bool,
    bytes: Vec<u8>,
}

/// `*.chunks.txt` holds one data payload per line: wrap each as SSE (Anthropic with its event
/// name), as the wire would carry it.
fn wrap_chunks(style: Style, text: &str) -> Vec<u8> {
    let mut out = String::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        if style == Style::Anthropic {
            let event = serde_json::from_str::<serde_json::Value>(line)
                .ok()
                .and_then(|v| v["type"].as_str().map(str::to_string))
                .unwrap_or_default();
            out.push_str(&format!("event: {event}\n"));
        }
        out.push_str(&format!("data: {line}\n\n"));
    }
    out.into_bytes()
}

fn cases() -> Vec<Case> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/providers");
    let mut cases = Vec::new();
    for (dir, style) in [
        ("anthropic", Style::Anthropic),
        ("openai", Style::Openai),
        ("gemini", Style::Gemini),
    ] {
        let mut entries: Vec<_> = std::fs::read_dir(root.join(dir))
            .expect("fixture folder")
            .map(|e| e.expect("entry").path())
            .collect();
        entries.sort();
        for path in entries {
            let name = path.file_name().unwrap().to_string_lossy().to_string();
            let bytes = std::fs::read(&path).expect("fixture");
            // Error bodies go through classification, not the parsers; issue-16298 is a
            // summary written by the recording project, not a wire response.
            if name.contains("error") || name.contains("-429-") || name.contains("issue-16298") {
                continue;
            }
            let case = if name.ends_with(".chunks.txt") {
                Case {
                    style,
                    stream: true,
                    bytes: wrap_chunks(style, &String::from_utf8_lossy(&bytes)),
                }
            } else if name.ends_with(".json") {
                Case {
                    style,
                    stream: false,
                    bytes,
                }
            } else {
                // Some captures stop before the blank line that ends their last event, which a
                // live server always sends.
                let mut bytes = bytes;
                if !bytes.ends_with(b"\n\n") {
                    bytes.extend_from_slice(b"\n\n");
                }
                Case {
                    style,
                    stream: true,
                    bytes,
                }
            };
            cases.push(case);
        }
    }
    cases
}

fn parse(case: &Case) -> bool {
    let codec = codec(case.style).expect("a wire style");
    if case.stream {
        sse::assemble_bytes(&case.bytes, codec.assembler())
            .0
            .is_ok()
    } else {
        codec.parse(&case.bytes).is_ok()
    }
}

fn main() {
    let cases = cases();
    let target = Duration::from_millis(700);
    let mut total_bytes = 0u64;
    let mut total_time = Duration::ZERO;
    println!("parse throughput over tests/data/providers (no peer: this is colony's own floor)");
    for style in [Style::Anthropic, Style::Openai, Style::Gemini] {
        let set: Vec<&Case> = cases.iter().filter(|c| c.style == style).collect();
        let bytes_per_round: u64 = set.iter().map(|c| c.bytes.len() as u64).sum();
        // Warm up, then run whole rounds until the target time has passed.
        for c in &set {
            parse(c);
        }
        let started = Instant::now();
        let mut rounds = 0u64;
        let mut ok = 0usize;
        while started.elapsed() < target {
            for c in &set {
                ok += parse(c) as usize;
            }
            rounds += 1;
        }
        let elapsed = started.elapsed();
        let mb = (bytes_per_round * rounds) as f64 / 1e6;
        println!(
            "{:<10} {:>3} fixtures {:>7} bytes/round {:>6} rounds  {:>8.1} MB/s  ({} parsed ok per round)",
            style.as_str(),
            set.len(),
            bytes_per_round,
            rounds,
            mb / elapsed.as_secs_f64(),
            ok / rounds.max(1) as usize
        );
        total_bytes += bytes_per_round * rounds;
        total_time += elapsed;
    }
    println!(
        "all        {:>8.1} MB/s",
        total_bytes as f64 / 1e6 / total_time.as_secs_f64()
    );
}
