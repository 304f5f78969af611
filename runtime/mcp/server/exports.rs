//! What a program offers over MCP: its `exportable = true` tools, the residents it marked
//! `export = true`, its resources and its prompts. The Lua host adds to it as the script runs
//! (so a tool defined after the server started shows up, and the clients are told the list
//! changed); the server only reads it.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use dashmap::DashMap;
use serde_json::Value;
use tokio::sync::watch;

use super::ask::{Asker, Question, Unanswered};
use crate::script::FnId;
use crate::turn::ToolDef;

/// How long a client waits for an exported resident's reply unless the program says.
pub const RESIDENT_DEADLINE: Duration = Duration::from_secs(300);

/// A resident offered as a tool: a call mails it the `message` and answers its reply.
#[derive(Debug, Clone, PartialEq)]
pub struct ResidentExport {
    pub name: String,
    pub description: String,
    /// How long a call waits for the reply before it answers an error.
    pub deadline: Duration,
}

/// A resource (`uri`) or a resource template (`uri` with `{placeholders}`, RFC 6570 level 1),
/// read by a script function that answers the text (or `{ text | blob, mime_type }`).
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceExport {
    pub uri: String,
    pub name: String,
    pub description: Option<String>,
    pub mime_type: Option<String>,
    pub read: FnId,
    pub template: bool,
}

/// One argument a prompt takes.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptArgument {
    pub name: String,
    pub description: Option<String>,
    pub required: bool,
}

/// A prompt: `get(args)` answers its text (one user message) or a list of messages.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptExport {
    pub name: String,
    pub description: Option<String>,
    pub arguments: Vec<PromptArgument>,
    pub get: FnId,
    /// `complete(argument, value)` answers the completions of an argument's value, if given.
    pub complete: Option<FnId>,
}

/// What a tool handler tells the client while it runs (`ctx.progress`, `ctx.log`).
#[derive(Debug, Clone, PartialEq)]
pub enum Report {
    Progress {
        progress: f64,
        total: Option<f64>,
        message: Option<String>,
    },
    Log {
        level: String,
        data: Value,
    },
}

/// Where a call's reports go (the client that made it).
pub type Reporter = Arc<dyn Fn(Report) + Send + Sync>;

/// Closes a call's SSE stream mid-call, asking its client to come back after the duration
/// (SSE polling, SEP-1699); `Err` says why it cannot.
pub type Closer = Arc<
    dyn Fn(std::time::Duration) -> futures::future::BoxFuture<'static, Result<(), String>>
        + Send
        + Sync,
>;

/// The client of a call running now: where its reports go, who answers its questions, and how
/// its stream is closed (`None` where nobody can: a resident's reply asks nothing, stdio has no
/// stream to close).
#[derive(Clone)]
pub struct Client {
    pub reporter: Reporter,
    pub asker: Option<Asker>,
    pub closer: Option<Closer>,
}

/// Which of the lists changed, for `notifications/*/list_changed`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Changes {
    pub tools: u64,
    pub resources: u64,
    pub prompts: u64,
}

/// A program's exports, shared between its Lua host (which adds) and the server (which reads).
/// Cheap to clone.
#[derive(Clone)]
pub struct Exports(Arc<Inner>);

struct Inner {
    tools: RwLock<Vec<ToolDef>>,
    residents: RwLock<Vec<ResidentExport>>,
    resources: RwLock<Vec<ResourceExport>>,
    prompts: RwLock<Vec<PromptExport>>,
    changes: watch::Sender<Changes>,
    /// The calls running now, by call id: their clients.
    calls: DashMap<String, Client>,
    /// The program's main chunk has returned (what it exports at the start is all there).
    ready: watch::Sender<bool>,
}

impl Default for Exports {
    fn default() -> Exports {
        Exports(Arc::new(Inner {
            tools: RwLock::new(Vec::new()),
            residents: RwLock::new(Vec::new()),
            resources: RwLock::new(Vec::new()),
            prompts: RwLock::new(Vec::new()),
            changes: watch::Sender::new(Changes::default()),
            calls: DashMap::new(),
            ready: watch::Sender::new(false),
        }))
    }
}

fn upsert<T: Clone>(list: &RwLock<Vec<T>>, item: T, same: impl Fn(&T) -> bool) {
    let mut list = list.write().unwrap_or_else(|e| e.into_inner());
    match list.iter_mut().find(|t| same(t)) {
        Some(old) => *old = item,
        None => list.push(item),
    }
}

fn read<T: Clone>(list: &RwLock<Vec<T>>) -> Vec<T> {
    list.read().unwrap_or_else(|e| e.into_inner()).clone()
}

impl Exports {
    /// Offers `tool` (a later tool of the same name replaces it). Tools not marked exportable
    /// are not taken: only what the program marked may be called from outside.
    pub fn add_tool(&self, tool: ToolDef) {
        if !tool.exportable {
            return;
        }
        let name = tool.spec.name.clone();
        upsert(&self.0.tools, tool, |t| t.spec.name == name);
        self.0.changes.send_modify(|c| c.tools += 1);
    }

    pub fn add_resident(&self, resident: ResidentExport) {
        let name = resident.name.clone();
        upsert(&self.0.residents, resident, |r| r.name == name);
        self.0.changes.send_modify(|c| c.tools += 1);
    }

    pub fn add_resource(&self, resource: ResourceExport) {
        let uri = resource.uri.clone();
        upsert(&self.0.resources, resource, |r| r.uri == uri);
        self.0.changes.send_modify(|c| c.resources += 1);
    }

    pub fn add_prompt(&self, prompt: PromptExport) {
        let name = prompt.name.clone();
        upsert(&self.0.prompts, prompt, |p| p.name == name);
        self.0.changes.send_modify(|c| c.prompts += 1);
    }

    /// Whether the program offers nothing at all.
    pub fn is_empty(&self) -> bool {
        let len = |n: Result<usize, ()>| n.unwrap_or(0);
        len(self.0.tools.read().map(|l| l.len()).map_err(|_| ())) == 0
            && len(self.0.residents.read().map(|l| l.len()).map_err(|_| ())) == 0
            && len(self.0.resources.read().map(|l| l.len()).map_err(|_| ())) == 0
            && len(self.0.prompts.read().map(|l| l.len()).map_err(|_| ())) == 0
    }

    pub fn tools(&self) -> Vec<ToolDef> {
        read(&self.0.tools)
    }

    pub fn residents(&self) -> Vec<ResidentExport> {
        read(&self.0.residents)
    }

    pub fn resources(&self) -> Vec<ResourceExport> {
        read(&self.0.resources)
    }

    pub fn prompts(&self) -> Vec<PromptExport> {
        read(&self.0.prompts)
    }

    /// The program's main chunk has returned: its first exports are all there.
    pub fn set_ready(&self) {
        self.0.ready.send_replace(true);
    }

    /// Whether [`Exports::set_ready`] was called: a main chunk that failed never is.
    pub fn is_ready(&self) -> bool {
        *self.0.ready.borrow()
    }

    /// Waits for [`Exports::set_ready`].
    pub async fn ready(&self) {
        let mut rx = self.0.ready.subscribe();
        let _ = rx.wait_for(|r| *r).await;
    }

    /// Told each time a list changes.
    pub fn changes(&self) -> watch::Receiver<Changes> {
        self.0.changes.subscribe()
    }

    /// Routes the reports and questions of call `call_id` to `client` until the returned guard
    /// is dropped.
    pub fn reporting(&self, call_id: &str, client: Client) -> Reporting {
        self.0.calls.insert(call_id.to_string(), client);
        Reporting {
            exports: self.clone(),
            call_id: call_id.to_string(),
        }
    }

    /// Hands `report` to the client of call `call_id`; `false` when nobody listens (the call
    /// did not come over MCP, or it has ended).
    pub fn report(&self, call_id: &str, report: Report) -> bool {
        let to = self.0.calls.get(call_id).map(|l| l.reporter.clone());
        match to {
            Some(to) => {
                to(report);
                true
            }
            None => false,
        }
    }

    /// Asks the client of call `call_id` `question`; [`Unanswered::Unsupported`] when there is
    /// no client to ask (the call did not come over MCP, or it has ended).
    pub async fn ask(&self, call_id: &str, question: Question) -> Result<Value, Unanswered> {
        let asker = self.0.calls.get(call_id).and_then(|l| l.asker.clone());
        match asker {
            Some(ask) => ask(question).await,
            None => Err(Unanswered::Unsupported(
                "this call did not come over MCP (a model's turn or the program called the \
                 tool), so there is no client to ask"
                    .into(),
            )),
        }
    }

    /// Closes the SSE stream of call `call_id` (the client resumes it after `retry`).
    pub async fn close_stream(
        &self,
        call_id: &str,
        retry: std::time::Duration,
    ) -> Result<(), String> {
        let closer = self.0.calls.get(call_id).and_then(|l| l.closer.clone());
        match closer {
            Some(close) => close(retry).await,
            None => Err(
                "this call has no SSE stream to close (it did not come over Streamable HTTP)"
                    .into(),
            ),
        }
    }
}

/// While alive, a call's reports reach its client.
pub struct Reporting {
    exports: Exports,
    call_id: String,
}

impl Drop for Reporting {
    fn drop(&mut self) {
        self.exports.0.calls.remove(&self.call_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, exportable: bool) -> ToolDef {
        let mut t = ToolDef::native(name, "", serde_json::json!({}), |_| async {
            Ok(Value::Null)
        })
        .unwrap();
        t.exportable = exportable;
        t
    }

    #[test]
    fn only_exportable_tools_are_taken_and_each_addition_is_a_change() {
        let e = Exports::default();
        let changes = e.changes();
        e.add_tool(tool("hidden", false));
        assert!(e.tools().is_empty());
        assert_eq!(changes.borrow().tools, 0);
        e.add_tool(tool("open", true));
        e.add_tool(tool("open", true));
        assert_eq!(e.tools().len(), 1);
        assert_eq!(changes.borrow().tools, 2);
    }

    #[test]
    fn reports_reach_the_call_only_while_it_runs() {
        let e = Exports::default();
        let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
        let sink = seen.clone();
        let guard = e.reporting(
            "c1",
            Client {
                reporter: Arc::new(move |r| sink.lock().unwrap().push(r)),
                asker: None,
                closer: None,
            },
        );
        let log = Report::Log {
            level: "info".into(),
            data: Value::from("hi"),
        };
        assert!(e.report("c1", log.clone()));
        assert!(!e.report("c2", log.clone()));
        drop(guard);
        assert!(!e.report("c1", log.clone()));
        assert_eq!(*seen.lock().unwrap(), vec![log]);
    }

    #[tokio::test]
    async fn a_question_reaches_the_calls_client_and_outside_a_call_nobody() {
        let e = Exports::default();
        let asker: Asker = Arc::new(|q| {
            Box::pin(async move {
                match q {
                    Question::Sample(p) => Ok(serde_json::json!({ "heard": p })),
                    Question::Elicit(_) => Err(Unanswered::Refused("no".into())),
                }
            })
        });
        let guard = e.reporting(
            "c1",
            Client {
                reporter: Arc::new(|_| {}),
                asker: Some(asker),
                closer: None,
            },
        );
        let q = Question::Sample(Value::from("hi"));
        assert_eq!(
            e.ask("c1", q.clone()).await,
            Ok(serde_json::json!({ "heard": "hi" }))
        );
        assert!(matches!(
            e.ask("c2", q.clone()).await,
            Err(Unanswered::Unsupported(_))
        ));
        drop(guard);
        assert!(matches!(
            e.ask("c1", q).await,
            Err(Unanswered::Unsupported(_))
        ));
    }
}
