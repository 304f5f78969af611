//! `colony serve` through the binary, on port 0, with the two example programs under
//! `examples/service/` against the fake provider: the API, the event stream, the token and
//! the `Origin` rule, the metrics scrape, and what the signals do (SIGKILL, SIGHUP, SIGTERM).

mod support;

use serde_json::{Value, json};
use support::fake::{FakeProvider, Reply};
use support::script::{Sandbox, project_root};
use support::serve::Served;

const GOOD_KEY: &str = "test-key-good-0123456789";
const BAD_KEY: &str = "test-key-bad0-0123456789";

/// A sandbox whose config sends every model call to the fake (with `key`).
fn sandbox(fake: &FakeProvider, key: &str) -> Sandbox {
    let sb = Sandbox::new();
    sb.write("config.toml", &config(fake, key));
    sb
}

fn config(fake: &FakeProvider, key: &str) -> String {
    format!(
        "[use.general]\nprovider = \"openai\"\nmodel = \"m\"\nkey = \"{key}\"\nbase_url = \"{}\"\n",
        fake.base_url("openai")
    )
}

fn example(name: &str) -> String {
    project_root()
        .join("examples/service")
        .join(name)
        .display()
        .to_string()
}

/// The text of the last user message of a model call (the newest mail, labelled).
fn last_user_text(body: &Value) -> String {
    body["messages"]
        .as_array()
        .and_then(|m| m.iter().rev().find(|m| m["role"] == "user"))
        .and_then(|m| m["content"].as_str().map(str::to_string))
        .unwrap_or_default()
}

/// Answers each mail with `re: <its text>`.
fn echo(fake: &FakeProvider) {
    fake.set_responder(|body, _| {
        let text = last_user_text(body);
        Reply::text(format!("re: {text}")).usage(11, 5)
    });
}

#[test]
fn mail_through_the_api_is_answered_as_an_event_and_the_conversation_pages() {
    let fake = FakeProvider::start();
    echo(&fake);
    let sb = sandbox(&fake, GOOD_KEY);
    let served = Served::start(&sb, &[&example("desk.lua"), &example("pager.lua")]);
    assert_eq!(served.get("/healthz").status, 200);
    let events = served.events(None);
    // Both programs run, each with its resident.
    let programs = served.get("/api/programs").json;
    let names: Vec<&str> = programs["programs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["desk", "pager"]);
    wait_ready(&served);
    let desk = served.get("/api/programs/desk/residents/desk");
    assert_eq!(desk.status, 200, "{}", desk.text);
    assert_eq!(desk.json["state"], "idle");
    assert_eq!(desk.json["persist"], true);
    let pager = served.get("/api/programs/pager/residents");
    assert_eq!(pager.json["total"], 1);
    assert_eq!(pager.json["residents"][0]["name"], "pager");
    assert_eq!(pager.json["residents"][0]["capacity"], 2);

    // A mail is accepted, served, and its reply is an event.
    let a = served.mail("desk", json!({ "to": "desk", "content": "one", "id": "m-1" }));
    assert_eq!(a.status, 202, "{}", a.text);
    assert_eq!(a.json["durable"], true);
    let reply = events.next_of("delivery", "desk");
    assert_eq!(reply.data["text"], "re: [mail from api] one");
    assert_eq!(reply.data["program"], "desk");

    // The same id again is accepted once: no second turn, no second copy.
    let again = served.mail("desk", json!({ "to": "desk", "content": "one", "id": "m-1" }));
    assert_eq!(again.status, 202);
    assert_eq!(again.json["duplicate"], true);
    let b = served.mail(
        "desk",
        json!({ "to": "desk", "content": "two", "source": "ops" }),
    );
    assert_eq!(b.status, 202);
    let reply = events.next_of("delivery", "desk");
    assert_eq!(reply.data["text"], "re: [mail from ops] two");

    // Four messages (mail, reply, mail, reply), paged two at a time.
    let first = served.get("/api/programs/desk/residents/desk/conversation?limit=2");
    assert_eq!(first.status, 200, "{}", first.text);
    assert_eq!(first.json["total"], 4);
    assert_eq!(first.json["next"], 2);
    let texts = |page: &Value| -> Vec<String> {
        page["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["parts"][0]["text"].as_str().unwrap_or("").to_string())
            .collect()
    };
    assert_eq!(texts(&first.json), ["[mail from api] one", "re: [mail from api] one"]);
    let second = served.get("/api/programs/desk/residents/desk/conversation?after=2&limit=2");
    assert_eq!(texts(&second.json), ["[mail from ops] two", "re: [mail from ops] two"]);
    assert_eq!(second.json["next"], 4);
    let past = served.get("/api/programs/desk/residents/desk/conversation?after=4");
    assert_eq!(past.json["messages"], json!([]));
    assert_eq!(support::model_calls(&fake).len(), 2);

    // What is not there.
    let nobody = served.mail("desk", json!({ "to": "nobody", "content": "x" }));
    assert_eq!((nobody.status, nobody.json["error"].as_str()), (404, Some("no_recipient")));
    assert_eq!(served.get("/api/programs/nope/residents").status, 404);
    assert_eq!(served.get("/api/programs/desk/residents/nobody").status, 404);
    let bad = served.post("/api/programs/desk/mail", json!({ "content": "no to" }));
    assert_eq!(bad.status, 400, "{}", bad.text);
}

fn wait_ready(served: &Served) {
    let deadline = std::time::Instant::now() + support::serve::PATIENCE;
    loop {
        let r = served.get("/readyz");
        if r.status == 200 {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never ready: {}\n{}",
            r.text,
            served.stderr()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}
