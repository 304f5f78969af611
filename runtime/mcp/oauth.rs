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
    AuthError, AuthorizationRequest, ClientCredentialsConfig, CredentialStore, OAuthState,
    StoredCredentials,
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
    /// `"authorization_code"` (a person signs in; the default) or `"client_credentials"` (a
    /// service with `client_id` and `client_secret`, no person).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grant: Option<String>,
    /// `"headless"`: colony opens the authorization page itself and takes the redirect, for
    /// authorization servers that approve a registered client without a person (test servers,
    /// pre-consented clients). By default a person signs in (`colony mcp login`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authorize: Option<String>,
}

impl AuthConfig {
    fn client_credentials(&self) -> bool {
        self.grant.as_deref() == Some("client_credentials")
    }

    /// Checks what cannot work, with the field named.
    pub fn check(&self, server: &str) -> Result<(), McpError> {
        match self.grant.as_deref() {
            None | Some("authorization_code") => Ok(()),
            Some("client_credentials")
                if self.client_id.is_some() && self.client_secret.is_some() =>
            {
                Ok(())
            }
            Some("client_credentials") => Err(McpError::Config(format!(
                "server {server}: auth.grant = \"client_credentials\" needs auth.client_id and auth.client_secret"
            ))),
            Some(other) => Err(McpError::Config(format!(
                "server {server}: auth.grant is \"authorization_code\" or \"client_credentials\", not {other:?}"
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
            let client = reqwest::Client::builder()
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
    path: PathBuf,
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

fn auth_failed(server: &str, e: impl std::fmt::Display) -> McpError {
    McpError::Connect {
        server: server.to_string(),
        message: format!("authorization failed: {e}"),
    }
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
    match manager.initialize_from_store().await {
        Ok(true) => Ok(Some(manager)),
        Ok(false) => Ok(None),
        Err(e) => {
            tracing::warn!(target: "colony::mcp", server, "the stored tokens cannot be used ({e}); authorizing again");
            Ok(None)
        }
    }
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
    let mut state = OAuthState::Unauthorized(manager);
    if cfg.client_credentials() {
        let (Some(id), Some(secret)) = (&cfg.client_id, &cfg.client_secret) else {
            unreachable!("checked above");
        };
        crate::secrets::register(secret);
        let config = ClientCredentialsConfig::ClientSecret {
            client_id: id.clone(),
            client_secret: secret.clone(),
            scopes: cfg.scopes.clone(),
            resource: Some(url.to_string()),
        };
        state
            .authenticate_client_credentials(config)
            .await
            .map_err(|e| auth_failed(server, e))?;
    } else {
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
        state
            .start_authorization(req)
            .await
            .map_err(|e| auth_failed(server, e))?;
        let page = state
            .get_authorization_url()
            .await
            .map_err(|e| auth_failed(server, e))?;
        let back = authorizer
            .0
            .authorize(page)
            .await
            .map_err(|e| auth_failed(server, e))?;
        state
            .handle_callback_url(&back)
            .await
            .map_err(|e| auth_failed(server, e))?;
    }
    // The manager saved the tokens into its FileStore as they came.
    state
        .into_authorization_manager()
        .ok_or_else(|| auth_failed(server, "no tokens came back"))
}
