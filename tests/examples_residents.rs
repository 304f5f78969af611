//! The resident examples, `examples/newsroom.lua` and `examples/watcher.lua`, replayed offline
//! from their bundled cassettes: what they print must not change from run to run, whichever
//! order their residents happen to call the model in.
//!
//! The cassettes are recorded against the fake provider, which answers from each request's
//! content (residents call the model concurrently, so a queue would not do). Regenerate them
//! after changing an example with
//! `cargo test --test examples_residents -- --ignored regenerate`.

mod support;

use serde_json::{Value, json};
use support::fake::{FakeProvider, Reply};
use support::script::{Run, Sandbox, project_root};
use support::styled;

// ---- the newsroom ----

const FESTIVAL: &str = "Cover the harbour festival tonight: what happens, where, until when, and \
    how people get home afterwards.";
const QUESTION: &str = "Who can tell me how late the trams run tonight? Readers will want to know \
    how to get home.";
const TRAMS: &str = "Write a short piece on the late trams for the festival tonight, and tell ines \
    the times for her story.";
const ANSWER: &str = "Line 9 runs every 15 minutes until 2 a.m. tonight, from the quay to the \
    central station.";
const FESTIVAL_HEADLINE: &str = "Harbour festival lights up the quay";
const FESTIVAL_STORY: &str = "The harbour festival opens on the quay at 7 p.m. tonight with music, \
    food stalls and fireworks at 11. Line 9 trams run every 15 minutes until 2 a.m. to take \
    visitors home.";
const TRAMS_HEADLINE: &str = "Trams run until 2 a.m. for the festival";
const TRAMS_STORY: &str = "Line 9 runs every 15 minutes until 2 a.m. tonight between the quay and \
    the central station. The last tram leaves the quay at 1:45.";
const EDITION: &str = "THE QUAYSIDE GAZETTE: Festival night on the quay\n\
    \n\
    ## Harbour festival lights up the quay\n\
    The harbour festival opens on the quay at 7 p.m. tonight with music, food stalls and \
    fireworks at 11.\n\
    \n\
    ## Trams run until 2 a.m. for the festival\n\
    Line 9 runs every 15 minutes until 2 a.m. between the quay and the central station. The \
    last tram leaves the quay at 1:45.";

const NEWSROOM_OUTPUT: &str = "\
publisher -> editor: The harbour festival is tonight. It leads tomorrow's front page.
editor -> ines: Cover the harbour festival tonight: what happens, where, until when,...
ines -> editor: Who can tell me how late the trams run tonight? Readers will want to...
editor -> tom: Write a short piece on the late trams for the festival tonight, and...
tom -> ines: Line 9 runs every 15 minutes until 2 a.m. tonight, from the quay to...
desk -> editor: 2 stories filed (ines, tom)
[editor] THE QUAYSIDE GAZETTE: Festival night on the quay

## Harbour festival lights up the quay
The harbour festival opens on the quay at 7 p.m. tonight with music, food stalls and fireworks at 11.

## Trams run until 2 a.m. for the festival
Line 9 runs every 15 minutes until 2 a.m. between the quay and the central station. The last tram leaves the quay at 1:45.
newsroom closed: the edition is out
";

// ---- the watcher ----

const BACKUP_NOTICE: &str = "Last night's backup did not save the archive volume: the disk is \
    full. Free some space and run the backup again.";
const INVOICE_NOTICE: &str = "Harbour Print Shop's invoice for 1,240.00 EUR is due on 14 March; a \
    5% late fee applies after that.";
const WATCHER_REPLY: &str =
    "Sent two notices (the failed backup and the invoice); the lunch menu needs nothing.";

const WATCHER_OUTPUT: &str = "\
scan 1: 3 new file(s): backup-report.log, invoice-2291.txt, lunch-menu.md
notify (high) backup-report.log: Last night's backup did not save the archive volume: the disk is full. Free some space and run the backup again.
notify (normal) invoice-2291.txt: Harbour Print Shop's invoice for 1,240.00 EUR is due on 14 March; a 5% late fee applies after that.
[watcher] Sent two notices (the failed backup and the invoice); the lunch menu needs nothing.
scan 2: nothing new
watch ended: 2 scans done
";

/// The system prompt of an OpenAI-style request and the text of its last user message (the
/// mail the turn serves; colony's own notes left out).
fn parts(body: &Value) -> (String, String) {
    let messages = body["messages"].as_array().cloned().unwrap_or_default();
    let text_of = |role: &str| {
        messages
            .iter()
            .filter(|m| m["role"] == role)
            .filter_map(|m| m["content"].as_str())
            .rfind(|t| !t.starts_with("[colony]"))
            .unwrap_or("")
            .to_string()
    };
    (text_of("system"), text_of("user"))
}

/// The name of the last tool the model called since the last user message, if any.
fn last_call(body: &Value) -> Option<String> {
    let messages = body["messages"].as_array()?;
    messages
        .iter()
        .rev()
        .take_while(|m| m["role"] != "user")
        .filter_map(|m| m["tool_calls"].as_array())
        .filter_map(|calls| calls.last())
        .find_map(|c| c["function"]["name"].as_str().map(str::to_string))
}

/// What the fake answers a request that none of the scripted cases expected.
fn unexpected(who: &str, mail: &str) -> Reply {
    Reply::status(400).body(format!(
        "{{\"error\":{{\"message\":\"the fake has no answer for {who} on {mail:?}\"}}}}"
    ))
}

fn newsroom_reply(body: &Value) -> Reply {
    let (system, mail) = parts(body);
    let done = last_call(body);
    let done = done.as_deref();
    if system.starts_with("You are the editor") {
        if mail.starts_with("[mail from publisher]") {
            return match done {
                None => {
                    Reply::tool_call("call_ed1", "tell", json!({"to": "ines", "text": FESTIVAL}))
                }
                Some(_) => Reply::text("The festival is with ines."),
            };
        }
        if mail.starts_with("[mail from ines]") {
            return match done {
                None => Reply::tool_call("call_ed2", "tell", json!({"to": "tom", "text": TRAMS})),
                Some(_) => Reply::text("Tom has the trams and will brief ines."),
            };
        }
        if mail.starts_with("[mail from desk]") {
            return Reply::text(EDITION);
        }
        return unexpected("the editor", &mail);
    }
    if system.starts_with("You are ines") {
        if mail.starts_with("[mail from editor]") {
            return match done {
                None => Reply::tool_call(
                    "call_in1",
                    "tell",
                    json!({"to": "editor", "text": QUESTION}),
                ),
                Some(_) => Reply::text("Waiting to hear about the trams."),
            };
        }
        if mail.starts_with("[mail from tom]") {
            return match done {
                None => Reply::tool_call(
                    "call_in2",
                    "file_story",
                    json!({"headline": FESTIVAL_HEADLINE, "text": FESTIVAL_STORY}),
                ),
                Some(_) => Reply::text("Filed."),
            };
        }
        return unexpected("ines", &mail);
    }
    if system.starts_with("You are tom") && mail.starts_with("[mail from editor]") {
        // One call a step: the tell to ines, then the story.
        return match done {
            None => Reply::tool_call("call_tm1", "tell", json!({"to": "ines", "text": ANSWER})),
            Some("tell") => Reply::tool_call(
                "call_tm2",
                "file_story",
                json!({"headline": TRAMS_HEADLINE, "text": TRAMS_STORY}),
            ),
            Some(_) => Reply::text("Filed."),
        };
    }
    unexpected("a reporter", &mail)
}

fn watcher_reply(body: &Value) -> Reply {
    let (system, mail) = parts(body);
    if !system.starts_with("You watch a shared folder") || !mail.starts_with("[mail from folder]") {
        return unexpected("the watcher", &mail);
    }
    // One notice a step, so they print in this order.
    let results = body["messages"]
        .as_array()
        .map(|m| {
            m.iter()
                .rev()
                .take_while(|m| m["role"] != "user")
                .filter(|m| m["role"] == "tool")
                .count()
        })
        .unwrap_or(0);
    match results {
        0 => Reply::tool_call(
            "call_w1",
            "notify",
            json!({"file": "backup-report.log", "urgency": "high", "message": BACKUP_NOTICE}),
        ),
        1 => Reply::tool_call(
            "call_w2",
            "notify",
            json!({"file": "invoice-2291.txt", "urgency": "normal", "message": INVOICE_NOTICE}),
        ),
        _ => Reply::text(WATCHER_REPLY),
    }
}

/// Runs `colony run --replay examples/NAME.jsonl examples/NAME.lua` with no keys in the
/// environment.
fn replay(name: &str) -> Run {
    Sandbox::new()
        .colony(&[
            "run",
            "--replay",
            &format!("examples/{name}.jsonl"),
            &format!("examples/{name}.lua"),
        ])
        .ok()
}

/// Records `examples/NAME.jsonl` from a run against the fake.
fn record(name: &str, fake: &FakeProvider) -> Run {
    let cassette = project_root().join(format!("examples/{name}.jsonl"));
    styled(fake, "openai")
        .colony(&[
            "run",
            "--record",
            &cassette.display().to_string(),
            &format!("examples/{name}.lua"),
        ])
        .ok()
}

#[test]
fn the_newsroom_replays_offline() {
    let run = replay("newsroom");
    assert_eq!(run.stdout, NEWSROOM_OUTPUT);
    assert_eq!(run.stderr, "", "no warnings, no cassette misses");
}

#[test]
fn the_watcher_replays_offline() {
    let run = replay("watcher");
    assert_eq!(run.stdout, WATCHER_OUTPUT);
    assert_eq!(run.stderr, "", "no warnings, no cassette misses");
}

/// A SCANS that is not a whole number of 0 or more is said, status 2: `abc` crashed the
/// watcher's source four times over (comparing a number with nil) and `-1` did nothing.
#[test]
fn the_watcher_names_a_scans_argument_it_cannot_use() {
    for scans in ["abc", "-1", "1.5"] {
        let run = Sandbox::new().colony(&[
            "run",
            "--replay",
            "examples/watcher.jsonl",
            "examples/watcher.lua",
            "examples/watched",
            scans,
        ]);
        assert_eq!(run.code, 2, "{scans}: {}{}", run.stdout, run.stderr);
        assert_eq!(
            run.stderr,
            format!(
                "watcher.lua: SCANS must be a whole number, 0 or more (0 watches until Ctrl-C), \
                 not {scans:?}\n"
            )
        );
    }
}

/// `cargo test --test examples_residents -- --ignored regenerate_newsroom_cassette`.
#[test]
#[ignore = "writes examples/newsroom.jsonl; run by hand"]
fn regenerate_newsroom_cassette() {
    let fake = FakeProvider::start();
    fake.set_responder(|body, _| newsroom_reply(body));
    let run = record("newsroom", &fake);
    assert_eq!(run.stdout, NEWSROOM_OUTPUT);
    assert_eq!(run.stderr, "");
    // editor: 2 + 2 + 1, ines: 2 + 2, tom: 3.
    assert_eq!(fake.calls(), 12);
}

/// `cargo test --test examples_residents -- --ignored regenerate_watcher_cassette`.
#[test]
#[ignore = "writes examples/watcher.jsonl; run by hand"]
fn regenerate_watcher_cassette() {
    let fake = FakeProvider::start();
    fake.set_responder(|body, _| watcher_reply(body));
    let run = record("watcher", &fake);
    assert_eq!(run.stdout, WATCHER_OUTPUT);
    assert_eq!(run.stderr, "");
    assert_eq!(fake.calls(), 3);
}

/// Writes `path` as a file finished a minute ago: the watcher leaves a file changed in its last
/// two seconds (still being written) for a later scan.
fn write_settled(path: &std::path::Path, text: &str) {
    std::fs::write(path, text).unwrap();
    let past = std::time::SystemTime::now() - std::time::Duration::from_secs(60);
    std::fs::File::options()
        .write(true)
        .open(path)
        .unwrap()
        .set_modified(past)
        .unwrap();
}

#[test]
fn the_watcher_mails_each_scans_new_files_once() {
    // The example, watching a folder of the test's own: a file appears while the AI answers the
    // first scan, and the second scan mails only that one.
    let fake = FakeProvider::start();
    let sb = styled(&fake, "openai");
    let inbox = sb.path("inbox");
    std::fs::create_dir(&inbox).unwrap();
    write_settled(&inbox.join("a.txt"), "nothing much\n");
    std::fs::create_dir(inbox.join("sub")).unwrap();
    std::fs::write(inbox.join(".hidden"), "not listed\n").unwrap();
    let script = sb.path("watcher.lua");
    std::fs::copy(project_root().join("examples/watcher.lua"), &script).unwrap();
    let arrival = inbox.join("b.txt");
    fake.set_responder(move |body, _| {
        let (_, mail) = parts(body);
        if mail.contains("### a.txt") {
            write_settled(&arrival, "the roof leaks\n");
            return Reply::text("a.txt needs nothing.");
        }
        match last_call(body) {
            None => Reply::tool_call(
                "call_1",
                "notify",
                json!({"file": "b.txt", "urgency": "high", "message": "The roof leaks."}),
            ),
            Some(_) => Reply::text("Flagged b.txt."),
        }
    });
    let run = sb
        .colony(&["run", &script.display().to_string(), "inbox", "2"])
        .ok();
    assert_eq!(
        run.lines(),
        [
            "scan 1: 1 new file(s): a.txt",
            "[watcher] a.txt needs nothing.",
            "scan 2: 1 new file(s): b.txt",
            "notify (high) b.txt: The roof leaks.",
            "[watcher] Flagged b.txt.",
            "watch ended: 2 scans done",
        ]
    );
    let calls = support::model_calls(&fake);
    assert_eq!(calls.len(), 3);
    let second = &calls[1]["messages"];
    assert_eq!(
        second[3]["content"],
        "[mail from folder] 1 new file(s) in inbox/:\n\n### b.txt\nthe roof leaks"
    );
}

/// A file still being written when a scan comes by (changed in the last two seconds) is left
/// for a later scan and then mailed whole, once: the example mailed the start it had, and
/// never looked at it again.
#[test]
fn the_watcher_leaves_a_file_being_written_for_a_later_scan() {
    let fake = FakeProvider::start();
    fake.set_default(Reply::text("Noted."));
    let sb = styled(&fake, "openai");
    let inbox = sb.path("inbox");
    std::fs::create_dir(&inbox).unwrap();
    // Written as the run starts: not yet quiet at its first scan.
    std::fs::write(inbox.join("half.txt"), "the first half\n").unwrap();
    let script = sb.path("watcher.lua");
    std::fs::copy(project_root().join("examples/watcher.lua"), &script).unwrap();
    let run = sb
        .colony(&["run", &script.display().to_string(), "inbox", "6"])
        .ok();
    let lines = run.lines();
    assert_eq!(lines[0], "scan 1: nothing new", "{}", run.stdout);
    let mailed: Vec<&&str> = lines.iter().filter(|l| l.contains("new file(s)")).collect();
    assert_eq!(mailed.len(), 1, "{}", run.stdout);
    assert!(
        mailed[0].ends_with(": 1 new file(s): half.txt"),
        "{}",
        run.stdout
    );
    let calls = support::model_calls(&fake);
    assert_eq!(calls.len(), 1);
    assert!(
        calls[0]
            .to_string()
            .contains("### half.txt\\nthe first half"),
        "{}",
        calls[0]
    );
}

#[test]
fn the_watcher_carries_on_after_a_restart() {
    // Stopped and started again on the same state: the files announced before are not mailed
    // again, the conversation carries on, and `colony conversations` shows it in between.
    let fake = FakeProvider::start();
    let sb = styled(&fake, "openai");
    let inbox = sb.path("inbox");
    std::fs::create_dir(&inbox).unwrap();
    write_settled(&inbox.join("a.txt"), "nothing much\n");
    let script = sb.path("watcher.lua");
    std::fs::copy(project_root().join("examples/watcher.lua"), &script).unwrap();
    let script = script.display().to_string();
    fake.set_responder(|body, _| {
        let n = body["messages"].as_array().map(|m| m.len()).unwrap_or(0);
        Reply::text(format!("Read {n} messages."))
    });
    let first = sb.colony(&["run", &script, "inbox", "1"]).ok();
    assert_eq!(
        first.lines(),
        [
            "scan 1: 1 new file(s): a.txt",
            "[watcher] Read 2 messages.",
            "watch ended: 1 scans done"
        ]
    );
    let shown = sb
        .colony(&["conversations", &script, "show", "watcher"])
        .ok();
    assert!(
        shown.stdout.contains("Read 2 messages."),
        "{}",
        shown.stdout
    );
    write_settled(&inbox.join("b.txt"), "the roof leaks\n");
    let second = sb.colony(&["run", &script, "inbox", "1"]).ok();
    assert_eq!(
        second.lines(),
        [
            "scan 1: 1 new file(s): b.txt",
            "[watcher] Read 4 messages.",
            "watch ended: 1 scans done"
        ]
    );
}

// ---- the review ----

const REVIEW_VERDICT: &str = "One figure does not hold: the report counts 412 leaflet orders, \
    the monthly data adds up to 417. Revenue (1,240,000 EUR) and late invoices (3) match.";
const REVIEW_OUTPUT: &str = "\
flagged Leaflet orders: the report says 412, the data says 417 (131 + 136 + 150)
[reviewer] One figure does not hold: the report counts 412 leaflet orders, the monthly data adds up to 417. Revenue (1,240,000 EUR) and late invoices (3) match.
reviewed
";

/// The reviewer, as a model that read both attachments would answer: one flag, then a verdict.
fn review_reply(body: &Value) -> Reply {
    let answered = body.to_string().contains("\"tool_result\"");
    if answered {
        return Reply::text(REVIEW_VERDICT);
    }
    Reply::tool_call(
        "f1",
        "flag",
        json!({"figure": "Leaflet orders", "report_says": "412", "data_says": "417 (131 + 136 + 150)"}),
    )
}

/// The review run against the fake in the Anthropic style (which reads PDFs), optionally
/// recording its cassette.
fn review_live(fake: &FakeProvider, record: bool) -> Run {
    let sb = styled(fake, "anthropic");
    sb.write(
        "config.toml",
        "[use.general]\nprovider = \"anthropic\"\nmodel = \"claude-test\"\n",
    );
    let cassette = project_root().join("examples/review.jsonl");
    let cassette = cassette.display().to_string();
    let mut args = vec!["run"];
    if record {
        args.extend(["--record", &cassette]);
    }
    args.push("examples/review.lua");
    sb.colony(&args).ok()
}

#[test]
fn the_review_sends_the_pdf_as_a_document_and_the_csv_as_text() {
    let fake = FakeProvider::start();
    fake.set_responder(|body, _| review_reply(body));
    let run = review_live(&fake, false);
    assert_eq!(run.stdout, REVIEW_OUTPUT);
    let calls = support::model_calls(&fake);
    assert_eq!(calls.len(), 2);
    let blocks = calls[0]["messages"][0]["content"].as_array().unwrap();
    let pdf = std::fs::read(project_root().join("examples/review/q3-report.pdf")).unwrap();
    use base64::Engine;
    let data = base64::engine::general_purpose::STANDARD.encode(&pdf);
    assert_eq!(
        blocks[1],
        json!({"type": "document", "title": "q3-report.pdf",
               "source": {"type": "base64", "media_type": "application/pdf", "data": data}})
    );
    let csv = blocks[2]["text"].as_str().unwrap();
    assert!(
        csv.contains("[file q3-figures.csv (text/csv, 108 B)]\nmonth,revenue_eur,"),
        "{csv}"
    );
    assert!(csv.contains("September,440000,150,2"), "{csv}");
}

#[test]
fn the_review_replays_offline() {
    let run = replay("review");
    assert_eq!(run.stdout, REVIEW_OUTPUT);
    assert_eq!(run.stderr, "", "no warnings, no cassette misses");
}

/// `cargo test --test examples_residents -- --ignored regenerate_review_cassette`.
#[test]
#[ignore = "writes examples/review.jsonl; run by hand"]
fn regenerate_review_cassette() {
    let fake = FakeProvider::start();
    fake.set_responder(|body, _| review_reply(body));
    let run = review_live(&fake, true);
    assert_eq!(run.stdout, REVIEW_OUTPUT);
    assert_eq!(run.stderr, "");
    assert_eq!(fake.calls(), 2);
}
