//! OAuth 2.1 protected-resource metadata for `/mcp` (RFC 9728, as the MCP authorization
//! specification asks): with `[serve] authorization_servers` set, `GET
//! /.well-known/oauth-protected-resource` (and its path form for `/mcp`,
//! `/.well-known/oauth-protected-resource/mcp`) names the authorization servers, and a `401` on
//! `/mcp` points to it (`WWW-Authenticate: Bearer resource_metadata="..."`), so a client can
//! find where to sign in.
//!
//! colony publishes the metadata only: it does not validate tokens those servers issue (no
//! introspection, no JWT checks). `/mcp` admits the bearer tokens of serve's token file, as
//! before; an operator who wants OAuth-issued tokens accepted puts a proxy that checks them in
//! front (README, "colony as an MCP server").

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;

use super::Service;
use super::refusal::refuse;
use crate::config::ServeConfig;

/// Where the metadata is, under the service's origin.
const WELL_KNOWN: &str = "/.well-known/oauth-protected-resource";

/// The metadata's two routes.
pub fn routes() -> Router<Arc<Service>> {
    Router::new()
        .route(WELL_KNOWN, get(metadata))
        .route(&format!("{WELL_KNOWN}/mcp"), get(metadata))
}

/// `[serve]` as it is now (the config is read again when its file changes).
fn settings(service: &Service) -> ServeConfig {
    service.core().config().serve.clone().unwrap_or_default()
}

/// The resource's URL: `[serve] resource_url`, else `/mcp` under the `Host` the request was
/// sent to (plain HTTP; set `resource_url` behind a proxy that adds TLS).
fn resource(settings: &ServeConfig, headers: &HeaderMap) -> String {
    if let Some(url) = &settings.resource_url {
        return url.clone();
    }
    let host = headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("localhost");
    format!("http://{host}/mcp")
}

/// The metadata URL of `resource` (RFC 9728 section 3.1: the well-known path goes between the
/// host and the resource's path).
fn metadata_url(resource: &str) -> String {
    match url::Url::parse(resource) {
        Ok(u) => {
            let origin = u.origin().ascii_serialization();
            let path = u.path().trim_end_matches('/');
            format!("{origin}{WELL_KNOWN}{path}")
        }
        Err(_) => format!("{resource}{WELL_KNOWN}"),
    }
}

async fn metadata(State(service): State<Arc<Service>>, headers: HeaderMap) -> Response {
    let settings = settings(&service);
    if settings.authorization_servers.is_empty() {
        return refuse(
            StatusCode::NOT_FOUND,
            "not_found",
            "no authorization server is configured ([serve] authorization_servers)",
        );
    }
    let mut doc = json!({
        "resource": resource(&settings, &headers),
        "authorization_servers": settings.authorization_servers,
        "bearer_methods_supported": ["header"],
        "resource_name": "colony",
    });
    if !settings.scopes.is_empty() {
        doc["scopes_supported"] = json!(settings.scopes);
    }
    axum::Json(doc).into_response()
}

/// The `WWW-Authenticate` of a `401` on `/mcp`: `Bearer`, with `resource_metadata` when an
/// authorization server is configured.
pub fn challenge(service: &Service, headers: &HeaderMap) -> HeaderValue {
    let settings = settings(service);
    if settings.authorization_servers.is_empty() {
        return HeaderValue::from_static("Bearer");
    }
    let url = metadata_url(&resource(&settings, headers));
    HeaderValue::from_str(&format!("Bearer resource_metadata=\"{url}\""))
        .unwrap_or_else(|_| HeaderValue::from_static("Bearer"))
}

/// Checks `[serve] authorization_servers` and `resource_url` when the service starts: each an
/// absolute `https` URL (`http` only for a loopback host). `Err` names the value.
pub fn check(settings: &ServeConfig) -> Result<(), String> {
    let named = settings
        .authorization_servers
        .iter()
        .map(|u| ("authorization_servers", u))
        .chain(settings.resource_url.iter().map(|u| ("resource_url", u)));
    for (key, value) in named {
        let url = url::Url::parse(value)
            .map_err(|e| format!("[serve] {key}: {value:?} is not a URL ({e})"))?;
        let loopback = matches!(url.host_str(), Some("localhost" | "127.0.0.1" | "[::1]"));
        if url.scheme() != "https" && !(url.scheme() == "http" && loopback) {
            return Err(format!(
                "[serve] {key}: {value:?} must be an https URL (http only for localhost)"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_metadata_sits_between_the_host_and_the_path() {
        assert_eq!(
            metadata_url("https://colony.example/mcp"),
            "https://colony.example/.well-known/oauth-protected-resource/mcp"
        );
        assert_eq!(
            metadata_url("http://127.0.0.1:7878/mcp/"),
            "http://127.0.0.1:7878/.well-known/oauth-protected-resource/mcp"
        );
    }

    #[test]
    fn authorization_servers_are_https_urls() {
        let with = |servers: &[&str]| ServeConfig {
            authorization_servers: servers.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        };
        assert!(check(&with(&["https://auth.example"])).is_ok());
        assert!(check(&with(&["http://localhost:9000"])).is_ok());
        let e = check(&with(&["http://auth.example"])).unwrap_err();
        assert!(
            e.contains("authorization_servers") && e.contains("https"),
            "{e}"
        );
        let e = check(&with(&["auth.example"])).unwrap_err();
        assert!(e.contains("not a URL"), "{e}");
    }
}
