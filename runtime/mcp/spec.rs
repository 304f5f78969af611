//! What an MCP server is, wherever it was described: the config file's `[mcp.NAME]` tables, a Lua
//! `mcp.connect` argument, a turn's `mcp = {...}` list, or the `mcpServers` object of a Claude
//! Desktop config or a `.mcp.json`.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use super::McpError;

/// How to reach a server.
#[derive(Debug, Clone, PartialEq)]
pub enum Transport {
    /// Streamable HTTP at `url`, with extra headers on every request (a bearer token, say).
    Http {
        url: String,
        headers: BTreeMap<String, String>,
    },
    /// A child process speaking one JSON message a line on stdin/stdout.
    Stdio {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
        cwd: Option<PathBuf>,
    },
    /// A server named in a turn's `mcp` list that cannot be reached as given (a configured
    /// name that is not configured, say): opening it fails with `reason`, so the turn reports
    /// it with the others and goes on.
    Unavailable { reason: String },
}

/// A named server. The name prefixes its tools and labels its log lines.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerSpec {
    pub name: String,
    pub transport: Transport,
    /// What `roots/list` answers (URIs such as `file:///home/me/project`).
    pub roots: Vec<String>,
    /// Who answers the server's `elicitation/create` (none: declined).
    pub elicit: Option<super::elicit::Hook>,
    /// OAuth settings for a remote server (none: the defaults, and tokens only if stored).
    pub auth: Option<super::oauth::Auth>,
    /// Whether a turn offers the server's resources as read-only tools (`resources = true`).
    pub resources: bool,
    /// Which use-type answers the server's `sampling/createMessage` (none: refused).
    pub sampling: Option<super::sampling::Sampling>,
}

/// One server as the config file (and the `mcpServers` files) write it: `url` (with optional
/// `headers`) or `command` (with optional `args`, `env`, `cwd`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub roots: Vec<String>,
    /// `[mcp.NAME.auth]`: OAuth settings for a remote server behind an authorization server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<super::oauth::AuthConfig>,
    /// `resources = true`: a turn offers the server's resources as read-only tools
    /// (`<server>__read_<resource>`, or `<server>__read_resource{ uri }`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<bool>,
    /// `sampling = "helper"`: the server may ask that use-type's model (`sampling/createMessage`);
    /// without it the server's requests are refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sampling: Option<String>,
    /// Claude Desktop and `.mcp.json` write `"type": "http"` / `"stdio"` / `"sse"`; kept so an
    /// imported entry round-trips, and used only to refuse the old SSE transport.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Fields it does not have (`comand`, `timeout`), read to be named: a config's were dropped
    /// without a word. An imported file's are left behind (Claude's `disabled` and the like).
    #[serde(flatten, default, skip_serializing)]
    pub unknown: BTreeMap<String, serde::de::IgnoredAny>,
}

/// The fields of an `[mcp.NAME]` table.
pub const SERVER_FIELDS: &[&str] = &[
    "url",
    "headers",
    "command",
    "args",
    "env",
    "cwd",
    "roots",
    "auth",
    "resources",
    "sampling",
    "type",
];

impl ServerConfig {
    pub fn into_spec(self, name: &str) -> Result<ServerSpec, McpError> {
        let transport = match (self.url, self.command) {
            (Some(_), Some(_)) => {
                return Err(McpError::Config(format!(
                    "server {name}: give a url or a command, not both"
                )));
            }
            (Some(url), None) => {
                if self.kind.as_deref() == Some("sse") {
                    return Err(McpError::Config(format!(
                        "server {name}: the old HTTP+SSE transport is not supported (Streamable HTTP is)"
                    )));
                }
                check_url(name, &url)?;
                if let Some(a) = &self.auth {
                    a.check(name)?;
                }
                Transport::Http {
                    url,
                    headers: self.headers,
                }
            }
            (None, Some(command)) => Transport::Stdio {
                command,
                args: self.args,
                env: self.env,
                cwd: self.cwd.map(PathBuf::from),
            },
            (None, None) => {
                return Err(McpError::Config(format!(
                    "server {name}: needs a url or a command"
                )));
            }
        };
        Ok(ServerSpec {
            name: name.to_string(),
            transport,
            roots: self.roots,
            elicit: None,
            auth: self.auth.map(|config| super::oauth::Auth {
                config,
                authorizer: None,
            }),
            resources: self.resources.unwrap_or(false),
            sampling: self.sampling.map(super::sampling::Sampling::new),
        })
    }
}

impl ServerSpec {
    /// The config-file form of this spec (what `colony mcp add` writes).
    pub fn to_config(&self) -> ServerConfig {
        let mut c = ServerConfig {
            roots: self.roots.clone(),
            auth: self.auth.as_ref().map(|a| a.config.clone()),
            resources: self.resources.then_some(true),
            sampling: self.sampling.as_ref().map(|s| s.use_type.clone()),
            ..ServerConfig::default()
        };
        match &self.transport {
            Transport::Http { url, headers } => {
                c.url = Some(url.clone());
                c.headers = headers.clone();
            }
            Transport::Stdio {
                command,
                args,
                env,
                cwd,
            } => {
                c.command = Some(command.clone());
                c.args = args.clone();
                c.env = env.clone();
                c.cwd = cwd.as_ref().map(|p| p.display().to_string());
            }
            Transport::Unavailable { .. } => {}
        }
        c
    }

    /// A one-line description for listings: the URL, or the command line.
    /// The server as a person reads it (its URL, or its command line), credentials left out: a
    /// key in a URL's query (`?api_key=...`) was printed whole by `colony mcp add` and `list`.
    pub fn describe(&self) -> String {
        let shown = match &self.transport {
            Transport::Http { url, .. } => url.clone(),
            Transport::Stdio { command, args, .. } => std::iter::once(command.as_str())
                .chain(args.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join(" "),
            Transport::Unavailable { reason } => reason.clone(),
        };
        crate::secrets::redact(&shown)
    }
}

fn check_url(name: &str, url: &str) -> Result<(), McpError> {
    match reqwest::Url::parse(url) {
        Ok(u) if u.scheme() == "http" || u.scheme() == "https" => Ok(()),
        Ok(u) => Err(McpError::Config(format!(
            "server {name}: {url} is not an http(s) URL (scheme {})",
            u.scheme()
        ))),
        Err(e) => Err(McpError::Config(format!(
            "server {name}: {url} is not a URL: {e}"
        ))),
    }
}

/// The `mcpServers` object of a Claude Desktop config or a `.mcp.json`, as named configs.
pub fn import_mcp_servers(text: &str) -> Result<BTreeMap<String, ServerConfig>, McpError> {
    let value: serde_json::Value =
        serde_json::from_str(text).map_err(|e| McpError::Config(format!("not JSON: {e}")))?;
    let Some(servers) = value.get("mcpServers").and_then(|v| v.as_object()) else {
        return Err(McpError::Config(
            "no \"mcpServers\" object in the file".into(),
        ));
    };
    let mut out = BTreeMap::new();
    // Every entry is checked before anything is written, and every problem named: only the
    // first was, and each fix met the next one.
    let mut problems = Vec::new();
    for (name, entry) in servers {
        let config: ServerConfig = match serde_json::from_value(entry.clone()) {
            Ok(c) => c,
            Err(e) => {
                problems.push(format!("server {name}: {e}"));
                continue;
            }
        };
        match config.clone().into_spec(name) {
            Ok(_) => {
                out.insert(name.clone(), config);
            }
            Err(e) => problems.push(e.to_string()),
        }
    }
    if !problems.is_empty() {
        return Err(McpError::Config(format!(
            "nothing was imported: {}",
            problems.join("; ")
        )));
    }
    Ok(out)
}

/// The `${VAR}` placeholders an imported entry holds (in its command, arguments, environment,
/// URL or headers), which colony passes on as written: a `.mcp.json` keeps its secrets out
/// that way, and the server got the placeholder's text for its key.
pub fn placeholders(config: &ServerConfig) -> Vec<String> {
    let json = serde_json::to_string(config).unwrap_or_default();
    let mut found = Vec::new();
    let mut rest = json.as_str();
    while let Some(at) = rest.find("${") {
        let tail = &rest[at..];
        let end = tail.find('}').map_or(tail.len(), |e| e + 1);
        let name = tail[..end].to_string();
        if !found.contains(&name) {
            found.push(name);
        }
        rest = &tail[end..];
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imports_claude_desktop_and_mcp_json_entries() {
        let text = r#"{"mcpServers": {
            "fs": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"], "env": {"A": "1"}},
            "docs": {"type": "http", "url": "https://example.org/mcp", "headers": {"Authorization": "Bearer x"}}
        }}"#;
        let servers = import_mcp_servers(text).unwrap();
        let fs = servers["fs"].clone().into_spec("fs").unwrap();
        assert_eq!(
            fs.describe(),
            "npx -y @modelcontextprotocol/server-filesystem /tmp"
        );
        let docs = servers["docs"].clone().into_spec("docs").unwrap();
        assert!(
            matches!(docs.transport, Transport::Http { ref headers, .. } if headers["Authorization"] == "Bearer x")
        );
        let e = import_mcp_servers(
            r#"{"mcpServers": {"old": {"type": "sse", "url": "http://x/sse"}}}"#,
        )
        .unwrap_err();
        assert!(e.to_string().contains("old HTTP+SSE"), "{e}");
        assert!(import_mcp_servers("{}").is_err());
    }

    /// A file with several entries colony cannot take names each, and imports none: only the
    /// first was named, and each run met the next.
    #[test]
    fn every_entry_that_cannot_be_imported_is_named() {
        let e = import_mcp_servers(
            r#"{"mcpServers": {
                "good": {"command": "srv"},
                "old": {"type": "sse", "url": "http://x/sse"},
                "nocmd": {"env": {"A": "1"}}
            }}"#,
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("nothing was imported"), "{e}");
        assert!(e.contains("old HTTP+SSE"), "{e}");
        assert!(e.contains("nocmd"), "{e}");
    }

    /// `${VAR}` placeholders are found wherever an entry holds them, each named once.
    #[test]
    fn placeholders_are_found_in_env_headers_and_urls() {
        let servers = import_mcp_servers(
            r#"{"mcpServers": {
                "a": {"command": "srv", "env": {"T": "${MY_TOKEN}", "U": "${MY_TOKEN}"}},
                "b": {"url": "http://h/mcp", "headers": {"Authorization": "Bearer ${API_KEY}"}},
                "c": {"command": "srv", "args": ["--plain"]}
            }}"#,
        )
        .unwrap();
        assert_eq!(placeholders(&servers["a"]), ["${MY_TOKEN}"]);
        assert_eq!(placeholders(&servers["b"]), ["${API_KEY}"]);
        assert!(placeholders(&servers["c"]).is_empty());
    }
}
