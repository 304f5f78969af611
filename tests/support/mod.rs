//! Helpers shared by the integration tests (`mod support;`) and the benches
//! (`#[path = "../tests/support/mod.rs"] mod support;`). Every binary uses a subset, hence the
//! `dead_code` allowance; nothing here depends on test-only macros.
#![allow(dead_code, unused_imports)]

pub mod fake;
pub mod mcp;
pub mod pty;
pub mod script;

use serde_json::Value;

/// The three wire styles the fake speaks.
pub const STYLES: [&str; 3] = ["anthropic", "openai", "gemini"];

/// A sandbox whose environment points `style`'s provider at the fake, with a test key.
pub fn styled(fake: &fake::FakeProvider, style: &str) -> script::Sandbox {
    let (key_var, url_var) = match style {
        "anthropic" => ("ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"),
        "openai" => ("OPENAI_API_KEY", "OPENAI_BASE_URL"),
        "gemini" => ("GEMINI_API_KEY", "GEMINI_BASE_URL"),
        other => panic!("no style {other}"),
    };
    script::Sandbox::new()
        .env(key_var, &format!("test-key-{style}-0123456789"))
        .env(url_var, &fake.base_url(style))
}

/// The bodies of the model calls the fake saw (model lists excluded).
pub fn model_calls(fake: &fake::FakeProvider) -> Vec<Value> {
    fake.requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .map(|r| r.body)
        .collect()
}
