//! Running one tool call. Every way a call can go wrong (a name nobody offered, arguments that
//! are not JSON or break the schema, a handler that raises, throws or overruns its deadline)
//! comes back as an error result the model can correct from, plus a [`ToolEvent`] saying which.

use std::time::Instant;

use serde_json::{Map, Value, json};
use tracing::Instrument;

use super::tools::{Handler, ToolDef};
use super::{EventKind, ToolEvent};
use crate::lua::bridge::{HandlerOutcome, LuaBridge};
use crate::residents::mail::Provenance;
use crate::vocab::{ToolCall, ToolResult};

/// How much of a result a [`ToolEvent`] keeps; the model always gets all of it.
const EVENT_OUTCOME_CHARS: usize = 500;

/// Runs `call` against the offered `tools` and answers it.
pub async fn run_call(
    bridge: &LuaBridge,
    tools: &[ToolDef],
    call: &ToolCall,
    pin: &Map<String, Value>,
    step: u32,
    provenance: Option<&Provenance>,
) -> (ToolResult, ToolEvent) {
    let span = tracing::info_span!(
        "tool",
        gen_ai.operation.name = "execute_tool",
        gen_ai.tool.name = %call.name,
        gen_ai.tool.call.id = %call.id,
    );
    let started = Instant::now();
    let (kind, content) = outcome(bridge, tools, call, pin, step, provenance)
        .instrument(span)
        .await;
    let duration = started.elapsed();
    if kind != EventKind::Ok {
        tracing::debug!(tool = %call.name, kind = ?kind, "tool call failed: {content}");
    }
    let event = ToolEvent {
        step,
        call_id: call.id.clone(),
        name: call.name.clone(),
        kind,
        outcome: content.chars().take(EVENT_OUTCOME_CHARS).collect(),
        duration,
    };
    let result = ToolResult {
        call_id: call.id.clone(),
        name: call.name.clone(),
        content,
        is_error: kind != EventKind::Ok,
    };
    (result, event)
}

async fn outcome(
    bridge: &LuaBridge,
    tools: &[ToolDef],
    call: &ToolCall,
    pin: &Map<String, Value>,
    step: u32,
    provenance: Option<&Provenance>,
) -> (EventKind, String) {
    let Some(tool) = tools.iter().find(|t| t.spec.name == call.name) else {
        let offered: Vec<&str> = tools.iter().map(|t| t.spec.name.as_str()).collect();
        let list = if offered.is_empty() {
            "none".to_string()
        } else {
            offered.join(", ")
        };
        return (
            EventKind::UnknownTool,
            format!("unknown tool {:?}: the tools offered are {list}", call.name),
        );
    };
    let mut args = match call.decoded() {
        Ok(v) => v,
        Err(e) => {
            return (
                EventKind::BadArguments,
                format!("the arguments are not valid JSON ({e}): {}", call.arguments),
            );
        }
    };
    if let Value::Object(map) = &mut args {
        for (k, v) in pin {
            if tool.has_property(k) {
                map.insert(k.clone(), v.clone());
            }
        }
    }
    let violations = tool.violations(&args);
    if !violations.is_empty() {
        return (
            EventKind::Schema,
            format!(
                "the arguments do not match the tool's schema: {}",
                violations.join("; ")
            ),
        );
    }
    let mut ctx = json!({ "call_id": call.id, "name": call.name, "step": step });
    if let Some(p) = provenance {
        ctx["origin"] = json!(p.origin);
        ctx["hop"] = json!(p.hop);
        ctx["ai"] = json!(p.to);
    }
    let run: futures::future::BoxFuture<'_, HandlerOutcome> = match &tool.handler {
        Handler::Lua(func) => Box::pin(bridge.call_tool(*func, args, ctx)),
        Handler::Native(f) => {
            let f = f.clone();
            Box::pin(async move {
                match f(args).await {
                    Ok(Value::String(s)) => HandlerOutcome::Value(s),
                    Ok(v) => HandlerOutcome::Value(v.to_string()),
                    Err(e) => HandlerOutcome::Raised(e),
                }
            })
        }
    };
    match tokio::time::timeout(tool.timeout, run).await {
        Err(_) => (
            EventKind::Deadline,
            format!(
                "the tool did not finish within its deadline of {} s",
                tool.timeout.as_secs_f64()
            ),
        ),
        Ok(HandlerOutcome::Value(text)) => (EventKind::Ok, text),
        Ok(HandlerOutcome::Refused(message) | HandlerOutcome::Raised(message)) => {
            (EventKind::Error, message)
        }
        Ok(HandlerOutcome::Thrown(message)) => (EventKind::Thrown, message),
    }
}
