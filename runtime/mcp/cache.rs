//! The tool cache behind `colony tools refresh | list | clear`: every configured server's tools as
//! last listed, so `colony ask` (and the chat client) can offer them without starting every server
//! first. Tools from the cache connect to their server on first call.
//!
//! It is a JSON file beside the config file (`tools-cache.json`), so `COLONY_CONFIG` moves both.
//! It holds no part of a server's config (headers and env may hold secrets), only a fingerprint
//! of it: a server deleted or changed since the cache was made offers nothing until the next
//! refresh, and tools connect with the config as it is now.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::session::ListedTool;
use super::spec::ServerConfig;
use super::{Connection, McpError, ServerSpec, naming, toolset};
use crate::turn::ToolDef;

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Cache {
    pub servers: BTreeMap<String, CachedServer>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CachedServer {
    /// SHA-256 of the server's config when it was listed.
    pub fingerprint: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default)]
    pub tools: Vec<CachedTool>,
    /// Why it could not be listed, if it could not (its `tools` are then those listed before, if
    /// any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CachedTool {
    pub name: String,
    #[serde(default)]
    pub description: String,
    #[serde(rename = "inputSchema")]
    pub input_schema: Value,
}

pub fn path() -> PathBuf {
    crate::config::path().with_file_name("tools-cache.json")
}

/// The cache, or `None` when there is none.
pub fn load() -> Result<Option<Cache>, McpError> {
    let p = path();
    match std::fs::read_to_string(&p) {
        Ok(text) => serde_json::from_str(&text)
            .map(Some)
            .map_err(|e| McpError::Config(format!("{}: {e}", p.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(McpError::Config(format!("{}: {e}", p.display()))),
    }
}

/// The fingerprint of a server's config, as the cache keeps it.
pub fn fingerprint(config: &ServerConfig) -> String {
    let json = serde_json::to_string(config).expect("a server config is JSON");
    crate::files::sha256_hex(json.as_bytes())
}

/// The cached servers whose config is still the one they were listed with, paired with it.
pub fn current<'a>(
    cache: &'a Cache,
    configured: &'a BTreeMap<String, ServerConfig>,
) -> impl Iterator<Item = (&'a String, &'a CachedServer, &'a ServerConfig)> {
    cache.servers.iter().filter_map(|(name, server)| {
        let config = configured.get(name)?;
        (fingerprint(config) == server.fingerprint).then_some((name, server, config))
    })
}

pub fn save(cache: &Cache) -> Result<(), McpError> {
    use std::io::Write;
    let p = path();
    if let Some(dir) = p.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| McpError::Config(format!("{}: {e}", dir.display())))?;
    }
    let text = serde_json::to_string_pretty(cache).expect("the cache is JSON");
    let tmp = p.with_extension("json.tmp");
    let mut options = std::fs::OpenOptions::new();
    // A fresh file (a stale one keeps its mode when opened).
    let _ = std::fs::remove_file(&tmp);
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options
        .open(&tmp)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .and_then(|()| std::fs::rename(&tmp, &p))
        .map_err(|e| McpError::Config(format!("{}: {e}", p.display())))
}

pub fn clear() -> Result<bool, McpError> {
    match std::fs::remove_file(path()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(e) => Err(McpError::Config(format!("{}: {e}", path().display()))),
    }
}

/// Lists every server at once and builds a fresh cache (a server that fails keeps its error).
pub async fn refresh(servers: &BTreeMap<String, ServerConfig>) -> Cache {
    let listed = futures::future::join_all(servers.iter().map(|(name, config)| async move {
        let result = async {
            let conn = Connection::open(config.clone().into_spec(name)?).await?;
            let tools = conn.list_tools().await;
            let version = conn.version().await;
            conn.close().await;
            Ok::<_, McpError>((version, tools?))
        }
        .await;
        (name.clone(), fingerprint(config), result)
    }))
    .await;
    let mut cache = Cache::default();
    for (name, fingerprint, result) in listed {
        let entry = match result {
            Ok((version, tools)) => CachedServer {
                fingerprint,
                version,
                tools: tools
                    .into_iter()
                    .map(|t| CachedTool {
                        name: t.name,
                        description: t.description,
                        input_schema: t.input_schema,
                    })
                    .collect(),
                error: None,
            },
            Err(e) => CachedServer {
                fingerprint,
                version: None,
                tools: Vec::new(),
                error: Some(e.to_string()),
            },
        };
        cache.servers.insert(name, entry);
    }
    cache
}

/// `fresh` with what `previous` knew of a server that could not be listed now: its tools as
/// listed last time, if its config is the same, beside the new error (a server that is down for
/// a minute must not take its tools out of every `colony ask` until the next refresh). The names
/// of the servers kept so.
pub fn keeping_listed(previous: Option<&Cache>, mut fresh: Cache) -> (Cache, Vec<String>) {
    let mut kept = Vec::new();
    let Some(previous) = previous else {
        return (fresh, kept);
    };
    for (name, server) in &mut fresh.servers {
        let Some(old) = previous.servers.get(name) else {
            continue;
        };
        if server.error.is_some() && old.fingerprint == server.fingerprint && !old.tools.is_empty()
        {
            server.tools = old.tools.clone();
            server.version = old.version.clone();
            kept.push(name.clone());
        }
    }
    (fresh, kept)
}

/// The cached tools of the servers still configured as they were, as turn tools named
/// `<server>__<tool>`, and their connections (for shutting them down); each server is connected
/// on the first call of one of its tools. `prepare` finishes each spec first (the front end's
/// elicitor, a sampling use-type wired to the program's core).
pub fn tools(
    cache: &Cache,
    configured: &BTreeMap<String, ServerConfig>,
    prepare: &dyn Fn(ServerSpec) -> ServerSpec,
) -> (Vec<ToolDef>, Vec<Arc<Connection>>) {
    let mut taken = std::collections::HashSet::new();
    let mut out = Vec::new();
    let mut conns = Vec::new();
    for (name, server, config) in current(cache, configured) {
        let Ok(spec) = config.clone().into_spec(name) else {
            continue;
        };
        let conn: Arc<Connection> = Connection::new(prepare(spec));
        conns.push(conn.clone());
        let listed: Vec<ListedTool> = server
            .tools
            .iter()
            .map(|t| ListedTool {
                name: t.name.clone(),
                description: t.description.clone(),
                input_schema: t.input_schema.clone(),
            })
            .collect();
        let names: Vec<String> = listed.iter().map(|t| t.name.clone()).collect();
        let (kept, _) = naming::assign(name, &names, &mut taken);
        for (public, original) in kept {
            let t = listed
                .iter()
                .find(|t| t.name == original)
                .expect("kept from listed");
            out.extend(toolset::tool_def(conn.clone(), &public, t));
        }
    }
    (out, conns)
}
