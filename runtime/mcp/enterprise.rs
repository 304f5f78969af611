//! Enterprise-managed authorization (the cross-app access extension, SEP-990): the enterprise's
//! identity provider vouches for the person, so no one signs in to the MCP server's own
//! authorization server.
//!
//! The person's ID token from the identity provider is exchanged there (RFC 8693) for an
//! identity assertion grant (an ID-JAG) naming the MCP server and its authorization server;
//! that authorization server takes the ID-JAG (RFC 7523 `jwt-bearer`) for an access token.
//! rmcp's `auth-enterprise-managed` does both exchanges and checks what comes back; this file
//! finds the authorization server (the same discovery as the other grants) and keeps the
//! token where the others are kept, so a token the server refuses later is exchanged again.

use oauth2::ClientSecret;
use rmcp::transport::AuthorizationManager;
use rmcp::transport::auth::enterprise::{
    EmaAuthorizationServer, EmaClientAuthentication, EmaExchangeRequest,
};
use rmcp::transport::auth::{
    AuthorizationMetadata, CredentialStore, OAuthTokenResponse, StoredCredentials,
    default_oauth_http_client,
};

use super::McpError;
use super::oauth::{AuthConfig, FileStore, auth_failed};

/// How a client authenticates at one of the two token endpoints: with its secret (HTTP Basic),
/// or as a public client.
fn client_auth(secret: Option<&String>) -> EmaClientAuthentication {
    match secret {
        Some(s) => {
            crate::secrets::register(s);
            EmaClientAuthentication::ClientSecretBasic(ClientSecret::new(s.clone()))
        }
        None => EmaClientAuthentication::None,
    }
}

/// Both exchanges for `server` at `url`, whose authorization server's `metadata` `manager` holds;
/// the token is stored and the manager that holds it answered.
pub async fn exchange(
    server: &str,
    url: &str,
    cfg: &AuthConfig,
    mut manager: AuthorizationManager,
    metadata: AuthorizationMetadata,
) -> Result<AuthorizationManager, McpError> {
    let (
        Some(client_id),
        Some(idp_issuer),
        Some(idp_token_endpoint),
        Some(idp_client_id),
        Some(id_token),
    ) = (
        &cfg.client_id,
        &cfg.idp_issuer,
        &cfg.idp_token_endpoint,
        &cfg.idp_client_id,
        &cfg.id_token,
    )
    else {
        unreachable!("checked by AuthConfig::check");
    };
    crate::secrets::register(id_token);
    let issuer = metadata.issuer.clone().ok_or_else(|| {
        auth_failed(
            server,
            "the authorization server's metadata names no issuer, which the ID-JAG must name",
        )
    })?;
    let idp = EmaAuthorizationServer::new(idp_issuer, idp_token_endpoint, idp_client_id)
        .with_client_authentication(client_auth(cfg.idp_client_secret.as_ref()));
    let resource_as =
        EmaAuthorizationServer::new(issuer.clone(), &metadata.token_endpoint, client_id)
            .with_client_authentication(client_auth(cfg.client_secret.as_ref()));
    let http = default_oauth_http_client().map_err(|e| auth_failed(server, e))?;
    let mut request = EmaExchangeRequest::new_with_id_token(idp, resource_as, url, id_token);
    if !cfg.scopes.is_empty() {
        request = request.with_scopes(cfg.scopes.iter().cloned());
    }
    let token = request
        .exchange(&http, &http)
        .await
        .map_err(|e| auth_failed(server, e))?;
    crate::secrets::register(token.access_token.secret());
    let mut body = serde_json::json!({
        "access_token": token.access_token.secret(),
        "token_type": "bearer",
    });
    if let Some(d) = token.expires_in {
        body["expires_in"] = d.as_secs().into();
    }
    let response: OAuthTokenResponse =
        serde_json::from_value(body).map_err(|e| auth_failed(server, format!("the token: {e}")))?;
    let mut scopes: Vec<String> = token.scopes.into_iter().collect();
    scopes.sort();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or_default();
    let store = FileStore::new(server, url);
    store
        .save(
            StoredCredentials::new(client_id.clone(), Some(response), scopes, Some(now))
                .with_issuer(Some(issuer)),
        )
        .await
        .map_err(|e| auth_failed(server, e))?;
    manager.set_credential_store(store);
    match manager.initialize_from_store().await {
        Ok(true) => Ok(manager),
        Ok(false) => Err(auth_failed(server, "the exchanged token was not kept")),
        Err(e) => Err(auth_failed(server, e)),
    }
}
