//! `colony config` with no action: the walk through providers and models, driven through a
//! pseudo-terminal against the fake provider. It writes the expected config (a typed key kept
//! with mode 0600 and never shown) and reports each round trip.

mod support;

use support::fake::{FakeProvider, Reply};
use support::pty::{Pty, visible};

const TYPED_KEY: &str = "sk-typed-0123456789";

#[test]
fn the_wizard_writes_the_config_and_reports_the_round_trips() {
    let fake = FakeProvider::start();
    // ANTHROPIC_API_KEY is in the environment; OpenAI's key is not, so the wizard asks for it.
    let sb = support::styled(&fake, "anthropic").env("OPENAI_BASE_URL", &fake.base_url("openai"));
    fake.push(Reply::text("ok"));
    fake.push(Reply::text("ok"));
    let mut pty = Pty::start(&sb, &["config"], &[]);
    pty.expect("general: provider [anthropic]: ");
    pty.send_line("");
    pty.expect("key: from ANTHROPIC_API_KEY");
    pty.expect(" 2. ");
    pty.expect("general: model (a number or a name) [claude-sonnet-4-5]: ");
    pty.send_line("2");
    pty.expect("chat: provider [-]: ");
    pty.send_line("nope");
    pty.expect("no provider \"nope\"");
    pty.expect("chat: provider [-]: ");
    pty.send_line("openai");
    pty.expect("key for openai");
    pty.send_line(TYPED_KEY);
    pty.expect("chat: model (a number or a name) [gpt-4.1-mini]: ");
    pty.send_line("");
    pty.expect("code: provider [-]: ");
    // Meanwhile, in another terminal: kept when the walk saves (it was undone, the walk's
    // copy of the file saved whole).
    sb.colony(&["config", "set", "helper", "model", "set-meanwhile"])
        .ok();
    pty.send_line("-");
    pty.expect("helper: provider [-]: ");
    pty.send_line("");
    pty.expect("chat: ok: openai answered");
    let (code, shown) = pty.finish();
    assert_eq!(code, 0, "{shown}");
    let shown = visible(&shown);
    assert!(shown.contains("general: ok: anthropic answered"), "{shown}");
    assert!(!shown.contains(TYPED_KEY), "the key is not shown: {shown}");

    let config = sb.path("config.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    let parsed: toml::Value = toml::from_str(&text).unwrap();
    let uses = parsed["use"].as_table().unwrap();
    assert_eq!(
        uses.keys().collect::<Vec<_>>(),
        ["chat", "general", "helper"],
        "code left unset, helper as set meanwhile: {text}"
    );
    assert_eq!(uses["helper"]["model"].as_str(), Some("set-meanwhile"));
    // What the fake lists for Anthropic (tests/support/fake/anthropic.rs).
    let models = ["claude-fake-1", "claude-fake-2"];
    assert_eq!(uses["general"]["provider"].as_str(), Some("anthropic"));
    assert_eq!(uses["general"]["model"].as_str(), Some(models[1]));
    assert!(uses["general"].get("key").is_none(), "{text}");
    assert_eq!(uses["chat"]["provider"].as_str(), Some("openai"));
    assert_eq!(uses["chat"]["model"].as_str(), Some("gpt-4.1-mini"));
    assert_eq!(uses["chat"]["key"].as_str(), Some(TYPED_KEY));
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&config).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    // The round trips went out with the chosen settings, the typed key on OpenAI's.
    let posts: Vec<_> = fake
        .requests()
        .into_iter()
        .filter(|r| r.method == "POST")
        .collect();
    assert_eq!(posts.len(), 2);
    assert_eq!(posts[0].body["model"], models[1]);
    let bearer = format!("Bearer {TYPED_KEY}");
    assert_eq!(posts[1].header("authorization"), Some(bearer.as_str()));
    assert_eq!(posts[1].body["model"], "gpt-4.1-mini");
}

#[test]
fn choosing_another_provider_leaves_the_old_ones_key_behind() {
    let fake = FakeProvider::start();
    let sb = support::styled(&fake, "openai");
    sb.write(
        "config.toml",
        "[use.general]\nprovider = \"anthropic\"\nkey = \"sk-ant-OLD-0123456789\"\n",
    );
    fake.push(Reply::text("ok"));
    let mut pty = Pty::start(&sb, &["config"], &[]);
    pty.expect("general: provider [anthropic]: ");
    pty.send_line("openai");
    pty.expect("key: from OPENAI_API_KEY");
    pty.expect("general: model (a number or a name) [");
    pty.send_line("");
    for use_type in ["chat", "code", "helper"] {
        pty.expect(&format!("{use_type}: provider [-]: "));
        pty.send_line("-");
    }
    pty.expect("general: ok: openai answered");
    let (code, shown) = pty.finish();
    assert_eq!(code, 0, "{shown}");
    let text = std::fs::read_to_string(sb.path("config.toml")).unwrap();
    assert!(!text.contains("sk-ant-OLD"), "{text}");
    for r in fake.requests() {
        let auth = r.header("authorization").unwrap_or_default().to_string();
        assert!(
            !auth.contains("sk-ant-OLD"),
            "{} {}: {auth}",
            r.method,
            r.path
        );
    }
}

/// Answers piped in that name no provider (`yes | colony config`) end the walk after a few,
/// nothing saved (it asked again for ever, writing hundreds of megabytes).
#[test]
fn piped_answers_that_name_no_provider_end_the_walk() {
    let sb = support::script::Sandbox::new();
    let run = sb.colony_with_stdin(&["config"], &"y\n".repeat(1000));
    assert_eq!(run.code, 2, "{}", run.stderr);
    assert!(
        run.stderr.contains(
            "colony config: 3 answers in a row named no provider (the input is not a terminal); \
             nothing was saved"
        ),
        "{}",
        run.stderr
    );
    assert_eq!(run.stdout.matches("no provider \"y\"").count(), 3);
    assert!(!sb.path("config.toml").exists());
}
