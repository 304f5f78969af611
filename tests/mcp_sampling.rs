//! A server's sampling requests (`sampling/createMessage`), through `colony run` against the fake
//! provider: answered by the use-type the spec names (`sampling = "helper"`), with the request's
//! system prompt, messages and token limit, by that use-type's model; refused with an error (and
//! the capability not offered) when the spec names none. Servers: `server-everything` (npm), whose
//! sampling tool is listed only to a client that offers sampling, and
//! tests/support/mcp/sampling_server.py, which asks whatever the client offered.

mod support;

use serde_json::Value;
use support::fake::{FakeProvider, Reply};
use support::script::Sandbox;
use support::{mcp, model_calls};

fn sandbox(fake: &FakeProvider) -> Sandbox {
    let sb = support::styled(fake, "anthropic");
    sb.write(
        "config.toml",
        "[use.general]\nprovider = \"anthropic\"\nmodel = \"general-model\"\n\n\
         [use.helper]\nprovider = \"anthropic\"\nmodel = \"helper-model\"\n",
    );
    sb
}

fn everything(extra: &str) -> String {
    format!(
        r#"{{ name = "everything", command = "node", args = {{ "{}", "stdio" }}{extra} }}"#,
        mcp::everything().display()
    )
}

fn sampler(extra: &str) -> String {
    format!(
        r#"{{ name = "sampler", command = "python3", args = {{ "{}" }}{extra} }}"#,
        mcp::server_script()
            .with_file_name("sampling_server.py")
            .display()
    )
}

#[test]
fn a_servers_sampling_request_is_answered_by_the_named_use_type() {
    let fake = FakeProvider::start();
    fake.push(Reply::text("Four."));
    let script = format!(
        r#"local conn = assert(mcp.connect({server}))
           local listed = false
           for _, t in ipairs(assert(mcp.tools(conn))) do
             if t.name == "everything__trigger-sampling-request" then listed = true end
           end
           print("listed", listed)
           print(assert(mcp.call(conn, "trigger-sampling-request", {{ prompt = "What is 2+2?", maxTokens = 50 }})))
           mcp.close(conn)"#,
        server = everything(r#", sampling = "helper""#)
    );
    let run = sandbox(&fake).lua(&script, &[]).ok();
    assert_eq!(
        run.lines()[0],
        "listed\ttrue",
        "{}\n{}",
        run.stdout,
        run.stderr
    );
    let answer = run
        .stdout
        .split_once("LLM sampling result:")
        .map(|(_, a)| a.trim());
    let answer: Value = serde_json::from_str(answer.expect("the tool's answer")).unwrap();
    assert_eq!(answer["role"], "assistant");
    assert_eq!(answer["content"]["text"], "Four.");
    assert_eq!(answer["model"], "helper-model");
    assert_eq!(answer["stopReason"], "endTurn");
    let calls = model_calls(&fake);
    assert_eq!(calls.len(), 1, "one model call");
    assert_eq!(
        calls[0]["model"], "helper-model",
        "the helper use-type's model"
    );
    assert_eq!(calls[0]["max_tokens"], 50);
    assert_eq!(calls[0]["temperature"], 0.7);
    assert!(
        calls[0]["system"]
            .to_string()
            .contains("You are a helpful test server."),
        "{}",
        calls[0]
    );
    assert!(
        calls[0]["messages"].to_string().contains("What is 2+2?"),
        "{}",
        calls[0]
    );
}

#[test]
fn a_configured_servers_sampling_names_its_use_type_in_the_config() {
    let fake = FakeProvider::start();
    fake.push(Reply::text("Paris"));
    let sb = sandbox(&fake);
    let mut config = std::fs::read_to_string(sb.path("config.toml")).unwrap();
    config.push_str(&format!(
        "\n[mcp.sampler]\ncommand = \"python3\"\nargs = [\"{}\"]\nsampling = \"helper\"\n",
        mcp::server_script()
            .with_file_name("sampling_server.py")
            .display()
    ));
    sb.write("config.toml", &config);
    let run = sb
        .lua(
            r#"local conn = assert(mcp.connect_named("sampler"))
               print(assert(mcp.call(conn, "ask", { question = "The capital of France?" })))
               mcp.close(conn)"#,
            &[],
        )
        .ok();
    let answer: Value = serde_json::from_str(run.stdout.trim()).expect(&run.stderr);
    assert_eq!(answer["offered"], true, "{answer}");
    assert_eq!(answer["result"]["content"]["text"], "Paris", "{answer}");
    let calls = model_calls(&fake);
    assert_eq!(calls[0]["model"], "helper-model");
    assert_eq!(calls[0]["max_tokens"], 20);
}

#[test]
fn without_a_use_type_sampling_is_refused_and_not_offered() {
    let fake = FakeProvider::start();
    let script = format!(
        r#"local conn = assert(mcp.connect({everything}))
           for _, t in ipairs(assert(mcp.tools(conn))) do
             if t.name == "everything__trigger-sampling-request" then print("listed") end
           end
           mcp.close(conn)
           local raw = assert(mcp.connect({sampler}))
           print(assert(mcp.call(raw, "ask", {{ question = "Spend your tokens?" }})))
           mcp.close(raw)"#,
        everything = everything(""),
        sampler = sampler("")
    );
    let run = sandbox(&fake).lua(&script, &[]).ok();
    let lines = run.lines();
    assert_eq!(lines.len(), 1, "{}\n{}", run.stdout, run.stderr);
    let answer: Value = serde_json::from_str(lines[0]).unwrap();
    assert_eq!(answer["offered"], false, "{answer}");
    assert_eq!(answer["error"]["code"], -1, "{answer}");
    assert!(
        answer["error"]["message"]
            .as_str()
            .unwrap()
            .contains("sampling is not enabled for server sampler"),
        "{answer}"
    );
    assert!(answer.get("result").is_none());
    assert_eq!(model_calls(&fake).len(), 0, "no model was asked");
}

#[test]
fn a_sampling_that_is_not_a_use_type_name_is_refused() {
    let sb = Sandbox::new();
    let run = sb
        .lua(
            &format!("mcp.connect({})", sampler(", sampling = true")),
            &[],
        )
        .failed();
    assert!(
        run.stderr.contains(
            "mcp.connect: server sampler: sampling is the name of the use-type that answers (\"helper\"), not a boolean"
        ),
        "{}",
        run.stderr
    );
}

/// A sampling request for no tokens is refused as bad params, naming `maxTokens`; it was passed
/// on to the provider as `max_tokens: 0`, which the config itself refuses.
#[test]
fn a_sampling_request_for_no_tokens_is_refused_before_any_model_call() {
    let fake = FakeProvider::start();
    fake.push(Reply::text("Four."));
    let script = format!(
        r#"local conn = assert(mcp.connect({server}))
           print(mcp.call(conn, "trigger-sampling-request", {{ prompt = "What is 2+2?", maxTokens = 0 }}))
           mcp.close(conn)"#,
        server = everything(r#", sampling = "helper""#)
    );
    let run = sandbox(&fake).lua(&script, &[]).ok();
    assert!(
        run.stdout
            .contains("maxTokens = 0: ask for at least one token"),
        "{}\n{}",
        run.stdout,
        run.stderr
    );
    assert!(model_calls(&fake).is_empty(), "a model was called");
}
