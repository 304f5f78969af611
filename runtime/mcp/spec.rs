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
}

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
    pub fn describe(&self) -> String {
        match &self.transport {
            Transport::Http { url, .. } => url.clone(),
            Transport::Stdio { command, args, .. } => std::iter::once(command.as_str())
                .chain(args.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join(" "),
            Transport::Unavailable { reason } => reason.clone(),
        }
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
    for (name, entry) in servers {
        let config: ServerConfig = serde_json::from_value(entry.clone())
            .map_err(|e| McpError::Config(format!("server {name}: {e}")))?;
        // Checked now, so a bad entry is refused before anything is written.
        config.clone().into_spec(name)?;
        out.insert(name.clone(), config);
    }
    Ok(out)
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
}
