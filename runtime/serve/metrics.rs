//! `GET /metrics`: the service's counters and histograms (fed by what the programs' residents
//! are observed doing) and, read at each scrape, the gauges of what they are doing now, in the
//! Prometheus (OpenMetrics) text format, each labelled by program and resident.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::residents::{ResidentInfo, TurnReport};

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
    model_seconds: Latency,
    tool_seconds: Latency,
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
            model_seconds: Family::new_with_constructor(latency),
            tool_seconds: Family::new_with_constructor(latency),
        }
    }
}

/// What one program is now, for the gauges.
pub struct ProgramNow<'a> {
    pub program: &'a str,
    pub up: bool,
    pub residents: &'a [ResidentInfo],
}

fn who(program: &str, resident: &str) -> Who {
    Who {
        program: program.to_string(),
        resident: resident.to_string(),
    }
}

impl Metrics {
    /// A mail the API accepted for `resident`.
    pub fn accepted(&self, program: &str, resident: &str) {
        self.mails_accepted
            .get_or_create(&who(program, resident))
            .inc();
    }

    /// A turn that ended.
    pub fn turn(&self, program: &str, t: &TurnReport) {
        let w = who(program, &t.ai);
        self.turns.get_or_create(&w).inc();
        if t.error.is_some() {
            self.turn_errors.get_or_create(&w).inc();
        }
        self.mails_served.get_or_create(&w).inc_by(t.served as u64);
        self.steps.get_or_create(&w).inc_by(u64::from(t.steps));
        self.tokens_in.get_or_create(&w).inc_by(t.usage.input);
        self.tokens_out.get_or_create(&w).inc_by(t.usage.output);
        if t.steps > 0 {
            // Each step is one model call: the turn's time outside tools, shared among them.
            let per_call = t.model_time.as_secs_f64() / f64::from(t.steps);
            let h = self.model_seconds.get_or_create(&w);
            for _ in 0..t.steps {
                h.observe(per_call);
            }
        }
        for call in &t.tool_calls {
            self.tool_calls
                .get_or_create(&ToolOutcome {
                    program: program.to_string(),
                    resident: t.ai.clone(),
                    kind: call.kind.as_str().to_string(),
                })
                .inc();
            self.tool_seconds
                .get_or_create(&w)
                .observe(call.duration.as_secs_f64());
        }
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
            "model_call_seconds",
            "Time of a model call (a turn's time outside its tools, per step)",
            self.model_seconds.clone(),
        );
        registry.register(
            "tool_call_seconds",
            "Time of a tool call",
            self.tool_seconds.clone(),
        );
        let up = Family::<Program, Gauge>::default();
        let by_state = Family::<InState, Gauge>::default();
        let held = Family::<Who, Gauge>::default();
        let dropped = Family::<Who, Gauge>::default();
        let refused = Family::<Who, Gauge>::default();
        let restarts = Family::<Who, Gauge>::default();
        for p in now {
            let program = p.program.to_string();
            up.get_or_create(&Program {
                program: program.clone(),
            })
            .set(i64::from(p.up));
            for state in ["idle", "busy", "outage", "restarting", "blocked"] {
                by_state
                    .get_or_create(&InState {
                        program: program.clone(),
                        state: state.to_string(),
                    })
                    .set(0);
            }
            for r in p.residents {
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
            }
        }
        registry.register("program_up", "1 while the program runs", up);
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
        let mut text = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut text, &registry);
        text
    }
}
