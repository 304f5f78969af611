//! `GET /metrics`: the service's counters and histograms (fed by what the programs' residents
//! are observed doing) and, read at each scrape, the gauges of what they are doing now, in the
//! Prometheus (OpenMetrics) text format, each labelled by program and resident.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::infer::breaker::{BreakerState, BreakerStatus};
use crate::residents::{ResidentInfo, TurnReport};
use crate::turn::ToolEvent;

/// The content type of a scrape.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Who {
    pub program: String,
    pub resident: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ToolOutcome {
    program: String,
    resident: String,
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InState {
    program: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Program {
    program: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BreakerIn {
    program: String,
    resident: String,
    state: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelOutcome {
    program: String,
    resident: String,
    outcome: String,
}

type Latency = Family<Who, Histogram, fn() -> Histogram>;

fn latency() -> Histogram {
    // 1 ms to about 65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// What has happened since the service started.
#[derive(Clone)]
pub struct Metrics {
    mails_accepted: Family<Who, Counter>,
    mails_served: Family<Who, Counter>,
    turns: Family<Who, Counter>,
    turn_errors: Family<Who, Counter>,
    steps: Family<Who, Counter>,
    tokens_in: Family<Who, Counter>,
    tokens_out: Family<Who, Counter>,
    tool_calls: Family<ToolOutcome, Counter>,
    model_calls: Family<ModelOutcome, Counter>,
    model_seconds: Latency,
    tool_seconds: Latency,
    /// Every resident labelled so far, with the tool outcome kinds seen for it: what to remove
    /// when it is dismissed or its program leaves.
    known: Arc<Mutex<HashMap<Who, HashSet<&'static str>>>>,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            mails_accepted: Family::default(),
            mails_served: Family::default(),
            turns: Family::default(),
            turn_errors: Family::default(),
            steps: Family::default(),
            tokens_in: Family::default(),
            tokens_out: Family::default(),
            tool_calls: Family::default(),
            model_calls: Family::default(),
            model_seconds: Family::new_with_constructor(latency),
            tool_seconds: Family::new_with_constructor(latency),
            known: Arc::default(),
        }
    }
}

/// What one program is now, for the gauges.
pub struct ProgramNow<'a> {
    pub program: &'a str,
    pub up: bool,
    /// Its residents and sources that failed for good in this run.
    pub failed: usize,
    pub residents: &'a [ResidentInfo],
    /// Each resident's breaker, in the order of `residents` (`None`: it has none in use).
    pub breakers: &'a [Option<BreakerState>],
}

fn who(program: &str, resident: &str) -> Who {
    Who {
        program: label(program),
        resident: label(resident),
    }
}

/// `value` as a label value in the text format: `\`, `"` and line breaks escaped. The client
/// library writes label values as they are, so a resident named with a line break or a program
/// file named `q"x.lua` broke the whole scrape (every series of every program lost).
fn label(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

impl Metrics {
    fn know(&self, w: &Who, kind: Option<&'static str>) {
        let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
        let kinds = match known.get_mut(w) {
            Some(k) => k,
            None => known.entry(w.clone()).or_default(),
        };
        if let Some(kind) = kind {
            kinds.insert(kind);
        }
    }

    /// A mail the API accepted for `resident`.
    pub fn accepted(&self, program: &str, resident: &str) {
        let w = who(program, resident);
        self.know(&w, None);
        self.mails_accepted.get_or_create(&w).inc();
    }

    /// A tool call that ended, as it did.
    pub fn tool_call(&self, program: &str, resident: &str, call: &ToolEvent) {
        let w = who(program, resident);
        let kind = call.kind.as_str();
        self.know(&w, Some(kind));
        self.tool_calls
            .get_or_create(&ToolOutcome {
                program: label(program),
                resident: label(resident),
                kind: kind.to_string(),
            })
            .inc();
        self.tool_seconds
            .get_or_create(&w)
            .observe(call.duration.as_secs_f64());
    }

    /// A model step that ended: its own time, and whether it answered.
    pub fn model_call(&self, program: &str, resident: &str, took: Duration, ok: bool) {
        let w = who(program, resident);
        self.know(&w, None);
        self.model_calls
            .get_or_create(&ModelOutcome {
                program: label(program),
                resident: label(resident),
                outcome: if ok { "ok" } else { "error" }.to_string(),
            })
            .inc();
        self.model_seconds
            .get_or_create(&w)
            .observe(took.as_secs_f64());
    }

    /// Removes every series labelled with `resident` of `program` (it was dismissed).
    pub fn forget(&self, program: &str, resident: &str) {
        let w = who(program, resident);
        let kinds = self
            .known
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&w);
        self.remove(&w, kinds.unwrap_or_default());
    }

    /// Removes every series of `program` (it left the config).
    pub fn forget_program(&self, program: &str) {
        let gone: Vec<(Who, HashSet<&'static str>)> = {
            let mut known = self.known.lock().unwrap_or_else(|e| e.into_inner());
            let names: Vec<Who> = known
                .keys()
                .filter(|w| w.program == label(program))
                .cloned()
                .collect();
            names
                .into_iter()
                .filter_map(|w| known.remove_entry(&w))
                .collect()
        };
        for (w, kinds) in gone {
            self.remove(&w, kinds);
        }
    }

    fn remove(&self, w: &Who, kinds: HashSet<&'static str>) {
        for family in [
            &self.mails_accepted,
            &self.mails_served,
            &self.turns,
            &self.turn_errors,
            &self.steps,
            &self.tokens_in,
            &self.tokens_out,
        ] {
            family.remove(w);
        }
        self.model_seconds.remove(w);
        self.tool_seconds.remove(w);
        for outcome in ["ok", "error"] {
            self.model_calls.remove(&ModelOutcome {
                program: w.program.clone(),
                resident: w.resident.clone(),
                outcome: outcome.to_string(),
            });
        }
        for kind in kinds {
            self.tool_calls.remove(&ToolOutcome {
                program: w.program.clone(),
                resident: w.resident.clone(),
                kind: kind.to_string(),
            });
        }
    }

    /// A turn that ended (its tool calls and model steps were counted as they ended).
    pub fn turn(&self, program: &str, t: &TurnReport) {
        let w = who(program, &t.ai);
        self.know(&w, None);
        self.turns.get_or_create(&w).inc();
        if t.error.is_some() {
            self.turn_errors.get_or_create(&w).inc();
        }
        self.mails_served.get_or_create(&w).inc_by(t.served as u64);
        self.steps.get_or_create(&w).inc_by(u64::from(t.steps));
        self.tokens_in.get_or_create(&w).inc_by(t.usage.input);
        self.tokens_out.get_or_create(&w).inc_by(t.usage.output);
    }

    /// The scrape: the counters, then the gauges of `now`.
    pub fn encode(&self, now: &[ProgramNow<'_>]) -> String {
        let mut registry = Registry::with_prefix("colony");
        registry.register(
            "mails_accepted",
            "Mails the API accepted",
            self.mails_accepted.clone(),
        );
        registry.register(
            "mails_served",
            "Mails taken into a resident's conversation by a turn",
            self.mails_served.clone(),
        );
        registry.register("turns", "Turns a resident took", self.turns.clone());
        registry.register(
            "turn_errors",
            "Turns that ended with an error",
            self.turn_errors.clone(),
        );
        registry.register("steps", "Model calls of the turns", self.steps.clone());
        registry.register("tokens_in", "Input tokens used", self.tokens_in.clone());
        registry.register("tokens_out", "Output tokens used", self.tokens_out.clone());
        registry.register(
            "tool_calls",
            "Tool calls, by how they ended",
            self.tool_calls.clone(),
        );
        registry.register(
            "model_calls",
            "Model steps, by whether they answered (a step an open breaker refused is not one)",
            self.model_calls.clone(),
        );
        registry.register(
            "model_call_seconds",
            "Time of each model step (its retries included)",
            self.model_seconds.clone(),
        );
        registry.register(
            "tool_call_seconds",
            "Time of a tool call",
            self.tool_seconds.clone(),
        );
        let up = Family::<Program, Gauge>::default();
        let failed = Family::<Program, Gauge>::default();
        let by_state = Family::<InState, Gauge>::default();
        let held = Family::<Who, Gauge>::default();
        let dropped = Family::<Who, Gauge>::default();
        let refused = Family::<Who, Gauge>::default();
        let restarts = Family::<Who, Gauge>::default();
        let breaker = Family::<BreakerIn, Gauge>::default();
        let next_probe = Family::<Who, Gauge<f64, std::sync::atomic::AtomicU64>>::default();
        for p in now {
            let program = label(p.program);
            up.get_or_create(&Program {
                program: program.clone(),
            })
            .set(i64::from(p.up));
            failed
                .get_or_create(&Program {
                    program: program.clone(),
                })
                .set(p.failed as i64);
            for state in ["idle", "busy", "outage", "restarting", "blocked"] {
                by_state
                    .get_or_create(&InState {
                        program: program.clone(),
                        state: state.to_string(),
                    })
                    .set(0);
            }
            for (i, r) in p.residents.iter().enumerate() {
                by_state
                    .get_or_create(&InState {
                        program: program.clone(),
                        state: r.state.as_str().to_string(),
                    })
                    .inc();
                let w = who(p.program, &r.name);
                held.get_or_create(&w).set(r.held as i64);
                dropped.get_or_create(&w).set(r.dropped as i64);
                refused.get_or_create(&w).set(r.refused as i64);
                restarts.get_or_create(&w).set(i64::from(r.restarts));
                if let Some(Some(b)) = p.breakers.get(i) {
                    for status in [
                        BreakerStatus::Closed,
                        BreakerStatus::Open,
                        BreakerStatus::HalfOpen,
                    ] {
                        breaker
                            .get_or_create(&BreakerIn {
                                program: program.clone(),
                                resident: label(&r.name),
                                state: status.as_str().to_string(),
                            })
                            .set(i64::from(b.status == status));
                    }
                    if b.status == BreakerStatus::Open
                        && let Some(at) = b.next_probe_ms
                    {
                        next_probe.get_or_create(&w).set(at as f64 / 1000.0);
                    }
                }
            }
        }
        registry.register("program_up", "1 while the program runs", up);
        registry.register(
            "failed",
            "Residents and sources of the program's run that failed for good (past their \
             restarts); the rest runs on",
            failed,
        );
        registry.register("residents", "Residents by state", by_state);
        registry.register("held_mail", "Mails waiting in a resident's mailbox", held);
        registry.register(
            "dropped_mail",
            "Arrivals an outage's bound discarded",
            dropped,
        );
        registry.register(
            "refused_mail",
            "Mails refused because the mailbox was full",
            refused,
        );
        registry.register("restarts", "Times a resident was restarted", restarts);
        registry.register(
            "breaker_state",
            "1 for the state the breaker of a resident's model calls is in (its own, else the \
             route's)",
            breaker,
        );
        registry.register(
            "breaker_next_probe_timestamp_seconds",
            "When an open breaker's next probe may go (Unix time)",
            next_probe,
        );
        let mut text = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
        text
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_with_quotes_backslashes_and_line_breaks_are_escaped_in_the_scrape() {
        let metrics = Metrics::default();
        metrics.accepted("q\"x", "line1\nline2\\");
        let text = metrics.encode(&[]);
        let line = text
            .lines()
            .find(|l| l.starts_with("colony_mails_accepted_total{"))
            .unwrap_or_else(|| panic!("no accepted series in {text}"));
        assert_eq!(
            line,
            r#"colony_mails_accepted_total{program="q\"x",resident="line1\nline2\\"} 1"#
        );
        // Forgotten by the name as given.
        metrics.forget_program("q\"x");
        assert!(!metrics.encode(&[]).contains("line1"));
    }
}
