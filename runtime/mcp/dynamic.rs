//! `dynamic_mcp`: the model connects MCP servers itself, mid-turn, through two tools:
//! `mcp_connect{ name, server }` and `mcp_disconnect{ name }`. Only servers on the allowlist are
//! accepted: a URL under one of its URL prefixes (`https://a.example/mcp` allows
//! `https://a.example/mcp/x`, not `https://a.example/mcpx`), or one of its configured names. A
//! connected server's tools are offered from the next step on, as `<name>__<tool>`.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use serde_json::{Value, json};

use super::spec::ServerConfig;
use super::{Connection, McpError, ServerSpec, toolset};
use crate::turn::{DynamicTools, ToolDef};

/// A server the model connected, as the turn's result reports it.
#[derive(Debug, Clone)]
pub struct LiveServer {
    pub name: String,
    pub server: String,
    pub version: Option<String>,
    pub tools: Vec<String>,
    pub dropped: Vec<String>,
}

struct Live {
    conn: Arc<Connection>,
    tools: Vec<ToolDef>,
    report: LiveServer,
}

/// The allowlist, the servers connected so far, and the two tools.
pub struct DynamicSet {
    allow: Vec<String>,
    configured: BTreeMap<String, ServerConfig>,
    /// Names the model cannot take (the turn's own tools).
    reserved: HashSet<String>,
    live: Mutex<BTreeMap<String, Live>>,
    own: Mutex<Vec<ToolDef>>,
}

/// Whether `url` is under `prefix`: the same scheme, host and port, and the prefix's path
/// segments leading the URL's, compared after parsing (so `.../mcp/../admin` and its
/// percent-encoded forms are judged by where they lead, and `.../mcpx` is not under `.../mcp`).
/// A URL with credentials in it is never under a prefix.
pub fn under_prefix(prefix: &str, url: &str) -> bool {
    let (Ok(prefix), Ok(url)) = (reqwest::Url::parse(prefix), reqwest::Url::parse(url)) else {
        return false;
    };
    if prefix.scheme() != url.scheme()
        || prefix.host_str() != url.host_str()
        || prefix.port_or_known_default() != url.port_or_known_default()
        || !url.username().is_empty()
        || url.password().is_some()
    {
        return false;
    }
    let segments = |u: &reqwest::Url| -> Vec<String> {
        u.path_segments()
            .map(|s| s.filter(|p| !p.is_empty()).map(str::to_string).collect())
            .unwrap_or_default()
    };
    let (want, got) = (segments(&prefix), segments(&url));
    got.len() >= want.len() && got[..want.len()] == want[..]
}

impl DynamicSet {
    pub fn new(
        allow: Vec<String>,
        configured: BTreeMap<String, ServerConfig>,
        reserved: HashSet<String>,
    ) -> Arc<DynamicSet> {
        let set = Arc::new(DynamicSet {
            allow,
            configured,
            reserved,
            live: Mutex::new(BTreeMap::new()),
            own: Mutex::new(Vec::new()),
        });
        let tools = vec![connect_tool(&set), disconnect_tool(&set)];
        *set.own.lock().unwrap() = tools;
        set
    }

    /// The spec for `server` if the allowlist accepts it.
    fn allowed(&self, name: &str, server: &str) -> Result<ServerSpec, String> {
        if server.contains("://") {
            if !self
                .allow
                .iter()
                .any(|p| p.contains("://") && under_prefix(p, server))
            {
                return Err(format!(
                    "{server} is not allowed (allowed: {})",
                    self.allow.join(", ")
                ));
            }
            let config = ServerConfig {
                url: Some(server.to_string()),
                ..ServerConfig::default()
            };
            return config.into_spec(name).map_err(|e| e.to_string());
        }
        if !self.allow.iter().any(|a| a == server) {
            return Err(format!(
                "{server} is not allowed (allowed: {})",
                self.allow.join(", ")
            ));
        }
        let config = self
            .configured
            .get(server)
            .ok_or_else(|| format!("no MCP server named {server:?} is configured"))?;
        config.clone().into_spec(name).map_err(|e| e.to_string())
    }

    async fn connect(self: &Arc<Self>, name: &str, server: &str) -> Result<Value, String> {
        if name.is_empty() {
            return Err("name must not be empty".into());
        }
        if self.live.lock().unwrap().contains_key(name) {
            return Err(format!(
                "{name} is already connected (mcp_disconnect it first)"
            ));
        }
        let spec = self.allowed(name, server)?;
        let conn = Connection::open(spec)
            .await
            .map_err(|e: McpError| e.to_string())?;
        let listed = match conn.list_tools().await {
            Ok(l) => l,
            Err(e) => {
                conn.close().await;
                return Err(e.to_string());
            }
        };
        let mut taken: HashSet<String> = self.reserved.clone();
        taken.extend(self.own.lock().unwrap().iter().map(|t| t.spec.name.clone()));
        for l in self.live.lock().unwrap().values() {
            taken.extend(l.tools.iter().map(|t| t.spec.name.clone()));
        }
        let (tools, report) = toolset::adopt(&conn, &listed, &mut taken).await;
        let live = LiveServer {
            name: name.to_string(),
            server: server.to_string(),
            version: report.version,
            tools: report.tools,
            dropped: report.dropped,
        };
        let answer = json!({
            "connected": name,
            "tools": live.tools,
            "note": "these tools are offered from the next step on",
        });
        // Two connects of one name in one step: the second loses.
        let lost = {
            let mut map = self.live.lock().unwrap();
            if map.contains_key(name) {
                Some(conn)
            } else {
                map.insert(
                    name.to_string(),
                    Live {
                        conn,
                        tools,
                        report: live,
                    },
                );
                None
            }
        };
        if let Some(conn) = lost {
            conn.close().await;
            return Err(format!("{name} is already connected"));
        }
        Ok(answer)
    }

    async fn disconnect(&self, name: &str) -> Result<Value, String> {
        let live = self.live.lock().unwrap().remove(name);
        match live {
            Some(l) => {
                l.conn.close().await;
                Ok(json!({"disconnected": name}))
            }
            None => Err(format!("{name} is not connected")),
        }
    }

    /// The servers connected now.
    pub fn live(&self) -> Vec<LiveServer> {
        self.live
            .lock()
            .unwrap()
            .values()
            .map(|l| l.report.clone())
            .collect()
    }

    /// Ends every session the model opened.
    pub async fn close(&self) {
        let all: Vec<Live> = std::mem::take(&mut *self.live.lock().unwrap())
            .into_values()
            .collect();
        futures::future::join_all(all.iter().map(|l| l.conn.close())).await;
    }
}

impl DynamicTools for DynamicSet {
    fn current(&self) -> Vec<ToolDef> {
        let mut tools = self.own.lock().unwrap().clone();
        for l in self.live.lock().unwrap().values() {
            tools.extend(l.tools.iter().cloned());
        }
        tools
    }
}

fn connect_tool(set: &Arc<DynamicSet>) -> ToolDef {
    let weak = Arc::downgrade(set);
    let description = format!(
        "Connect an MCP server and use its tools (as NAME__TOOL) from the next step on. \
         server: a URL under one of {} or one of those names.",
        set.allow.join(", ")
    );
    ToolDef::native(
        "mcp_connect",
        &description,
        json!({"type": "object", "properties": {
            "name": {"type": "string", "description": "a short name for the server; its tools are named NAME__TOOL"},
            "server": {"type": "string", "description": "the server's URL or configured name"}},
            "required": ["name", "server"]}),
        move |args: Value| {
            let weak = weak.clone();
            async move {
                let set = weak.upgrade().ok_or("the turn is over")?;
                let name = super::naming::sanitize(args["name"].as_str().unwrap_or(""));
                let server = args["server"].as_str().unwrap_or("").to_string();
                set.connect(&name, &server).await
            }
        },
    )
    .expect("a valid tool")
}

fn disconnect_tool(set: &Arc<DynamicSet>) -> ToolDef {
    let weak = Arc::downgrade(set);
    ToolDef::native(
        "mcp_disconnect",
        "Disconnect an MCP server connected with mcp_connect; its tools go away from the next step on.",
        json!({"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}),
        move |args: Value| {
            let weak = weak.clone();
            async move {
                let set = weak.upgrade().ok_or("the turn is over")?;
                set.disconnect(args["name"].as_str().unwrap_or("")).await
            }
        },
    )
    .expect("a valid tool")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn url_prefixes_stop_at_a_path_boundary() {
        assert!(under_prefix(
            "https://a.example/mcp",
            "https://a.example/mcp"
        ));
        assert!(under_prefix(
            "https://a.example/mcp",
            "https://a.example/mcp/x"
        ));
        assert!(under_prefix(
            "https://a.example/mcp/",
            "https://a.example/mcp/x"
        ));
        assert!(!under_prefix(
            "https://a.example/mcp",
            "https://a.example/mcpx"
        ));
        assert!(!under_prefix(
            "https://a.example/mcp",
            "https://a.example.evil/mcp"
        ));
        assert!(!under_prefix(
            "https://a.example/mcp",
            "http://a.example/mcp"
        ));
        for escape in [
            "https://a.example/mcp/../admin",
            "https://a.example/mcp/%2e%2e/admin",
            "https://a.example/mcp/%2E%2E/admin",
            "https://a.example/mcp/./../admin",
            "https://user:pw@a.example/mcp",
            "https://a.example:8443/mcp",
        ] {
            assert!(!under_prefix("https://a.example/mcp", escape), "{escape}");
        }
        assert!(under_prefix(
            "https://a.example/mcp",
            "https://a.example:443/mcp/x?y=1"
        ));
    }

    #[test]
    fn the_allowlist_refuses_what_it_does_not_name() {
        let configured = BTreeMap::from([(
            "fs".to_string(),
            ServerConfig {
                command: Some("true".into()),
                ..ServerConfig::default()
            },
        )]);
        let set = DynamicSet::new(
            vec!["https://a.example/mcp".into(), "fs".into()],
            configured,
            HashSet::new(),
        );
        assert!(set.allowed("x", "https://a.example/mcp/tools").is_ok());
        assert!(
            set.allowed("x", "https://a.example/mcpx")
                .unwrap_err()
                .contains("not allowed")
        );
        assert!(set.allowed("x", "fs").is_ok());
        assert!(
            set.allowed("x", "other")
                .unwrap_err()
                .contains("not allowed")
        );
        let names: Vec<String> = set.current().into_iter().map(|t| t.spec.name).collect();
        assert_eq!(names, ["mcp_connect", "mcp_disconnect"]);
    }
}
