//! A resident's MCP servers' tools, listed again when a server says they changed.
//!
//! A resident keeps its servers (`ai.spawn{ mcp = {...} }`) for the life of the program, and
//! offered the tools they listed at its spawn for as long: a server that added a tool (and said
//! so with `notifications/tools/list_changed`, as the protocol asks) never had it offered, and a
//! tool it took away was still offered, each call failing. Before each step of the resident's
//! turns, a server whose tools changed since they were last listed
//! ([`super::session::ToolsChanged`]) is listed again; its resources' readers stay as they were.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::Connection;
use super::toolset::{ServerTools, adopt};
use crate::turn::{DynamicTools, ToolDef};

/// The servers of one resident and what each offers now.
pub struct Relisted {
    /// The names of the resident's own tools, which a server's tool may not take.
    own: HashSet<String>,
    servers: Vec<Server>,
}

struct Server {
    conn: Arc<Connection>,
    /// The [`super::session::ToolsChanged`] generation its tools were listed at.
    seen: AtomicU64,
    listed: Mutex<Vec<ToolDef>>,
    readers: Vec<ToolDef>,
}

impl Relisted {
    /// `own`: the resident's own tools' names; `servers`: as [`super::toolset::open`] opened
    /// and listed them.
    pub fn new(own: HashSet<String>, servers: Vec<ServerTools>) -> Relisted {
        let servers = servers
            .into_iter()
            .map(|s| Server {
                seen: AtomicU64::new(s.listed_at),
                conn: s.conn,
                listed: Mutex::new(s.listed),
                readers: s.readers,
            })
            .collect();
        Relisted { own, servers }
    }

    /// The names every tool but `server`'s takes.
    fn taken_except(&self, server: usize) -> HashSet<String> {
        let mut taken = self.own.clone();
        for (i, s) in self.servers.iter().enumerate() {
            if i != server {
                taken.extend(lock(&s.listed).iter().map(|t| t.spec.name.clone()));
            }
            taken.extend(s.readers.iter().map(|t| t.spec.name.clone()));
        }
        taken
    }
}

impl DynamicTools for Relisted {
    fn current(&self) -> Vec<ToolDef> {
        let mut tools = Vec::new();
        for s in &self.servers {
            tools.extend(lock(&s.listed).iter().cloned());
            tools.extend(s.readers.iter().cloned());
        }
        tools
    }

    fn refresh(&self) -> futures::future::BoxFuture<'_, ()> {
        Box::pin(async move {
            for (i, s) in self.servers.iter().enumerate() {
                let now = s.conn.tools_changed().generation();
                if s.seen.swap(now, Ordering::AcqRel) == now {
                    continue;
                }
                match s.conn.list_tools().await {
                    Ok(listed) => {
                        let mut taken = self.taken_except(i);
                        let (tools, _) = adopt(&s.conn, &listed, &mut taken).await;
                        tracing::info!(target: "colony::mcp", server = %s.conn.name(),
                            "its tools were listed again: {} offered", tools.len());
                        *lock(&s.listed) = tools;
                    }
                    // Offered as they were: the next change (or session) tries again.
                    Err(e) => {
                        tracing::warn!(target: "colony::mcp", server = %s.conn.name(),
                            "its tools changed but could not be listed again ({e}): its last \
                             list is offered")
                    }
                }
            }
        })
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}
