//! Embedding colony in a Rust application (`examples/embed.lua` is the Lua half).
//!
//! The application builds a runtime, registers a native tool (an async Rust closure with a
//! JSON Schema) beside the program's Lua tool, loads the program, mails its resident, receives
//! the reply on a channel and shuts the program down.
//!
//!     cargo run --example embed -- --replay examples/embed.jsonl    # offline, on its cassette
//!     cargo run --example embed                                     # live (ANTHROPIC_API_KEY, ...)
//!
//! `tests/embed.rs` runs it in the test suite, on the cassette and against the fake provider.

use std::path::PathBuf;

use colony::embed::{EmbedError, Runtime};
use colony::residents::{DeliveryKind, Mail};
use colony::turn::ToolDef;
use serde_json::json;

/// The program this application loads.
pub fn program_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("examples/embed.lua")
}

/// Runs the application on `runtime`; returns what it would print, line by line.
pub async fn run(mut runtime: Runtime) -> Result<Vec<String>, EmbedError> {
    runtime.register_tool(ToolDef::native(
        "stock.count",
        "How many of an item the shop has in stock",
        json!({ "item": "string" }),
        |args| async move {
            let count = match args["item"].as_str().unwrap_or("") {
                "apples" => 30,
                "pears" => 7,
                _ => 0,
            };
            Ok(json!({ "item": args["item"], "count": count }))
        },
    )?)?;
    let mut program = runtime.load(program_path(), vec![])?;
    program.opened().await;
    let question = "How many dozen apples do we have?";
    let mut lines = vec![format!("shop floor -> clerk: {question}")];
    let posted = program.mail(Mail::new("clerk", "shop floor", question, 0));
    if let Err(e) = &posted {
        lines.push(format!("the mail was refused: {e}"));
    }
    while posted.is_ok()
        && let Some(delivery) = program.delivery().await
    {
        match delivery.kind {
            DeliveryKind::Reply => {
                lines.push(format!("clerk -> shop floor: {}", delivery.text));
                break;
            }
            // An outage notice: the clerk's model cannot be called right now.
            _ => lines.push(format!("(notice) {}", delivery.text)),
        }
    }
    program.stop("the application is done");
    program.join().await?;
    Ok(lines)
}

#[allow(dead_code)] // `tests/embed.rs` includes this file for `run`, not `main`.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let rt = tokio::runtime::Runtime::new()?;
    let args: Vec<String> = std::env::args().skip(1).collect();
    let runtime = match args.as_slice() {
        [flag, path] if flag == "--replay" => {
            Runtime::replaying(path.as_ref(), rt.handle().clone())?
        }
        [] => Runtime::from_config(rt.handle().clone())?,
        _ => return Err("usage: embed [--replay CASSETTE]".into()),
    };
    for line in rt.block_on(run(runtime))? {
        println!("{line}");
    }
    Ok(())
}
