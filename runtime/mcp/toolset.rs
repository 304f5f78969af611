//! A turn's MCP servers: all opened and listed at once, their tools made into turn tools named
//! `<server>__<tool>` (and, for a server whose spec says `resources = true`, its resources as
//! read-only tools), and a report per server (a server that fails is reported and skipped; the
//! turn goes on with the others).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::naming::{self, Dropped};
use super::session::ListedTool;
use super::{Connection, McpError, ServerSpec};
use crate::turn::{Handler, ToolDef};

/// A `tools/call`'s deadline when the call does not ask for more.
pub const CALL_DEADLINE: Duration = Duration::from_secs(120);

/// The most a call's own `timeoutMs` / `waitMs` argument adds to [`CALL_DEADLINE`].
pub const MAX_EXTRA: Duration = Duration::from_secs(600);

/// How one server fared when the turn started.
#[derive(Debug, Clone)]
pub struct ServerReport {
    pub name: String,
    /// `ready` or `error`.
    pub phase: &'static str,
    pub error: Option<McpError>,
    /// The revision the server answered.
    pub version: Option<String>,
    /// The names its tools are offered under.
    pub tools: Vec<String>,
    /// Its tools left out: the name was over 64 characters or clashed with another.
    pub dropped: Vec<String>,
}

/// The servers of a turn: how each fared, and the tools of those open.
pub struct Opened {
    pub servers: Vec<ServerReport>,
    pub by_server: Vec<ServerTools>,
}

/// One open server's tools: those it listed, and the readers of its resources.
pub struct ServerTools {
    pub conn: Arc<Connection>,
    pub listed: Vec<ToolDef>,
    pub readers: Vec<ToolDef>,
    /// Its [`super::session::ToolsChanged`] generation as its tools were listed.
    pub listed_at: u64,
}

impl Opened {
    /// Every open server's tools, server by server, each's listed tools before its readers.
    pub fn tools(&self) -> Vec<ToolDef> {
        self.by_server
            .iter()
            .flat_map(|s| s.listed.iter().chain(&s.readers).cloned())
            .collect()
    }

    /// The open connections.
    pub fn connections(&self) -> Vec<Arc<Connection>> {
        self.by_server.iter().map(|s| s.conn.clone()).collect()
    }

    /// Ends every session (children get stdin closed, then SIGTERM, then SIGKILL).
    pub async fn close(&self) {
        futures::future::join_all(self.by_server.iter().map(|s| s.conn.close())).await;
    }
}

/// The deadline of one call: [`CALL_DEADLINE`] plus its own `timeoutMs` or `waitMs` argument, up
/// to [`MAX_EXTRA`] more (a tool that waits on purpose says how long).
pub fn deadline_for(args: &Value) -> Duration {
    let extra = ["timeoutMs", "waitMs"]
        .iter()
        .find_map(|k| args.get(*k).and_then(Value::as_f64))
        .filter(|ms| *ms > 0.0)
        // The model wrote this number: an absurd one is capped, not refused.
        .map(|ms| {
            crate::duration::millis(ms)
                .unwrap_or(MAX_EXTRA)
                .min(MAX_EXTRA)
        })
        .unwrap_or_default();
    CALL_DEADLINE + extra
}

/// Opens every server at once; `taken` holds the names already offered (the turn's own tools),
/// so an MCP tool cannot shadow one.
pub async fn open(specs: Vec<ServerSpec>, taken: &mut HashSet<String>) -> Opened {
    let opened = futures::future::join_all(specs.into_iter().map(|spec| async move {
        let name = spec.name.clone();
        let result = async {
            let conn = Connection::open(spec).await?;
            // Read before the listing: a change said while it and the other servers' run is
            // then listed again, not taken as already seen.
            let listed_at = conn.tools_changed().generation();
            match conn.list_tools().await {
                Ok(tools) => Ok((conn, tools, listed_at)),
                Err(e) => {
                    conn.close().await;
                    Err(e)
                }
            }
        }
        .await;
        (name, result)
    }))
    .await;
    let mut out = Opened {
        servers: Vec::new(),
        by_server: Vec::new(),
    };
    for (name, result) in opened {
        match result {
            Ok((conn, listed, listed_at)) => {
                let (tools, mut report) = adopt(&conn, &listed, taken).await;
                let mut readers = Vec::new();
                if conn.spec().resources {
                    readers = super::resource_tools::offer(&conn, taken).await;
                    report
                        .tools
                        .extend(readers.iter().map(|t| t.spec.name.clone()));
                }
                out.servers.push(report);
                out.by_server.push(ServerTools {
                    conn,
                    listed: tools,
                    readers,
                    listed_at,
                });
            }
            Err(e) => {
                tracing::warn!(target: "colony::mcp", server = %name, "not offered: {e}");
                out.servers.push(ServerReport {
                    name,
                    phase: "error",
                    error: Some(e),
                    version: None,
                    tools: Vec::new(),
                    dropped: Vec::new(),
                });
            }
        }
    }
    out
}

/// Names a connected server's tools and makes them turn tools.
pub async fn adopt(
    conn: &Arc<Connection>,
    listed: &[ListedTool],
    taken: &mut HashSet<String>,
) -> (Vec<ToolDef>, ServerReport) {
    let originals: Vec<String> = listed.iter().map(|t| t.name.clone()).collect();
    let (kept, dropped) = naming::assign(conn.name(), &originals, taken);
    let mut tools = Vec::new();
    for (public, original) in &kept {
        let t = listed
            .iter()
            .find(|t| &t.name == original)
            .expect("kept from listed");
        tools.extend(tool_def(conn.clone(), public, t));
    }
    let report = ServerReport {
        name: conn.name().to_string(),
        phase: "ready",
        error: None,
        version: conn.version().await,
        // The tools made (one `tool_def` could not make is logged and not offered).
        tools: tools.iter().map(|t| t.spec.name.clone()).collect(),
        dropped: dropped
            .into_iter()
            .map(|(name, why)| {
                // A tool the model is not offered is said (at the default level): one that
                // clashed hid behind another server's, without a word.
                tracing::warn!(target: "colony::mcp", server = %conn.name(), tool = %name,
                    "tool left out: {}", match why { Dropped::TooLong => "its name is too long (64 characters at most, with the server's name)", Dropped::Clash => "its name clashes with another tool's" });
                name
            })
            .collect(),
    };
    (tools, report)
}

/// A connected server's tools under their own names (no `<server>__` prefix): what a script
/// that connected a server without naming it offers. A name is sanitised as a prefixed one is
/// (`bad name!` is offered as `bad_name_`, and its calls reach `bad name!`); one that is empty,
/// too long or taken by an earlier tool is left out and logged. (A name that was not a word
/// panicked here.)
pub fn adopt_unprefixed(conn: &Arc<Connection>, listed: &[ListedTool]) -> Vec<ToolDef> {
    // A name that is already a word is its tool's before any other's sanitised name: with
    // `a b` and `a_b` listed, `a_b` is the real `a_b`, and `a b` is the one left out.
    let mut taken: HashSet<String> = listed
        .iter()
        .filter(|t| !t.name.is_empty() && naming::sanitize(&t.name) == t.name)
        .map(|t| t.name.clone())
        .collect();
    listed
        .iter()
        .filter_map(|t| {
            let own = naming::sanitize(&t.name) == t.name;
            let public = naming::sanitize(&t.name);
            let why = if public.is_empty() {
                "its name is empty"
            } else if public.chars().count() > naming::MAX_NAME {
                "its name is too long"
            } else if !own && !taken.insert(public.clone()) {
                "its name clashes"
            } else {
                return tool_def(conn.clone(), &public, t);
            };
            tracing::info!(target: "colony::mcp", server = %conn.name(), tool = %t.name,
                "tool left out: {why}");
            None
        })
        .collect()
}

/// The server's own name for `name`: itself when the server lists a tool so named, else the
/// tool whose `<server>__<tool>` name it is (the name a prefixed tool list gave the model),
/// else `None`.
pub fn own_name<'a>(conn: &Connection, listed: &'a [ListedTool], name: &str) -> Option<&'a str> {
    listed
        .iter()
        .find(|t| t.name == name)
        .or_else(|| {
            listed
                .iter()
                .find(|t| naming::namespaced(conn.name(), &t.name) == name)
        })
        .map(|t| t.name.as_str())
}

/// One server tool as a turn tool. The turn's own deadline is set past the longest a call may
/// ask for: the call's deadline is enforced here, where passing it sends `notifications/cancelled`.
/// `None` (logged) when `public` is not a name a tool may have: a server's tool is left out,
/// never a panic.
pub fn tool_def(conn: Arc<Connection>, public: &str, listed: &ListedTool) -> Option<ToolDef> {
    let server = conn.name().to_string();
    let tool = listed.name.clone();
    let run = move |args: Value| {
        let conn = conn.clone();
        let tool = tool.clone();
        async move {
            let deadline = deadline_for(&args);
            match conn.call(&tool, args, deadline).await {
                Ok(out) if out.is_error => Err(out.text),
                Ok(out) => Ok((out.text, out.files)),
                Err(e) => Err(e.to_string()),
            }
        }
    };
    let schema = match &listed.input_schema {
        Value::Object(m) if !m.is_empty() => listed.input_schema.clone(),
        _ => json!({"type": "object"}),
    };
    let native: crate::turn::tools::AttachingFn = Arc::new(move |args| Box::pin(run(args)));
    let timeout = Some(CALL_DEADLINE + MAX_EXTRA + Duration::from_secs(5));
    // A schema our validator cannot compile still lets the server judge the arguments.
    ToolDef::new(
        public,
        &listed.description,
        schema,
        timeout,
        Handler::Attaching(native.clone()),
    )
    .or_else(|_| {
        ToolDef::new(
            public,
            &listed.description,
            json!({"type": "object"}),
            timeout,
            Handler::Attaching(native),
        )
    })
    .map_err(|e| {
        tracing::info!(target: "colony::mcp", server = %server, tool = %listed.name,
            "tool left out: {e}");
    })
    .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deadlines_grow_with_the_calls_own_wait_up_to_a_cap() {
        assert_eq!(deadline_for(&json!({})), CALL_DEADLINE);
        assert_eq!(
            deadline_for(&json!({"timeoutMs": 30000})),
            Duration::from_secs(150)
        );
        assert_eq!(
            deadline_for(&json!({"waitMs": 1500})),
            Duration::from_millis(121_500)
        );
        assert_eq!(
            deadline_for(&json!({"timeoutMs": 10_000_000})),
            CALL_DEADLINE + MAX_EXTRA
        );
        assert_eq!(deadline_for(&json!({"timeoutMs": -5})), CALL_DEADLINE);
    }
}
