//! The dashboard in a real browser: headless Chromium (Debian's `chromium`, installed on first
//! use) on `colony serve`'s page, against the fake provider. The page lists the residents and
//! pages them, a mail typed into its box produces the reply in the open conversation, and a
//! blocked resident shows its error and unblocks from its button. A screenshot is saved at
//! `target/serve-dashboard.png` for review.

mod support;

use serde_json::json;
use support::browser::Headless;
use support::fake::{FakeProvider, Reply};
use support::script::{Sandbox, project_root};
use support::serve::Served;

const KEY: &str = "test-key-dash-0123456789";

/// A program with a desk that keeps its conversation and 250 quiet typists (three pages, the desk first).
const PROGRAM: &str = r#"
ai.spawn{ name = "desk", persist_conversation = true, deliver_to = "host" }
for i = 1, 250 do ai.spawn{ name = ("typist-%03d"):format(i) } end
ai.watch{}
"#;

#[test]
fn the_dashboard_lists_mails_shows_the_reply_and_unblocks() {
    let fake = FakeProvider::start();
    fake.set_responder(|body, _| {
        let text = body["messages"]
            .as_array()
            .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
            .and_then(|m| m["content"].as_str())
            .unwrap_or("")
            .to_string();
        Reply::text(format!("re: {text}"))
    });
    let sb = Sandbox::new();
    sb.write(
        "config.toml",
        &format!(
            "[use.general]\nprovider = \"openai\"\nmodel = \"m\"\nkey = \"{KEY}\"\nbase_url = \"{}\"\n",
            fake.base_url("openai")
        ),
    );
    let file = sb.write("front.lua", PROGRAM);
    let served = Served::start(&sb, &[&file.display().to_string()]);
    let browser = Headless::open(&format!("{}/", served.url));
    browser.until("its first render", "document.body.dataset.ready === 'yes'");

    // The residents, a page at a time.
    browser.until(
        "the residents",
        "document.querySelectorAll('#residents tr[data-name]').length === 100",
    );
    let info: String = browser.eval("document.getElementById('page-info').textContent");
    assert_eq!(info, "1–100 of 251");
    browser.click("#next");
    browser.until(
        "the second page",
        "document.getElementById('page-info').textContent === '101–200 of 251'",
    );
    browser.click("#prev");
    browser.until(
        "the desk's row",
        "document.querySelector('#residents tr[data-name=desk]')",
    );

    // A mail typed into the box; the reply grows the open conversation.
    browser.click("#residents tr[data-name=desk]");
    browser.until(
        "the open desk",
        "document.getElementById('open-name').textContent === 'desk'",
    );
    browser.type_and_enter("#mail-text", "hello from the page");
    browser.until(
        "the reply",
        "[...document.querySelectorAll('#conversation .msg.assistant')].some(m => m.textContent.includes('re: [mail from dashboard] hello from the page'))",
    );

    // The key is refused: the desk blocks, its row shows the error and the button.
    fake.refuse_key(Some(KEY));
    let blocked = served.mail("front", json!({ "to": "desk", "content": "while refused" }));
    assert_eq!(blocked.status, 202);
    browser.until(
        "the blocked desk",
        "document.querySelector('#residents tr[data-name=desk] td.state').textContent === 'blocked'",
    );
    let error: String = browser
        .eval("document.querySelector('#residents tr[data-name=desk] td.error').textContent");
    assert!(error.starts_with("auth_error: "), "{error}");
    assert!(!error.contains(KEY), "{error}");
    browser.screenshot(&project_root().join("target/serve-dashboard-blocked.png"));
    // Fixed at the provider: the button lets it try again, and the held mail is answered.
    fake.refuse_key(None);
    browser.click("#residents tr[data-name=desk] button.unblock");
    browser.until(
        "the answer to the held mail",
        "[...document.querySelectorAll('#conversation .msg.assistant')].some(m => m.textContent.includes('re: [mail from api] while refused'))",
    );
    browser.until(
        "the desk idle again",
        "document.querySelector('#residents tr[data-name=desk] td.state').textContent === 'idle'",
    );
    // Each message once, in order, as the API has them.
    let shown: Vec<String> = browser.eval(
        "[...document.querySelectorAll('#conversation .msg')].map(m => m.lastChild.textContent)",
    );
    assert_eq!(
        shown,
        [
            "[mail from dashboard] hello from the page",
            "re: [mail from dashboard] hello from the page",
            "[mail from api] while refused",
            "re: [mail from api] while refused",
        ]
    );
    let page: String = browser.eval("document.documentElement.outerHTML");
    assert!(!page.contains(KEY));
    browser.screenshot(&project_root().join("target/serve-dashboard.png"));
}
