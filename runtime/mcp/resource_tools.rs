//! A server's resources as read-only tools of a turn (when its spec says `resources = true`),
//! so a model can read what the server offers without a program reading it first.
//!
//! A server that lists a few fixed resources ([`FEW`] or fewer, and no templates) gets one tool
//! each, `<server>__read_<resource>`, taking no arguments: the model sees each resource by name
//! and description. A server that lists more, or templates, gets one
//! `<server>__read_resource{ uri }` whose description lists the URIs (up to [`LISTED`]) and
//! templates. Text comes back as the result's text; binary contents become files attached to
//! the result, as a tool result's embedded resources do ([`super::resources`]).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::Connection;
use super::naming;
use crate::turn::{Handler, ToolDef};

/// The most resources that get a tool each.
pub const FEW: usize = 8;

/// The most URIs the one `read_resource` tool's description lists.
pub const LISTED: usize = 50;

/// How long a read may take (the read itself has its own deadline in [`super::resources`]).
const TIMEOUT: Duration = Duration::from_secs(65);

/// The tools for `conn`'s resources, named so none takes a name in `taken` (which grows); none
/// when the server lists no resources or cannot list them.
pub async fn offer(conn: &Arc<Connection>, taken: &mut HashSet<String>) -> Vec<ToolDef> {
    let listed = match conn.list_resources().await {
        Ok(l) => l,
        Err(e) => {
            tracing::info!(target: "colony::mcp", server = %conn.name(), "no resources offered: {e}");
            return Vec::new();
        }
    };
    // A server without templates may refuse to list them.
    let templates = conn.list_resource_templates().await.unwrap_or_default();
    let text = |v: &Value, k: &str| v.get(k).and_then(Value::as_str).map(str::to_string);
    if listed.is_empty() && templates.is_empty() {
        return Vec::new();
    }
    if templates.is_empty() && listed.len() <= FEW {
        let mut originals = Vec::new();
        let mut by_original = Vec::new();
        for r in &listed {
            let Some(uri) = text(r, "uri") else { continue };
            let name = text(r, "name").unwrap_or_else(|| uri.clone());
            let original = format!("read_{}", naming::sanitize(&name));
            originals.push(original.clone());
            by_original.push((original, uri, r.clone()));
        }
        let (kept, dropped) = naming::assign(conn.name(), &originals, taken);
        for (name, _) in &dropped {
            tracing::info!(target: "colony::mcp", server = %conn.name(), tool = %name,
                "resource tool left out: its name is too long or clashes");
        }
        return kept
            .into_iter()
            .filter_map(|(public, original)| {
                let (_, uri, r) = by_original.iter().find(|(o, _, _)| *o == original)?;
                let mut description =
                    text(r, "description").unwrap_or_else(|| format!("Reads the resource {uri}."));
                if let Some(mime) = text(r, "mimeType") {
                    description.push_str(&format!(" ({mime}, read-only)"));
                }
                Some(reader(
                    conn.clone(),
                    &public,
                    &description,
                    json!({ "type": "object", "properties": {} }),
                    Some(uri.clone()),
                ))
            })
            .collect();
    }
    let public = naming::namespaced(conn.name(), "read_resource");
    if public.chars().count() > naming::MAX_NAME || !taken.insert(public.clone()) {
        tracing::info!(target: "colony::mcp", server = %conn.name(),
            "resource tool left out: read_resource is too long or clashes");
        return Vec::new();
    }
    let mut description = format!(
        "Reads one of the resources of the MCP server {} (read-only) by its URI.",
        conn.name()
    );
    if !listed.is_empty() {
        description.push_str(" It lists:");
        for r in listed.iter().take(LISTED) {
            let uri = text(r, "uri").unwrap_or_default();
            match text(r, "name") {
                Some(n) if n != uri => description.push_str(&format!("\n- {uri} ({n})")),
                _ => description.push_str(&format!("\n- {uri}")),
            }
        }
        if listed.len() > LISTED {
            description.push_str(&format!("\n- and {} more", listed.len() - LISTED));
        }
    }
    if !templates.is_empty() {
        description.push_str("\nURI templates (fill in the braces):");
        for t in templates.iter().take(LISTED) {
            description.push_str(&format!(
                "\n- {}",
                text(t, "uriTemplate").unwrap_or_default()
            ));
        }
    }
    vec![reader(
        conn.clone(),
        &public,
        &description,
        json!({
            "type": "object",
            "properties": { "uri": { "type": "string", "description": "the resource's URI" } },
            "required": ["uri"],
        }),
        None,
    )]
}

/// A tool that reads `fixed`, or the `uri` it is given.
fn reader(
    conn: Arc<Connection>,
    public: &str,
    description: &str,
    schema: Value,
    fixed: Option<String>,
) -> ToolDef {
    let run = move |args: Value| {
        let conn = conn.clone();
        let uri = fixed
            .clone()
            .or_else(|| args.get("uri").and_then(Value::as_str).map(str::to_string));
        async move {
            let Some(uri) = uri else {
                return Err("uri: a string is required".to_string());
            };
            let contents = conn.read_resource(&uri).await.map_err(|e| e.to_string())?;
            let several = contents.len() > 1;
            let mut texts = Vec::new();
            let mut files = Vec::new();
            for c in contents {
                match (c.text, c.file) {
                    (Some(t), _) if several => texts.push(format!("{}:\n{t}", c.uri)),
                    (Some(t), _) => texts.push(t),
                    (None, Some(f)) => {
                        texts.push(format!(
                            "({} is binary{}: attached as {})",
                            c.uri,
                            c.mime_type.map(|m| format!(", {m}")).unwrap_or_default(),
                            f.name
                        ));
                        files.push(f);
                    }
                    (None, None) => texts.push(format!("({} has no contents)", c.uri)),
                }
            }
            Ok((texts.join("\n\n"), files))
        }
    };
    let native: crate::turn::tools::AttachingFn = Arc::new(move |args| Box::pin(run(args)));
    let mut tool = ToolDef::new(
        public,
        description,
        schema,
        Some(TIMEOUT),
        Handler::Attaching(native),
    )
    .expect("an object schema and a sanitised name make a tool");
    // A read changes nothing: one cut off by a restart is read again.
    tool.idempotent = true;
    tool
}
