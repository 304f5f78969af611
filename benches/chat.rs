//! What `colony chat` itself costs around a model call: one exchange (the persisted conversation
//! read, the turn against the fake provider on loopback, the conversation written back) as the
//! conversation grows, beside a bare `ai.ask` of the same last question; and `term.render` of a
//! reply with a heading, a list, a 20-row table and a code block.
//!
//! Run: `cargo bench --bench chat`

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::{Duration, Instant};

use colony::config::Config;
use colony::core::Core;
use colony::lua::HostSetup;
use colony::providers::Providers;
use colony::store::state_dir::StateDir;
use serde_json::json;
use support::fake::{FakeProvider, Reply};

const EXCHANGES: usize = 50;

fn history(messages: usize) -> serde_json::Value {
    let list: Vec<_> = (0..messages)
        .map(|i| {
            if i % 2 == 0 {
                json!({ "role": "user", "content": format!("Question {i}: what about the harbour festival tonight?") })
            } else {
                json!({ "role": "assistant", "content": format!("Answer {i}: the festival opens on the quay at 7 p.m. with music, food stalls and fireworks at 11; trams run until 2 a.m.") })
            }
        })
        .collect();
    serde_json::Value::Array(list)
}

/// `EXCHANGES` one-shot chats, each starting from a conversation of `messages` messages.
fn chat(core: &Core, state: &StateDir, messages: usize) -> Duration {
    let store = state.dyn_store();
    let source = colony::shipped::script("chat").unwrap().source;
    let mut total = Duration::ZERO;
    for _ in 0..EXCHANGES {
        store
            .set("", "conversation/chat", &history(messages))
            .expect("seed the conversation");
        let host = HostSetup {
            store: Some(store.clone()),
            ..HostSetup::default()
        };
        let started = Instant::now();
        colony::lua::run_source_with(
            core.clone(),
            "chat",
            source.as_bytes().to_vec(),
            vec![
                "--provider=openai".into(),
                "--".into(),
                "And tomorrow?".into(),
            ],
            host,
        )
        .expect("the chat runs");
        total += started.elapsed();
    }
    total
}

/// The floor: the same request's size aside, one `ai.ask` per VM, as the chat makes one.
fn ask(core: &Core) -> Duration {
    let mut total = Duration::ZERO;
    for _ in 0..EXCHANGES {
        let started = Instant::now();
        colony::lua::run_source(
            core.clone(),
            "ask",
            br#"assert(ai.ask("And tomorrow?", { provider = "openai", stream = function() end }))"#
                .to_vec(),
            vec![],
        )
        .expect("the ask runs");
        total += started.elapsed();
    }
    total
}

const REPLY: &str = "# Festival night\n\nWhat to know:\n\n- opens at 7 p.m.\n- fireworks at 11\n- trams until 2 a.m.\n\n";

fn markdown() -> String {
    let mut md = REPLY.to_string();
    md.push_str("| stop | first tram | last tram |\n|---|---|---|\n");
    for i in 0..20 {
        md.push_str(&format!(
            "| Stop number {i} | 06:{:02} | 01:{:02} |\n",
            i * 2,
            45 - i
        ));
    }
    md.push_str("\n```lua\nlocal turn = ai.take_turn{ prompt = \"hi\" }\nprint(turn.reply)\n```\n");
    md
}

fn main() {
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("Tomorrow the quay is quiet again."));
    // The chat script reads the provider's settings from the environment, as it does for a user.
    // SAFETY: set before any other thread of this process reads the environment.
    unsafe {
        std::env::set_var("OPENAI_API_KEY", "bench-key-0123456789");
        std::env::set_var("OPENAI_BASE_URL", fake.base_url("openai"));
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let core = Core::new(
        Config::default(),
        Providers::new(None, None),
        rt.handle().clone(),
    );
    let dir = tempfile::tempdir().expect("a temp dir");
    let state = StateDir::open(dir.path()).expect("a state directory");
    // Warm up.
    chat(&core, &state, 2);
    ask(&core);

    // The chat prints each reply as a user would see it; the figures are printed together at
    // the end, below them.
    let mut figures = vec![format!(
        "colony chat, one exchange against the fake provider (openai style, streamed; {EXCHANGES} runs, best of 3)"
    )];
    let best = |f: &dyn Fn() -> Duration| (0..3).map(|_| f()).min().unwrap();
    let per = |d: Duration| d.as_secs_f64() * 1e3 / EXCHANGES as f64;
    let floor = per(best(&|| ask(&core)));
    figures.push(format!(
        "bare ai.ask in a fresh VM        {floor:>7.2} ms/exchange"
    ));
    for messages in [0, 20, 200, 1000] {
        let ms = per(best(&|| chat(&core, &state, messages)));
        figures.push(format!(
            "chat, {messages:>4} messages before     {ms:>7.2} ms/exchange  (+{:.2} ms over the floor)",
            ms - floor
        ));
    }
    let md = markdown();
    let renders = 2000;
    let started = Instant::now();
    for _ in 0..renders {
        std::hint::black_box(colony::lua::term::render(&md, 100));
    }
    let us = started.elapsed().as_secs_f64() * 1e6 / renders as f64;
    figures.push(format!(
        "term.render of a {}-line reply (20-row table, code block) at 100 columns: {us:.0} us",
        md.lines().count()
    ));
    println!();
    for line in figures {
        println!("{line}");
    }
}
