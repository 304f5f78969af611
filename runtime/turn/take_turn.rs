//! The turn loop.

use futures::future::join_all;
use serde_json::Value;
use tokio::sync::mpsc;
use tracing::Instrument;

use super::compaction;
use super::dispatch::{CANCELLED, CallContext, run_call};
use super::tools::narrow;
use super::{EventKind, StepReport, ToolEvent, TurnError, TurnOutcome, TurnSpec};
use crate::config::Overrides;
use crate::core::Core;
use crate::lua::bridge::{FnId, LuaBridge};
use crate::providers::ProviderError;
use crate::residents::middleware::DynInfer;
use crate::vocab::{
    InferRequest, Inferred, Message, Part, Role, Stop, ToolCall, ToolChoice, ToolResult, Usage,
};

/// What the model reads on the last allowed step, so it answers instead of asking for tools.
pub const BUDGET_NOTE: &str = "[colony] The tool budget of this turn is exhausted: answer now, \
    without calling tools.";

/// The result given to a call left unanswered at the step cap.
pub const UNRUN_NOTE: &str =
    "not run: the tool budget of this turn was exhausted before this call could run";

/// Runs one turn to its end. Never fails as a whole: a provider error ends the turn with
/// `stop = error` and the transcript so far.
/// Each model call goes through `stack` (the middleware; `core` itself for none); `core` settles
/// each request's settings.
pub async fn take_turn(
    core: &Core,
    stack: &dyn DynInfer,
    bridge: &LuaBridge,
    spec: TurnSpec,
) -> TurnOutcome {
    let span = tracing::info_span!("turn", max_steps = spec.max_steps);
    run(core, stack, bridge, spec).instrument(span).await
}

async fn run(
    core: &Core,
    stack: &dyn DynInfer,
    bridge: &LuaBridge,
    mut spec: TurnSpec,
) -> TurnOutcome {
    let mut offered = match &spec.dynamic {
        None => narrow(&spec.tools, &spec.allow, &spec.deny),
        Some(_) => narrow(&with_dynamic(&spec), &spec.allow, &spec.deny),
    };
    // One request for the whole turn: each step appends to its messages and re-resolves only the
    // settings (so a rotated key lands mid-turn); nothing is copied per step.
    let mut req = InferRequest {
        model: String::new(),
        system: spec.ask.system.take(),
        messages: std::mem::take(&mut spec.ask.messages),
        tools: offered.iter().map(|t| t.spec.clone()).collect(),
        tool_choice: spec.ask.tool_choice.clone(),
        max_tokens: None,
        temperature: None,
        stop_sequences: std::mem::take(&mut spec.ask.stop_sequences),
        extra: spec.ask.extra.take(),
        response_schema: None,
    };
    let mut out = TurnOutcome {
        reply: String::new(),
        stop: Stop::Error,
        steps: 0,
        usage: Usage::default(),
        tool_events: Vec::new(),
        messages: Vec::new(),
        compactions: 0,
        error: None,
        resumed: false,
        reported_tokens: None,
    };
    // Carried over from the conversation's previous turn: what was reported then, plus what
    // was appended since (the new mail) at ~4 bytes a token.
    let appended: usize = req
        .messages
        .iter()
        .rev()
        .take_while(|m| m.role == Role::User)
        .map(|m| m.text().len() + 32)
        .sum();
    let mut window = compaction::Window::carried(spec.reported_tokens, appended);
    let max_steps = spec.max_steps.max(1);
    let hooks = spec.hooks.clone();

    // A transcript that ends with calls and no results is a step cut off by a restart: answer
    // its calls first (the journal reuses what finished), then carry on inferring.
    let pending: Vec<ToolCall> = match req.messages.last() {
        Some(m) if m.role == Role::Assistant => m.tool_calls().cloned().collect(),
        _ => Vec::new(),
    };
    if !pending.is_empty() {
        let Some(results) = run_calls(
            &call_context(bridge, &spec, hooks.as_deref(), &offered, 0),
            &pending,
            &mut out.tool_events,
        )
        .await
        else {
            return cancelled(out, req.messages);
        };
        req.messages.push(Message::new(
            Role::Tool,
            results.into_iter().map(Part::ToolResult).collect(),
        ));
        out.resumed = true;
        if let Some(h) = &hooks
            && let Err(e) = h.step_done(&req.messages)
        {
            return not_saved(out, req.messages, e);
        }
    }
    for step in 1..=max_steps {
        // Tools a dynamic source added (or took away) during the last step count from this one.
        if spec.dynamic.is_some() && step > 1 {
            offered = narrow(&with_dynamic(&spec), &spec.allow, &spec.deny);
            req.tools = offered.iter().map(|t| t.spec.clone()).collect();
        }
        if spec.compaction.enabled && window.would_overflow(&spec.compaction) {
            match compaction::compact(core, stack, &spec, &req, &mut out.usage).await {
                Ok(messages) => {
                    req.messages = messages;
                    out.compactions += 1;
                    window = compaction::Window::default();
                    out.reported_tokens = None;
                }
                Err(e) => {
                    out.error = Some(TurnError {
                        kind: e.kind().to_string(),
                        message: format!("compaction failed: {e}"),
                        retry_after: e.retry_after(),
                    });
                    out.messages = req.messages;
                    return out;
                }
            }
        }
        let last = step == max_steps;
        if last && !req.tools.is_empty() && step > 1 {
            req.messages.push(Message::user(BUDGET_NOTE));
        }
        if last {
            req.tool_choice = ToolChoice::None;
        }
        let inferred = match infer(
            core,
            stack,
            bridge,
            &spec.ask.overrides,
            &mut req,
            spec.on_text,
        )
        .await
        {
            Ok(i) => i,
            Err(e) => {
                out.error = Some(TurnError::from_provider(&e));
                out.messages = req.messages;
                return out;
            }
        };
        out.steps = step;
        out.usage.add(&inferred.usage);
        window.reported(&inferred.usage);
        out.reported_tokens = window.reported_tokens();
        req.messages.push(inferred.message.clone());
        let calls = inferred.tool_calls();
        // The reply must be on disk before its calls run; a final answer runs nothing, so a
        // failed save of it is only logged (the next commit writes the whole conversation).
        if let Some(h) = &hooks
            && let Err(e) = h.inferred(&req.messages)
            && !calls.is_empty()
        {
            return not_saved(out, req.messages, e);
        }
        if calls.is_empty() {
            out.reply = inferred.text();
            out.stop = inferred.stop;
            report(bridge, spec.on_step, step, &inferred, &[]).await;
            out.messages = req.messages;
            return out;
        }
        let results: Vec<ToolResult> = if last {
            calls
                .iter()
                .map(|c| ToolResult {
                    call_id: c.id.clone(),
                    name: c.name.clone(),
                    content: UNRUN_NOTE.into(),
                    is_error: true,
                })
                .collect()
        } else {
            match run_calls(
                &call_context(bridge, &spec, hooks.as_deref(), &offered, step),
                &calls,
                &mut out.tool_events,
            )
            .await
            {
                Some(results) => results,
                None => return cancelled(out, req.messages),
            }
        };
        window.unsent(&results);
        report(bridge, spec.on_step, step, &inferred, &results).await;
        req.messages.push(Message::new(
            Role::Tool,
            results.into_iter().map(Part::ToolResult).collect(),
        ));
        if let Some(h) = &hooks
            && let Err(e) = h.step_done(&req.messages)
        {
            return not_saved(out, req.messages, e);
        }
        if last {
            out.reply = inferred.text();
            out.stop = Stop::MaxSteps;
            out.messages = req.messages;
            return out;
        }
    }
    unreachable!("the last step always returns")
}

fn call_context<'a>(
    bridge: &'a LuaBridge,
    spec: &'a TurnSpec,
    hooks: Option<&'a dyn super::TurnHooks>,
    offered: &'a [super::tools::ToolDef],
    step: u32,
) -> CallContext<'a> {
    CallContext {
        bridge,
        tools: offered,
        pin: &spec.pin,
        step,
        provenance: spec.provenance.as_ref(),
        workspace: spec.workspace.as_deref(),
        hooks,
    }
}

/// The turn's own tools and, when it has a dynamic source, what that source offers now.
fn with_dynamic(spec: &TurnSpec) -> Vec<super::tools::ToolDef> {
    let mut tools = spec.tools.clone();
    if let Some(d) = &spec.dynamic {
        tools.extend(d.current());
    }
    tools
}

/// Runs a step's calls at once; `None` when the program ended while they ran.
async fn run_calls(
    cx: &CallContext<'_>,
    calls: &[ToolCall],
    events: &mut Vec<ToolEvent>,
) -> Option<Vec<ToolResult>> {
    let mut results = Vec::with_capacity(calls.len());
    let mut cut_off = false;
    for (result, event) in join_all(calls.iter().map(|c| run_call(cx, c))).await {
        cut_off |= event.kind == EventKind::Cancelled;
        results.push(result);
        events.push(event);
    }
    (!cut_off).then_some(results)
}

/// Ends a turn early with `stop = error` and the transcript so far.
fn ended(mut out: TurnOutcome, messages: Vec<Message>, kind: &str, message: String) -> TurnOutcome {
    out.error = Some(TurnError {
        kind: kind.into(),
        message,
        retry_after: None,
    });
    out.messages = messages;
    out
}

/// The program ended while a step's tools ran: nothing of the step is committed (a restart finds
/// its calls in the journal).
fn cancelled(out: TurnOutcome, messages: Vec<Message>) -> TurnOutcome {
    ended(out, messages, "cancelled", CANCELLED.into())
}

/// A step's progress could not be saved: nothing more runs until it can be.
fn not_saved(out: TurnOutcome, messages: Vec<Message>, message: String) -> TurnOutcome {
    ended(out, messages, "store", message)
}

/// One model call, with text deltas forwarded to the Lua callback in order.
async fn infer(
    core: &Core,
    stack: &dyn DynInfer,
    bridge: &LuaBridge,
    overrides: &Overrides,
    req: &mut InferRequest,
    on_text: Option<FnId>,
) -> Result<Inferred, ProviderError> {
    let ep = core.settle(overrides, req)?;
    let req = &*req;
    let Some(func) = on_text else {
        return stack.infer_boxed(req, &ep, None).await;
    };
    let (tx, mut rx) = mpsc::unbounded_channel::<String>();
    let call = async move {
        let mut send = move |t: &str| {
            let _ = tx.send(t.to_string());
        };
        stack.infer_boxed(req, &ep, Some(&mut send)).await
    };
    let forward = async {
        while let Some(delta) = rx.recv().await {
            if let Err(e) = bridge.callback(func, Value::String(delta)).await {
                tracing::warn!("the stream callback failed: {e}");
            }
        }
    };
    let (result, ()) = tokio::join!(call, forward);
    result
}

async fn report(
    bridge: &LuaBridge,
    on_step: Option<FnId>,
    step: u32,
    inferred: &Inferred,
    results: &[ToolResult],
) {
    let Some(func) = on_step else { return };
    let report = StepReport {
        step,
        text: inferred.text(),
        calls: inferred.tool_calls(),
        results: results.to_vec(),
        usage: inferred.usage,
    };
    let value = serde_json::to_value(&report).unwrap_or(Value::Null);
    if let Err(e) = bridge.callback(func, value).await {
        tracing::warn!("on_step failed: {e}");
    }
}
