//! OAuth 2.1 for remote servers, on rmcp's `auth` feature.
//!
//! rmcp does the protocol: discovery from the server's `401` challenge (protected-resource
//! metadata, then authorization-server metadata, with the 2025-03-26 fallbacks), the choice of
//! client (pre-registered, client ID metadata document, dynamic registration), PKCE, scope
//! selection, the token exchange, client credentials, and refreshing a token the server refuses.
//! Around it, this file adds what rmcp leaves to its user:
//!
//! - where tokens live: `<state home>/colony/mcp-auth/<server>-<hash of its URL>.json`, mode
//!   0600 in a 0700 folder, shared by every program that names the server; never logged (each
//!   token is registered as a secret before it is used);
//! - who sends the person to the authorization page: an [`Authorizer`] (`colony mcp login`'s
//!   loopback listener and browser, or a program's `on_authorize` hook); without one, a server
//!   that needs authorization fails with the command that gives it;
//! - the `[mcp.NAME.auth]` settings ([`AuthConfig`]).

use std::path::PathBuf;
use std::sync::Arc;

use futures::future::BoxFuture;
use rmcp::transport::AuthorizationManager;
use rmcp::transport::auth::{
    AuthError, AuthorizationMetadata, AuthorizationRequest, AuthorizationSession,
    ClientCredentialsConfig, CredentialStore, JwtSigningAlgorithm, StoredCredentials,
};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{McpError, naming};

/// `[mcp.NAME.auth]`: how colony identifies itself to the server's authorization server. All
/// optional: with none, colony registers itself (dynamic client registration) and lets the
/// server's metadata choose the scopes.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// A client registered beforehand with the authorization server.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
    /// The HTTPS URL of colony's client ID metadata document, where the server supports them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_metadata_url: Option<String>,
    /// The name colony registers under (`colony`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_name: Option<String>,
    /// The scopes to ask for (default: those the server's challenge or metadata name).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scopes: Vec<String>,
    /// `"authorization_code"` (a person signs in; the default), `"client_credentials"` (a
    /// service with `client_id` and `client_secret` or `private_key`, no person) or
    /// `"enterprise"` (the enterprise's identity provider vouches for the person: its ID token
    /// is exchanged for an ID-JAG, which the server's authorization server takes for a token).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<String>,
    /// For `client_credentials` without a secret: the client's private key (PEM), with which
    /// colony signs a JWT assertion for each token request (RFC 7523 `private_key_jwt`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub private_key: Option<String>,
    /// The private key's algorithm: `"RS256"`, `"RS384"`, `"RS512"`, `"ES256"` or `"ES384"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signing_algorithm: Option<String>,
    /// For `enterprise`: the identity provider (its issuer, token endpoint and the client
    /// colony is registered as there, with a secret if it has one) and the person's ID token
    /// from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idp_issuer: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idp_token_endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idp_client_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idp_client_secret: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id_token: Option<String>,
    /// `"headless"`: colony opens the authorization page itself and takes the redirect, for
    /// authorization servers that approve a registered client without a person (test servers,
    /// pre-consented clients). By default a person signs in (`colony mcp login`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authorize: Option<String>,
}

impl AuthConfig {
    /// Checks what cannot work, with the field named.
    pub fn check(&self, server: &str) -> Result<(), McpError> {
        let missing = |grant: &str, fields: &[(&str, bool)]| {
            let absent: Vec<String> = fields
                .iter()
                .filter(|(_, present)| !present)
                .map(|(f, _)| format!("auth.{f}"))
                .collect();
            if absent.is_empty() {
                Ok(())
            } else {
                Err(McpError::Config(format!(
                    "server {server}: auth.grant = \"{grant}\" needs {}",
                    absent.join(" and ")
                )))
            }
        };
        match self.grant.as_deref() {
            None | Some("authorization_code") => Ok(()),
            Some("client_credentials") => {
                missing(
                    "client_credentials",
                    &[("client_id", self.client_id.is_some())],
                )?;
                match (&self.client_secret, &self.private_key) {
                    (Some(_), Some(_)) => Err(McpError::Config(format!(
                        "server {server}: auth.client_secret and auth.private_key are two ways to authenticate a client: give one"
                    ))),
                    (None, None) => Err(McpError::Config(format!(
                        "server {server}: auth.grant = \"client_credentials\" needs auth.client_secret or auth.private_key"
                    ))),
                    (None, Some(_)) => self.algorithm(server).map(|_| ()),
                    (Some(_), None) => Ok(()),
                }
            }
            Some("enterprise") => missing(
                "enterprise",
                &[
                    ("client_id", self.client_id.is_some()),
                    ("idp_issuer", self.idp_issuer.is_some()),
                    ("idp_token_endpoint", self.idp_token_endpoint.is_some()),
                    ("idp_client_id", self.idp_client_id.is_some()),
                    ("id_token", self.id_token.is_some()),
                ],
            ),
            Some(other) => Err(McpError::Config(format!(
                "server {server}: auth.grant is \"authorization_code\", \"client_credentials\" or \"enterprise\", not {other:?}"
            ))),
        }?;
        match self.authorize.as_deref() {
            None | Some("headless") => Ok(()),
            Some(other) => Err(McpError::Config(format!(
                "server {server}: auth.authorize is \"headless\" or left out, not {other:?}"
            ))),
        }
    }
}

impl AuthConfig {
    /// `signing_algorithm`, which a `private_key` needs.
    fn algorithm(&self, server: &str) -> Result<JwtSigningAlgorithm, McpError> {
        match self.signing_algorithm.as_deref() {
            Some("RS256") => Ok(JwtSigningAlgorithm::RS256),
            Some("RS384") => Ok(JwtSigningAlgorithm::RS384),
            Some("RS512") => Ok(JwtSigningAlgorithm::RS512),
            Some("ES256") => Ok(JwtSigningAlgorithm::ES256),
            Some("ES384") => Ok(JwtSigningAlgorithm::ES384),
            None => Err(McpError::Config(format!(
                "server {server}: auth.private_key needs auth.signing_algorithm (\"RS256\", \"RS384\", \"RS512\", \"ES256\" or \"ES384\")"
            ))),
            Some(other) => Err(McpError::Config(format!(
                "server {server}: auth.signing_algorithm is \"RS256\", \"RS384\", \"RS512\", \"ES256\" or \"ES384\", not {other:?}"
            ))),
        }
    }
}

/// Who sends the person (or a program) to the authorization page.
pub trait Authorizer: Send + Sync {
    /// Where the authorization server sends the browser back (a loopback URL).
    fn redirect_uri(&self) -> String;
    /// Opens (or fetches) `url` and answers the URL the authorization server redirected to
    /// (with its `code` and `state`).
    fn authorize(&self, url: String) -> BoxFuture<'static, Result<String, String>>;
}

/// The authorizer of `authorize = "headless"`: fetches the authorization page without following
/// its redirect, whose target is the answer.
pub struct Headless;

impl Authorizer for Headless {
    fn redirect_uri(&self) -> String {
        "http://127.0.0.1/callback".into()
    }

    fn authorize(&self, url: String) -> BoxFuture<'static, Result<String, String>> {
        Box::pin(async move {
            let client = crate::tls::client_builder()
                .redirect(reqwest::redirect::Policy::none())
                .timeout(std::time::Duration::from_secs(30))
                .build()
                .map_err(|e| e.to_string())?;
            let resp = client.get(&url).send().await.map_err(|e| e.to_string())?;
            let status = resp.status();
            resp.headers()
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
                .ok_or_else(|| {
                    format!("the authorization page answered {status} without sending us back (it needs a person: colony mcp login)")
                })
        })
    }
}

/// A shared authorizer in a [`super::ServerSpec`]'s [`Auth`].
#[derive(Clone)]
pub struct AuthorizerHook(pub Arc<dyn Authorizer>);

impl PartialEq for AuthorizerHook {
    fn eq(&self, other: &AuthorizerHook) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl std::fmt::Debug for AuthorizerHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AuthorizerHook")
    }
}

/// A server's OAuth settings and its authorizer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Auth {
    pub config: AuthConfig,
    pub authorizer: Option<AuthorizerHook>,
}

/// Where the tokens for `server` at `url` are kept.
pub fn token_path(server: &str, url: &str) -> PathBuf {
    let digest = Sha256::digest(url.as_bytes());
    let hex: String = digest.iter().take(6).map(|b| format!("{b:02x}")).collect();
    crate::store::state_dir::state_home()
        .join("colony")
        .join("mcp-auth")
        .join(format!("{}-{hex}.json", naming::sanitize(server)))
}

/// The tokens of one server in their file (the folder 0700, the file 0600).
#[derive(Clone)]
pub struct FileStore {
    pub(super) path: PathBuf,
}

impl FileStore {
    pub fn new(server: &str, url: &str) -> FileStore {
        FileStore {
            path: token_path(server, url),
        }
    }

    fn write(&self, text: &str) -> std::io::Result<()> {
        let dir = self.path.parent().expect("a token path has a folder");
        std::fs::create_dir_all(dir)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
        }
        let tmp = self.path.with_extension("json.tmp");
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        {
            use std::io::Write;
            let mut f = opts.open(&tmp)?;
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
        }
        std::fs::rename(&tmp, &self.path)
    }
}

fn store_error(e: impl std::fmt::Display) -> AuthError {
    AuthError::InternalError(format!("the token file: {e}"))
}

#[async_trait::async_trait]
impl CredentialStore for FileStore {
    async fn load(&self) -> Result<Option<StoredCredentials>, AuthError> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(store_error(format!("{}: {e}", self.path.display()))),
        };
        let creds: StoredCredentials = serde_json::from_str(&text)
            .map_err(|e| store_error(format!("{}: {e}", self.path.display())))?;
        register_secrets(&creds);
        Ok(Some(creds))
    }

    async fn save(&self, credentials: StoredCredentials) -> Result<(), AuthError> {
        register_secrets(&credentials);
        let text = serde_json::to_string_pretty(&credentials).map_err(store_error)?;
        self.write(&text)
            .map_err(|e| store_error(format!("{}: {e}", self.path.display())))
    }

    async fn clear(&self) -> Result<(), AuthError> {
        match std::fs::remove_file(&self.path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(store_error(e)),
            _ => Ok(()),
        }
    }
}

/// The access and refresh tokens are secrets: scrubbed from every log and error from now on.
fn register_secrets(creds: &StoredCredentials) {
    if let Some(t) = &creds.token_response {
        let json = serde_json::to_value(t).unwrap_or_default();
        for key in ["access_token", "refresh_token", "id_token"] {
            if let Some(s) = json.get(key).and_then(|v| v.as_str()) {
                crate::secrets::register(s);
            }
        }
    }
}

pub(super) fn auth_failed(server: &str, e: impl std::fmt::Display) -> McpError {
    McpError::Connect {
        server: server.to_string(),
        message: format!("authorization failed: {}", without_repeats(&e.to_string())),
    }
}

/// rmcp's auth errors nest their causes, each adding its own words: "Registration failed:
/// Dynamic registration failed: Registration failed: HTTP 401 Unauthorized: ". Each part is
/// said once, and an empty last one (a body that was empty) is left out.
fn without_repeats(text: &str) -> String {
    let mut kept: Vec<&str> = Vec::new();
    for part in text.split(": ").map(str::trim) {
        let part = part.trim_end_matches(':').trim();
        if part.is_empty() || kept.iter().any(|k| k.eq_ignore_ascii_case(part)) {
            continue;
        }
        kept.push(part);
    }
    kept.join(": ")
}

/// The manager for `url` with the server's stored tokens, when there are any.
pub async fn stored(server: &str, url: &str) -> Result<Option<AuthorizationManager>, McpError> {
    let store = FileStore::new(server, url);
    if !store.path.exists() {
        return Ok(None);
    }
    let mut manager = AuthorizationManager::new(url)
        .await
        .map_err(|e| auth_failed(server, e))?;
    manager.set_credential_store(store);
    if let Err(e) = discover(server, url, &mut manager, None).await {
        tracing::warn!(target: "colony::mcp", server, "the stored tokens cannot be used ({e}); authorizing again");
        return Ok(None);
    }
    match manager.initialize_from_store().await {
        Ok(true) => Ok(Some(manager)),
        Ok(false) => Ok(None),
        Err(e) => {
            tracing::warn!(target: "colony::mcp", server, "the stored tokens cannot be used ({e}); authorizing again");
            Ok(None)
        }
    }
}

/// Finds the server's authorization server (from its `challenge`, its protected-resource
/// metadata, its own authorization-server metadata, or the 2025-03-26 default endpoints) and
/// gives its metadata to `manager`.
///
/// rmcp holds the metadata's `issuer` to the URL it was fetched for (RFC 8414 section 3.3).
/// One case is let through: a 2025-03-26 server serves its authorization server's metadata at
/// the root of its own origin, and some name an issuer with a path there (`https://host/oauth`
/// for `https://host/.well-known/oauth-authorization-server`). The check is there against
/// mix-ups between authorization servers; an issuer on the same origin as the metadata and the
/// MCP server is the same party, so that metadata is taken. An issuer on another origin is
/// still refused.
async fn discover(
    server: &str,
    url: &str,
    manager: &mut AuthorizationManager,
    challenge: Option<&str>,
) -> Result<AuthorizationMetadata, McpError> {
    let metadata = match manager.resolve_metadata_from_challenge(challenge).await {
        Ok(resolution) => resolution.metadata,
        Err(AuthError::AuthorizationServerMismatch {
            expected_issuer,
            received_issuer,
        }) => same_origin_metadata(url, &expected_issuer, &received_issuer)
            .await
            .ok_or_else(|| {
                auth_failed(
                    server,
                    format!("the authorization server's metadata names the issuer {received_issuer}, not {expected_issuer}"),
                )
            })?,
        Err(e) => return Err(auth_failed(server, e)),
    };
    manager.set_metadata(metadata.clone());
    Ok(metadata)
}

/// The origin (`scheme://host:port`) of a URL.
fn origin(url: &str) -> Option<String> {
    let u = url::Url::parse(url).ok()?;
    Some(u.origin().ascii_serialization())
}

/// The metadata at the root of the MCP server's origin, when both the issuer expected there
/// and the one it names are on that origin (see [`discover`]).
async fn same_origin_metadata(
    url: &str,
    expected: &str,
    received: &str,
) -> Option<AuthorizationMetadata> {
    let home = origin(url)?;
    if origin(expected)? != home || origin(received)? != home {
        return None;
    }
    // Only the root metadata of the server's own origin is expected at the origin itself.
    if expected.trim_end_matches('/') != home {
        return None;
    }
    let client = crate::tls::client_builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(std::time::Duration::from_secs(30))
        .build()
        .ok()?;
    let resp = client
        .get(format!("{home}/.well-known/oauth-authorization-server"))
        .send()
        .await
        .ok()?;
    if !resp.status().is_success() {
        return None;
    }
    let metadata: AuthorizationMetadata = resp.json().await.ok()?;
    (metadata.issuer.as_deref() == Some(received)).then_some(metadata)
}

/// Obtains tokens for `server` at `url` (after its `challenge`, the `WWW-Authenticate` of its 401
/// or 403), stores them and answers the manager that holds them.
pub async fn authorize(
    server: &str,
    url: &str,
    auth: &Auth,
    challenge: Option<&str>,
) -> Result<AuthorizationManager, McpError> {
    let cfg = &auth.config;
    cfg.check(server)?;
    let mut manager = AuthorizationManager::new(url)
        .await
        .map_err(|e| auth_failed(server, e))?;
    manager.set_credential_store(FileStore::new(server, url));
    let metadata = discover(server, url, &mut manager, challenge).await?;
    match cfg.grant.as_deref() {
        Some("client_credentials") => client_credentials(server, url, cfg, manager).await,
        Some("enterprise") => {
            super::enterprise::exchange(server, url, cfg, manager, metadata).await
        }
        _ => authorization_code(server, auth, manager, challenge).await,
    }
}

/// A service's own credentials (a secret, or a JWT signed with its private key) for a token.
async fn client_credentials(
    server: &str,
    url: &str,
    cfg: &AuthConfig,
    manager: AuthorizationManager,
) -> Result<AuthorizationManager, McpError> {
    let Some(id) = &cfg.client_id else {
        unreachable!("checked by AuthConfig::check");
    };
    let config = match (&cfg.client_secret, &cfg.private_key) {
        (Some(secret), _) => {
            crate::secrets::register(secret);
            ClientCredentialsConfig::ClientSecret {
                client_id: id.clone(),
                client_secret: secret.clone(),
                scopes: cfg.scopes.clone(),
                resource: Some(url.to_string()),
            }
        }
        (None, Some(key)) => {
            crate::secrets::register(key);
            ClientCredentialsConfig::PrivateKeyJwt {
                client_id: id.clone(),
                signing_key: key.as_bytes().to_vec(),
                signing_algorithm: cfg.algorithm(server)?,
                token_endpoint_audience: None,
                scopes: cfg.scopes.clone(),
                resource: Some(url.to_string()),
            }
        }
        (None, None) => unreachable!("checked by AuthConfig::check"),
    };
    let mut manager = manager;
    manager
        .validate_client_credentials_metadata(&config)
        .and_then(|()| manager.configure_client_credentials(&config))
        .map_err(|e| auth_failed(server, e))?;
    // The manager saves the token into its FileStore as it comes. rmcp's future for the JWT
    // request holds a form serializer that is not `Sync` across an await, so it is not `Send`:
    // it runs to its end on a runtime of its own, on a blocking thread.
    let server_name = server.to_string();
    tokio::task::spawn_blocking(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| auth_failed(&server_name, e))?;
        rt.block_on(manager.exchange_client_credentials(&config))
            .map_err(|e| auth_failed(&server_name, e))?;
        Ok(manager)
    })
    .await
    .map_err(|e| auth_failed(server, e))?
}

/// A person signs in (or a headless authorizer takes the redirect): PKCE, the code, the token.
async fn authorization_code(
    server: &str,
    auth: &Auth,
    manager: AuthorizationManager,
    challenge: Option<&str>,
) -> Result<AuthorizationManager, McpError> {
    let cfg = &auth.config;
    let headless = AuthorizerHook(Arc::new(Headless));
    let chosen = match (&auth.authorizer, cfg.authorize.as_deref()) {
        (Some(a), _) => Some(a),
        (None, Some("headless")) => Some(&headless),
        (None, _) => None,
    };
    let Some(authorizer) = chosen else {
        return Err(McpError::Connect {
            server: server.to_string(),
            message: format!(
                "the server needs authorization: run `colony mcp login {server}` (or give mcp.connect an auth.on_authorize hook)"
            ),
        });
    };
    let mut req = AuthorizationRequest::new(authorizer.0.redirect_uri())
        .with_client_name(cfg.client_name.clone().unwrap_or_else(|| "colony".into()));
    if let Some(m) = &cfg.client_metadata_url {
        req = req.with_client_metadata_url(m.clone());
    }
    if let Some(id) = &cfg.client_id {
        req = req.with_preregistered_client(id.clone());
    }
    if let Some(s) = &cfg.client_secret {
        crate::secrets::register(s);
        req = req.with_client_secret(s.clone());
    }
    if !cfg.scopes.is_empty() {
        req = req.with_scopes(cfg.scopes.iter().cloned());
    }
    if let Some(ch) = challenge {
        req = req.with_challenge(ch.to_string());
    }
    let session = AuthorizationSession::new(manager, req)
        .await
        .map_err(|(_, e)| auth_failed(server, e))?;
    let back = authorizer
        .0
        .authorize(session.get_authorization_url().to_string())
        .await
        .map_err(|e| auth_failed(server, e))?;
    // The manager saves the tokens into its FileStore as they come.
    session
        .handle_callback_url(&back)
        .await
        .map_err(|e| auth_failed(server, e))?;
    Ok(session.auth_manager)
}

#[cfg(test)]
mod tests {

    #[test]
    fn nested_auth_errors_say_each_part_once() {
        assert_eq!(
            without_repeats(
                "Registration failed: Dynamic registration failed: Registration failed: HTTP \
                 401 Unauthorized: "
            ),
            "Registration failed: Dynamic registration failed: HTTP 401 Unauthorized"
        );
        assert_eq!(without_repeats("no metadata"), "no metadata");
    }

    use super::*;

    #[tokio::test]
    async fn an_issuer_on_another_origin_is_refused_before_anything_is_fetched() {
        // Port 9 (discard) is never asked: each of these is refused on the URLs alone.
        let mcp = "http://127.0.0.1:9/mcp";
        for (expected, received) in [
            ("http://127.0.0.1:9", "http://evil.example/oauth"),
            ("http://127.0.0.1:9", "https://127.0.0.1:9/oauth"),
            ("http://127.0.0.1:9/tenant", "http://127.0.0.1:9/oauth"),
            ("http://other.example", "http://other.example/oauth"),
        ] {
            assert!(
                same_origin_metadata(mcp, expected, received)
                    .await
                    .is_none(),
                "{expected} / {received}"
            );
        }
    }

    fn cfg(grant: &str) -> AuthConfig {
        AuthConfig {
            grant: Some(grant.into()),
            ..AuthConfig::default()
        }
    }

    #[test]
    fn each_grant_names_the_fields_it_lacks() {
        let err = |c: AuthConfig| c.check("docs").unwrap_err().to_string();
        assert_eq!(
            err(cfg("client_credentials")),
            "server docs: auth.grant = \"client_credentials\" needs auth.client_id"
        );
        let mut c = cfg("client_credentials");
        c.client_id = Some("svc".into());
        assert_eq!(
            err(c.clone()),
            "server docs: auth.grant = \"client_credentials\" needs auth.client_secret or auth.private_key"
        );
        c.private_key = Some("-----BEGIN PRIVATE KEY-----".into());
        assert!(err(c.clone()).contains("auth.private_key needs auth.signing_algorithm"));
        c.signing_algorithm = Some("HS256".into());
        assert!(err(c.clone()).ends_with("not \"HS256\""));
        c.signing_algorithm = Some("ES256".into());
        assert!(c.check("docs").is_ok());
        c.client_secret = Some("s".into());
        assert!(err(c).contains("give one"));
        assert_eq!(
            err(cfg("enterprise")),
            "server docs: auth.grant = \"enterprise\" needs auth.client_id and auth.idp_issuer and auth.idp_token_endpoint and auth.idp_client_id and auth.id_token"
        );
        assert!(err(cfg("password")).ends_with("not \"password\""));
    }
}
