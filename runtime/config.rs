//! Settings by use-type: what is asked (`chat`, `code`, `helper`, `general`), not who answers.
//!
//! The config file is TOML at `$XDG_CONFIG_HOME/colony/config.toml` (`COLONY_CONFIG` overrides):
//!
//! ```toml
//! [use.general]
//! provider = "anthropic"
//! model = "claude-sonnet-4-5"
//!
//! [use.code]
//! provider = "openai"
//! key_env = "WORK_OPENAI_KEY"
//!
//! [mcp.docs]                          # MCP servers by name (`colony mcp add`)
//! url = "https://example.org/mcp"
//! ```
//!
//! A setting resolves in this order: the call's overrides, the use-type's table (falling back to
//! `general` when the use-type has none), the environment (`ANTHROPIC_API_KEY`, `*_BASE_URL`, ...),
//! then the catalogue default. Resolution runs for every request, so a key rotated in the
//! environment or the file lands mid-run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::providers::catalogue::{self, CatalogueEntry};
use crate::providers::{Endpoint, ProviderError, ToolsLevel};
use crate::secrets;

mod layout;

/// Why a use-type's `timeout = 0` is refused: every call would time out at once (a reader may
/// take 0 for "no timeout"; a call's own `timeout = 0` is an immediate one, as any duration's).
const ZERO_TIMEOUT: &str = "must be more than 0 seconds (0 would end every call at once)";

/// One use-type's table.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UseConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// The key itself. Prefer `key_env`; a file holding a key is written with mode 0600.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
    /// The environment variable to read the key from, instead of the provider's usual one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key_env: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub base_url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tokens: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    /// Seconds before a model call is abandoned (default 600).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<f64>,
    /// The most of a model's answer read, in bytes (default 64 MiB); past it a call fails with
    /// a `fetch_error` naming the limit, instead of reading an endless body into memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_response_bytes: Option<u64>,
    /// `native`, `text` or `none`: overrides the catalogue's tools level.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<String>,
    /// Whether the model reads images (an OpenAI-compatible vision model): attached images
    /// go as `image_url` data instead of a note. Overrides the catalogue's entry.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub images: Option<bool>,
    /// The most model calls in flight at once to this use-type's provider host (default
    /// [`crate::providers::DEFAULT_MAX_CONCURRENT_CALLS`]); more wait their turn in order.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_concurrent_calls: Option<usize>,
}

/// The fields `colony config set` accepts, in the order `list` shows them.
pub const FIELDS: &[&str] = &[
    "provider",
    "model",
    "key",
    "key_env",
    "base_url",
    "max_tokens",
    "temperature",
    "timeout",
    "max_response_bytes",
    "tools",
    "images",
    "max_concurrent_calls",
];

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default, rename = "use")]
    pub uses: BTreeMap<String, UseConfig>,
    /// MCP servers by name (`[mcp.docs] url = "..."`, `[mcp.fs] command = "..."`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub mcp: BTreeMap<String, crate::mcp::spec::ServerConfig>,
    /// What `colony serve` runs when it is given no files, and where it listens.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serve: Option<ServeConfig>,
    /// Per-model prices for cost budgets (`[prices.models."gpt-4.1-mini"] input = 0.4`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prices: Option<crate::residents::budget_prices::Prices>,
    /// Rate limits per tool, for all tool calls, and per `colony serve` caller (`[rate]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate: Option<crate::rate::RateConfig>,
    /// Where programs keep their state (`[store] url = "postgres://..."`; default: SQLite in
    /// each program's state directory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store: Option<StoreConfig>,
}

/// `[store]`: `url = "postgres://USER@HOST:PORT/DATABASE"` keeps every program's state in that
/// PostgreSQL database instead of its state directory (`--store URL` overrides it);
/// `keep_audit = "90d"` removes audit lines older than that while a program runs (the log
/// grows with every tool call otherwise; kept whole by default).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoreConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_audit: Option<String>,
}

impl Config {
    /// How long audit lines are kept (`[store] keep_audit`), when a limit is set and reads.
    pub fn keep_audit(&self) -> Option<std::time::Duration> {
        let text = self.store.as_ref()?.keep_audit.as_deref()?;
        keep_duration(text).ok()
    }
}

/// A keep: a duration as [`crate::duration::parse`] reads it, or a number of days past its
/// one-year maximum (`"2555d"`, seven years, as audit rules ask), up to a hundred years.
fn keep_duration(text: &str) -> Result<std::time::Duration, String> {
    match crate::duration::parse(text) {
        Err(crate::duration::DurationError::TooLong(_)) => {
            let days: f64 = text
                .trim()
                .strip_suffix('d')
                .and_then(|d| d.trim().parse().ok())
                .ok_or_else(|| format!("{text:?}: past a year, write it in days (\"730d\")"))?;
            if days > 36_500.0 {
                return Err(format!("{text:?} is more than a hundred years"));
            }
            Ok(std::time::Duration::from_secs_f64(days * 86_400.0))
        }
        other => other.map_err(|e| e.to_string()),
    }
}

/// `[serve]`: `listen = "127.0.0.1:7878"`, `token_file = "..."`, `authorization_servers`,
/// `resource_url` and `scopes` (`/mcp`'s OAuth metadata), and `[[serve.programs]]` tables
/// (`file`, `args`, `state`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_file: Option<PathBuf>,
    /// OAuth 2.1 authorization servers for `/mcp`, published in its protected-resource metadata
    /// (RFC 9728); colony does not validate the tokens they issue.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub authorization_servers: Vec<String>,
    /// `/mcp`'s URL as clients reach it (behind a proxy); default `http://HOST/mcp`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resource_url: Option<String>,
    /// The scopes the metadata lists (`scopes_supported`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub scopes: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub programs: Vec<ServeProgram>,
}

/// One program `colony serve` runs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServeProgram {
    pub file: PathBuf,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Its state directory (default: as `colony run` picks it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<PathBuf>,
    /// What it may reach, as `colony run`'s `--allow-*` flags say it (`colony serve` grants
    /// nothing else): `allow_net = ["api.example.com"]` or `true` for every host, `allow_read`
    /// and `allow_write` lists of paths (relative to this file) or `true`, `allow_run`,
    /// `allow_env` and `allow_all` flags.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_net: Option<Allow>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_read: Option<Allow>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_write: Option<Allow>,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_run: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_env: bool,
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub allow_all: bool,
}

/// One `allow_*` of a served program: `true` (everything), `false` (nothing) or a list.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Allow {
    Every(bool),
    Only(Vec<String>),
}

/// Read by hand: serde's untagged reading said only "data did not match any variant of
/// untagged enum Allow" of `allow_write = "pages.log"`.
impl<'de> Deserialize<'de> for Allow {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Allow, D::Error> {
        struct Reads;
        impl<'de> serde::de::Visitor<'de> for Reads {
            type Value = Allow;

            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("true, false or a list of strings (allow_write = [\"out.log\"])")
            }

            fn visit_bool<E: serde::de::Error>(self, b: bool) -> Result<Allow, E> {
                Ok(Allow::Every(b))
            }

            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<Allow, A::Error> {
                let mut items = Vec::new();
                while let Some(item) = seq.next_element::<String>()? {
                    items.push(item);
                }
                Ok(Allow::Only(items))
            }
        }
        d.deserialize_any(Reads)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Parse { path: PathBuf, message: String },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}")]
    Invalid(String),
}

/// Whether this process may write `path` as it stands (`access(2)`, `W_OK`); a file that is
/// not there yet is writable here (its folder decides).
fn writable(path: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(path.as_os_str().as_bytes()) else {
        return true;
    };
    // SAFETY: `c` is a valid NUL-terminated path for the duration of the call.
    let denied = unsafe { libc::access(c.as_ptr(), libc::W_OK) } != 0;
    !(denied && std::io::Error::last_os_error().kind() == std::io::ErrorKind::PermissionDenied)
}

/// Held from reading the config file to writing it back (`colony config set`, `colony mcp
/// add`, ...): a lock on the folder the file is written in. Two commands at once each read the
/// file before the other wrote it, and the last rename dropped the other's change while both
/// said it was made.
pub struct EditLock {
    _dir: std::fs::File,
}

impl EditLock {
    pub fn take(path: &Path) -> Result<EditLock, ConfigError> {
        let path = crate::permissions::resolve(path);
        let dir = path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let failed = |source: std::io::Error| ConfigError::Write {
            path: dir.into(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(failed)?;
        let handle = std::fs::File::open(dir).map_err(failed)?;
        handle.lock().map_err(failed)?;
        Ok(EditLock { _dir: handle })
    }
}

/// A TOML error's expectation in words a config's reader knows: serde names Rust's types
/// (`expected f64`, `expected struct UseConfig`).
fn humane_types(message: &str) -> String {
    let mut out = message.to_string();
    for (rust, words) in [
        ("expected f64", "expected a number"),
        ("expected f32", "expected a number"),
        ("expected u64", "expected a whole number, 0 or more"),
        ("expected u32", "expected a whole number, 0 or more"),
        ("expected u16", "expected a whole number, 0 or more"),
        ("expected usize", "expected a whole number, 0 or more"),
        ("expected i64", "expected a whole number"),
        ("expected i32", "expected a whole number"),
    ] {
        out = out.replace(rust, words);
    }
    // `expected struct UseConfig`, `expected a map`: a table (`[use.general]`).
    if let Some(at) = out.find("expected struct ") {
        let end = out[at..].find(['\n', ',']).map_or(out.len(), |i| at + i);
        out.replace_range(at..end, "expected a table");
    }
    out.replace("expected a map", "expected a table")
}

/// Where the config file lives: `COLONY_CONFIG`, else the XDG config directory. An empty
/// `COLONY_CONFIG=` is unset, as shells mean it: it was read as a file named "".
pub fn path() -> PathBuf {
    if let Some(p) = std::env::var_os("COLONY_CONFIG").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    dirs::config_dir()
        .unwrap_or_else(|| PathBuf::from("."))
        .join("colony")
        .join("config.toml")
}

impl Config {
    /// Reads the config file; a missing file is an empty config.
    pub fn load_from(path: &Path) -> Result<Config, ConfigError> {
        let config = Config::read_unchecked(path)?;
        config.check(path)?;
        Ok(config)
    }

    /// Reads the config file as TOML into its fields without judging their values (a provider
    /// colony does not know, a bad price): what `colony config set` and `unset` start from, so
    /// they can mend the very value that keeps the file from loading. [`Config::check`] judges
    /// the result before it is written.
    pub fn read_unchecked(path: &Path) -> Result<Config, ConfigError> {
        let Some(text) = read_text(path)? else {
            return Ok(Config::default());
        };
        toml::from_str(&text).map_err(|e| {
            let mut message = humane_types(&e.to_string());
            // A typo in a use-type's table kept every command from loading the file, and the
            // way out was not said.
            if message.contains("unknown field `") && unknown_use_field(&text) {
                message = format!(
                    "{}\n(a field of a use-type's table is taken out by `colony config unset \
                     USE-TYPE FIELD`)",
                    message.trim_end()
                );
            }
            ConfigError::Parse {
                path: path.into(),
                message,
            }
        })
    }

    /// Judges the values a config read from `path` holds (known providers, prices, rates, the
    /// store's URL), and registers its secrets for redaction.
    pub fn check(&self, path: &Path) -> Result<(), ConfigError> {
        self.register_secrets();
        // Every problem at once: a file with three was mended one run at a time.
        let problems = self.problems();
        let message = match problems.as_slice() {
            [] => return Ok(()),
            [one] => one.clone(),
            many => format!("{} problems:\n  {}", many.len(), many.join("\n  ")),
        };
        Err(ConfigError::Parse {
            path: path.into(),
            message,
        })
    }

    /// Every value no call could use, each naming its table, field and value.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        for (name, u) in &self.uses {
            if let Some(p) = &u.provider
                && catalogue::find(p).is_none()
            {
                problems.push(format!(
                    "[use.{name}] provider = {p:?} is not a known provider (known: {})",
                    catalogue::ids().join(", ")
                ));
            }
            for (field, problem) in u.problems() {
                let value = u.field(field).unwrap_or_default();
                problems.push(format!("[use.{name}] {field} = {value}: {problem}"));
            }
        }
        if let Some(prices) = &self.prices
            && let Err(message) = prices.validate()
        {
            problems.push(message);
        }
        if let Some(rate) = &self.rate
            && let Err(message) = rate.validate()
        {
            problems.push(message);
        }
        if let Some(url) = self.store.as_ref().and_then(|s| s.url.as_deref())
            && !crate::store::postgres::is_postgres(url)
        {
            problems.push(format!(
                "[store] url = {:?} is not a PostgreSQL URL (postgres://USER@HOST:PORT/DATABASE)",
                crate::store::postgres::redact(url)
            ));
        }
        for (name, server) in &self.mcp {
            if let Some(problem) = crate::mcp::naming::server_name_problem(name) {
                problems.push(format!("[mcp.{name}]: not a server name: {problem}"));
            }
            for field in server.unknown.keys() {
                problems.push(format!(
                    "[mcp.{name}] {field}: unknown field (fields: {})",
                    crate::mcp::spec::SERVER_FIELDS.join(", ")
                ));
            }
        }
        if let Some(keep) = self.store.as_ref().and_then(|s| s.keep_audit.as_deref()) {
            match keep_duration(keep) {
                Err(e) => problems.push(format!("[store] keep_audit: {e}")),
                Ok(d) if d < std::time::Duration::from_secs(3600) => problems.push(format!(
                    "[store] keep_audit = {keep:?} is under an hour: audit lines are kept at \
                     least that long"
                )),
                Ok(_) => {}
            }
        }
        problems
    }

    /// Keys, tokens and passwords the file holds are kept out of every log line and answer.
    pub fn register_secrets(&self) {
        for u in self.uses.values() {
            if let Some(k) = &u.key {
                secrets::register(k);
            }
        }
        if let Some(password) = self
            .store
            .as_ref()
            .and_then(|s| s.url.as_deref())
            .and_then(|url| url::Url::parse(url).ok())
            .and_then(|u| u.password().map(str::to_string))
        {
            secrets::register(&password);
        }
        // An MCP server's headers and env usually carry a token.
        for server in self.mcp.values() {
            for v in server.headers.values().chain(server.env.values()) {
                secrets::register(v);
            }
        }
    }

    pub fn load() -> Result<Config, ConfigError> {
        Config::load_from(&path())
    }

    /// Writes the file; mode 0600 on Unix, since it may hold a key. A file that exists keeps its
    /// comments, order and layout: only the settings that differ from what it holds are
    /// written into it ([`layout`]).
    pub fn save_to(&self, path: &Path) -> Result<(), ConfigError> {
        // A config linked from elsewhere (a dotfiles checkout) is written where the link
        // ends: the rename replaced the link with a plain file, splitting the config in two.
        let path = &crate::permissions::resolve(path);
        let fresh =
            toml::to_string_pretty(self).map_err(|e| ConfigError::Invalid(e.to_string()))?;
        let text = std::fs::read_to_string(path)
            .ok()
            .and_then(|file| {
                let before = toml::from_str::<Config>(&file).ok()?;
                let before = toml::to_string_pretty(&before).ok()?;
                layout::patched(&file, &before, &fresh)
            })
            .unwrap_or(fresh);
        write_text(path, &text)
    }

    /// Removes `[use.USE_TYPE] FIELD` from the file's text, whatever the field, and answers
    /// whether it was there: the way out of a field colony does not know (a typo, `modle`),
    /// which keeps the file from loading, so that [`Config::unset`] could not read it to mend
    /// it. The rest of the text is kept as it is.
    pub fn unset_in_text(path: &Path, use_type: &str, field: &str) -> Result<bool, ConfigError> {
        let path = &crate::permissions::resolve(path);
        let _lock = EditLock::take(path)?;
        let Some(text) = read_text(path)? else {
            return Ok(false);
        };
        let mut doc: toml_edit::DocumentMut = text.parse().map_err(|e| ConfigError::Parse {
            path: path.into(),
            message: format!("{e}"),
        })?;
        let removed = doc
            .get_mut("use")
            .and_then(|u| u.get_mut(use_type))
            .and_then(|t| t.as_table_like_mut())
            .and_then(|t| t.remove(field))
            .is_some();
        if removed {
            write_text(path, &doc.to_string())?;
        }
        Ok(removed)
    }

    /// Reads the config file at `path` to change it, holding [`EditLock`] until the change is
    /// written: unchecked, as [`Config::read_unchecked`] reads it.
    pub fn edit(path: &Path) -> Result<(Config, EditLock), ConfigError> {
        let lock = EditLock::take(path)?;
        Ok((Config::read_unchecked(path)?, lock))
    }

    /// The table for `use_type`, falling back to `general`.
    pub fn for_use(&self, use_type: &str) -> UseConfig {
        self.uses
            .get(use_type)
            .or_else(|| self.uses.get("general"))
            .cloned()
            .unwrap_or_default()
    }

    /// Sets one field of one use-type, checking the value; an empty value clears the field.
    pub fn set(&mut self, use_type: &str, field: &str, value: &str) -> Result<(), ConfigError> {
        // `[use.""]` was written (and listed as `[use.]`), and a model name with a newline in it.
        if use_type.trim().is_empty() || use_type.chars().any(char::is_control) {
            return Err(ConfigError::Invalid(format!(
                "{use_type:?} is not a use-type name (give it a name, without control characters)"
            )));
        }
        if value.chars().any(char::is_control) {
            return Err(ConfigError::Invalid(format!(
                "{field} = {value:?}: holds a control character (a newline?)"
            )));
        }
        if value.is_empty() {
            return self.unset(use_type, Some(field)).map(|_| ());
        }
        let u = self.uses.entry(use_type.to_string()).or_default();
        let bad = |what: &str| ConfigError::Invalid(format!("{field} = {value:?}: {what}"));
        let text = || (!value.is_empty()).then(|| value.to_string());
        match field {
            "provider" => {
                if catalogue::find(value).is_none() {
                    return Err(bad(&format!(
                        "not a known provider (known: {})",
                        catalogue::ids().join(", ")
                    )));
                }
                u.provider = text();
            }
            "model" => u.model = text(),
            "key" => u.key = text(),
            "key_env" => u.key_env = text(),
            "base_url" => u.base_url = text(),
            "max_tokens" => {
                u.max_tokens = Some(value.parse().map_err(|_| bad("not a whole number"))?)
            }
            "temperature" => u.temperature = Some(value.parse().map_err(|_| bad("not a number"))?),
            "timeout" => {
                // `10m` as `--max-time` takes it: it read "not seconds". Kept as seconds.
                let secs = match value.parse::<f64>() {
                    Ok(secs) => secs,
                    Err(_) => crate::duration::parse(value)
                        .map_err(|e| bad(&e.to_string()))?
                        .as_secs_f64(),
                };
                crate::duration::seconds(secs).map_err(|e| bad(&e.to_string()))?;
                if secs == 0.0 {
                    return Err(bad(ZERO_TIMEOUT));
                }
                u.timeout = Some(secs);
            }
            "max_response_bytes" => {
                let n: u64 = value
                    .parse()
                    .map_err(|_| bad("not a whole number of bytes"))?;
                if n == 0 {
                    return Err(bad("must be at least 1"));
                }
                u.max_response_bytes = Some(n);
            }
            "tools" => {
                ToolsLevel::parse(value).ok_or_else(|| bad("expected native, text or none"))?;
                u.tools = text();
            }
            "images" => u.images = Some(value.parse().map_err(|_| bad("expected true or false"))?),
            "max_concurrent_calls" => {
                let n: usize = value.parse().map_err(|_| bad("not a whole number"))?;
                if n == 0 {
                    return Err(bad("must be at least 1"));
                }
                u.max_concurrent_calls = Some(n);
            }
            _ => {
                return Err(ConfigError::Invalid(format!(
                    "unknown field {field:?} (fields: {})",
                    FIELDS.join(", ")
                )));
            }
        }
        Ok(())
    }
}

/// Writes `text` as the config file at `path` (a link's target), in place of what it held.
fn write_text(path: &Path, text: &str) -> Result<(), ConfigError> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(|source| ConfigError::Write {
            path: dir.into(),
            source,
        })?;
    }
    // A file made read-only, or one this user may not write (a 0644 file of root's in a
    // folder of theirs), is left as it is, as `fs.write` leaves one: the rename would
    // replace it all the same.
    if std::fs::metadata(path).is_ok_and(|m| m.permissions().readonly()) || !writable(path) {
        return Err(ConfigError::Write {
            path: path.into(),
            source: std::io::Error::new(
                std::io::ErrorKind::PermissionDenied,
                "the file is read-only (make it writable to let colony change it)",
            ),
        });
    }
    // A name of this process's own: two writers sharing one removed each other's file
    // ("No such file") between its write and its rename.
    let tmp = path.with_extension(format!("toml.{}.tmp", std::process::id()));
    let write = || -> std::io::Result<()> {
        use std::io::Write;
        let mut opts = std::fs::OpenOptions::new();
        opts.create(true).write(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        // A temp file left by a crash keeps its mode when opened: start from none, so the
        // key is never written into a file others can read.
        let _ = std::fs::remove_file(&tmp);
        opts.create_new(true);
        let mut f = opts.open(&tmp)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    };
    write().map_err(|source| ConfigError::Write {
        path: path.into(),
        source,
    })
}

/// The config file's text; `None` when there is no file (an empty config).
fn read_text(path: &Path) -> Result<Option<String>, ConfigError> {
    match std::fs::read_to_string(path) {
        Ok(text) => Ok(Some(text)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(source) => Err(ConfigError::Read {
            path: path.into(),
            source,
        }),
    }
}

impl Config {
    /// Removes one field of a use-type, or (with no field) the whole use-type. Answers whether
    /// there was anything to remove; a use-type left with no field is removed too.
    pub fn unset(&mut self, use_type: &str, field: Option<&str>) -> Result<bool, ConfigError> {
        let Some(field) = field else {
            return Ok(self.uses.remove(use_type).is_some());
        };
        if !FIELDS.contains(&field) {
            return Err(ConfigError::Invalid(format!(
                "unknown field {field:?} (fields: {})",
                FIELDS.join(", ")
            )));
        }
        let Some(u) = self.uses.get_mut(use_type) else {
            return Ok(false);
        };
        let had = u.field(field).is_some();
        match field {
            "provider" => u.provider = None,
            "model" => u.model = None,
            "key" => u.key = None,
            "key_env" => u.key_env = None,
            "base_url" => u.base_url = None,
            "max_tokens" => u.max_tokens = None,
            "temperature" => u.temperature = None,
            "timeout" => u.timeout = None,
            "max_response_bytes" => u.max_response_bytes = None,
            "tools" => u.tools = None,
            "images" => u.images = None,
            "max_concurrent_calls" => u.max_concurrent_calls = None,
            _ => unreachable!("checked against FIELDS"),
        }
        if *u == UseConfig::default() {
            self.uses.remove(use_type);
        }
        Ok(had)
    }
}

/// The base URL a provider is reached at when no use-type sets one: its `*_BASE_URL` variable
/// (or `OLLAMA_HOST`), else the catalogue's.
pub fn default_base_url(entry: &CatalogueEntry) -> String {
    env_base_url(entry).unwrap_or_else(|| entry.base_url.to_string())
}

impl UseConfig {
    /// The values no call could use, and why: found when the file is read, not in every call
    /// that reaches them.
    fn problems(&self) -> Vec<(&'static str, String)> {
        let mut problems = Vec::new();
        if let Some(url) = &self.base_url {
            match reqwest::Url::parse(url) {
                Err(e) => problems.push(("base_url", format!("not a URL ({e})"))),
                Ok(u) if !matches!(u.scheme(), "http" | "https") => {
                    problems.push(("base_url", "must be an http or https URL".into()))
                }
                Ok(_) => {}
            }
        }
        if self.max_tokens == Some(0) {
            problems.push(("max_tokens", "must be at least 1".into()));
        }
        if let Some(t) = self.temperature
            && !(t.is_finite() && t >= 0.0)
        {
            problems.push((
                "temperature",
                "must be a number from 0 (0 to 1 for Anthropic, 0 to 2 for OpenAI and Gemini)"
                    .into(),
            ));
        }
        if let Some(secs) = self.timeout {
            if let Err(e) = crate::duration::seconds(secs) {
                problems.push(("timeout", e.to_string()));
            } else if secs == 0.0 {
                problems.push(("timeout", ZERO_TIMEOUT.into()));
            }
        }
        if self.max_response_bytes == Some(0) {
            problems.push(("max_response_bytes", "must be at least 1".into()));
        }
        if let Some(level) = &self.tools
            && ToolsLevel::parse(level).is_none()
        {
            problems.push(("tools", "expected native, text or none".into()));
        }
        if self.max_concurrent_calls == Some(0) {
            problems.push(("max_concurrent_calls", "must be at least 1".into()));
        }
        problems
    }

    /// One field as text, for `colony config get`; a key shows as `[redacted]`.
    pub fn field(&self, field: &str) -> Option<String> {
        match field {
            "provider" => self.provider.clone(),
            "model" => self.model.clone(),
            "key" => self.key.as_ref().map(|_| "[redacted]".to_string()),
            "key_env" => self.key_env.clone(),
            "base_url" => self.base_url.clone(),
            "max_tokens" => self.max_tokens.map(|v| v.to_string()),
            "temperature" => self.temperature.map(crate::duration::number_text),
            "timeout" => self.timeout.map(crate::duration::number_text),
            "max_response_bytes" => self.max_response_bytes.map(|v| v.to_string()),
            "tools" => self.tools.clone(),
            "images" => self.images.map(|v| v.to_string()),
            "max_concurrent_calls" => self.max_concurrent_calls.map(|v| v.to_string()),
            _ => None,
        }
    }
}

/// What a call may override, from Lua or the command line.
#[derive(Debug, Clone, Default)]
pub struct Overrides {
    pub use_type: Option<String>,
    pub provider: Option<String>,
    pub model: Option<String>,
    pub key: Option<String>,
    pub base_url: Option<String>,
    pub timeout: Option<f64>,
    pub max_tokens: Option<u32>,
    pub temperature: Option<f64>,
}

/// Settings resolved for one request.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub endpoint: Endpoint,
    pub model: String,
    pub max_tokens: Option<u32>,
    pub temperature: Option<f64>,
    pub use_type: String,
}

/// Base URLs already found well-formed: resolution runs for every request, and parsing a URL
/// (IDNA host processing included) is a measurable part of a step's cost.
static CHECKED_URLS: std::sync::LazyLock<dashmap::DashSet<String>> =
    std::sync::LazyLock::new(dashmap::DashSet::new);

fn check_base_url(base_url: &str, provider: &str) -> Result<(), ProviderError> {
    if CHECKED_URLS.contains(base_url) {
        return Ok(());
    }
    let parsed = reqwest::Url::parse(base_url).map_err(|e| {
        ProviderError::Config(format!(
            "base URL {base_url:?} for {provider} is not a URL: {e}"
        ))
    })?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(ProviderError::Config(format!(
            "base URL {base_url:?} for {provider} must be http or https"
        )));
    }
    CHECKED_URLS.insert(base_url.to_string());
    Ok(())
}

fn env(name: &str) -> Option<String> {
    if name.is_empty() {
        return None;
    }
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// The environment variables that may carry a provider's key, in the order they are read.
pub fn key_vars(entry: &CatalogueEntry) -> Vec<&'static str> {
    match entry.id {
        "gemini" => vec!["GEMINI_API_KEY", "GOOGLE_API_KEY"],
        _ if entry.key_env.is_empty() => vec![],
        _ => vec![entry.key_env],
    }
}

/// With nothing configured, the first provider whose key is in the environment.
fn provider_from_env() -> Option<&'static str> {
    ["anthropic", "openai", "gemini", "groq", "kimi"]
        .into_iter()
        .find(|id| {
            catalogue::find(id)
                .map(|e| key_vars(e).iter().any(|v| env(v).is_some()))
                .unwrap_or(false)
        })
}

/// The base URL `OLLAMA_HOST` names, read as the Ollama CLI reads it: `host`, `host:port` or a
/// URL, `http` when no scheme is given, and port 11434 when an `http` one gives none
/// (`OLLAMA_HOST=0.0.0.0`, the usual setting to expose a server, was port 80).
fn ollama_base_url(host: &str) -> String {
    let host = host.trim().trim_end_matches('/');
    let given = if host.contains("://") {
        host.to_string()
    } else {
        format!("http://{host}")
    };
    let url = match url::Url::parse(&given) {
        Ok(mut url) => {
            if url.scheme() == "http" && url.port().is_none() {
                let _ = url.set_port(Some(11434));
            }
            url.to_string()
        }
        Err(_) => given,
    };
    format!("{}/v1", url.trim_end_matches('/'))
}

fn env_base_url(entry: &CatalogueEntry) -> Option<String> {
    if let Some(url) = env(entry.base_url_env) {
        return Some(url);
    }
    if entry.id == "ollama" {
        return env("OLLAMA_HOST").map(|h| ollama_base_url(&h));
    }
    None
}

/// Whether a `[use.NAME]` table of `text` holds a field colony does not know: what
/// [`Config::unset_in_text`] can take out (one elsewhere, `[store] urll`, it cannot).
fn unknown_use_field(text: &str) -> bool {
    let Ok(doc) = text.parse::<toml_edit::DocumentMut>() else {
        return false;
    };
    doc.get("use")
        .and_then(|u| u.as_table_like())
        .is_some_and(|uses| {
            uses.iter().any(|(_, table)| {
                table
                    .as_table_like()
                    .is_some_and(|t| t.iter().any(|(k, _)| !FIELDS.contains(&k)))
            })
        })
}

/// The use-types colony's own commands and docs name: one of them that the file does not set
/// reads general's settings by design.
const NAMED_USE_TYPES: [&str; 4] = ["chat", "code", "helper", "general"];

/// Says once per name that `use_type`, which the file does not set while it sets others, runs
/// on general's settings: a misspelt `use = "cdoe"` answered from general's provider and model
/// without a word, perhaps a dearer one.
fn say_fallback(config: &Config, use_type: &str) {
    static SAID: crate::said::SaidOnce = crate::said::SaidOnce::new();
    if config.uses.is_empty()
        || config.uses.contains_key(use_type)
        || NAMED_USE_TYPES.contains(&use_type)
    {
        return;
    }
    if SAID.first(use_type) {
        let mut set: Vec<&str> = config.uses.keys().map(String::as_str).collect();
        set.sort_unstable();
        let answers = if config.uses.contains_key("general") {
            "general's settings answer it"
        } else {
            "the environment's keys and each provider's defaults answer it"
        };
        tracing::warn!(
            "use-type {use_type:?} is not in the config file (it sets {}): {answers} \
             (`colony config set {use_type} model ...` gives it its own)",
            set.join(", ")
        );
    }
}

impl Config {
    /// Settings for one request. Errors name what is missing and where to set it.
    pub fn resolve(&self, o: &Overrides) -> Result<Resolved, ProviderError> {
        let use_type = o.use_type.clone().unwrap_or_else(|| "general".into());
        say_fallback(self, &use_type);
        let cfg = self.for_use(&use_type);
        // The table those settings came from, for messages: a use-type the file does not set
        // reads general's (a hint to put the key in `[use.helper]` made a table that named no
        // provider).
        let table = if self.uses.contains_key(&use_type) || !self.uses.contains_key("general") {
            use_type.as_str()
        } else {
            "general"
        };
        let provider = o
            .provider
            .clone()
            .or_else(|| cfg.provider.clone())
            .or_else(|| provider_from_env().map(str::to_string))
            .ok_or_else(|| {
                ProviderError::Config(format!(
                    "no provider for use-type {use_type:?}: set one with `colony config set \
                     {use_type} provider NAME` (known: {}), pass one (`provider = ...` in a \
                     script, `colony ask --provider`), or set a key such as ANTHROPIC_API_KEY",
                    catalogue::ids().join(", ")
                ))
            })?;
        let entry = catalogue::find(&provider).ok_or_else(|| {
            ProviderError::Config(format!(
                "unknown provider {provider:?} (known: {})",
                catalogue::ids().join(", ")
            ))
        })?;
        // The use-type's table applies only when it names this provider (or none).
        let same = cfg
            .provider
            .as_deref()
            .is_none_or(|p| catalogue::find(p).map(|e| e.id) == Some(entry.id));
        let cfg = if same { cfg } else { UseConfig::default() };
        let base_url = o
            .base_url
            .clone()
            .or(cfg.base_url.clone())
            .or_else(|| env_base_url(entry))
            .unwrap_or_else(|| entry.base_url.to_string());
        let base_url = base_url.trim_end_matches('/').to_string();
        if entry.id != "replay" {
            check_base_url(&base_url, &provider)?;
        }
        let key = match (&o.key, &cfg.key, &cfg.key_env) {
            (Some(k), _, _) | (None, Some(k), _) => Some(k.clone()),
            (None, None, Some(var)) => Some(env(var).ok_or_else(|| {
                ProviderError::Config(format!(
                    "missing key for {provider}: [use.{table}] key_env names {var}, which is not set"
                ))
            })?),
            (None, None, None) => key_vars(entry).into_iter().find_map(env),
        };
        if key.is_none() && !entry.key_optional {
            // A config file that is not there is read as empty: said here, where it matters
            // (`COLONY_CONFIG` with a typo in it).
            let file = path();
            let missing = if file.exists() {
                ""
            } else {
                ", which does not exist"
            };
            // A provider named over the table's own (`colony models anthropic` with general's
            // set to openai) was told to put its key in that table, another provider's.
            // (Only that table is read: one set to the provider is read when it is the one
            // named, `--use NAME`, `use = "NAME"`.)
            let table = if same {
                format!("[use.{table}] of")
            } else {
                format!("a use-type set to {provider}, named with --use or use =, in")
            };
            return Err(ProviderError::Config(format!(
                "missing key for {provider}: set {} (or key_env / key in {table} {}{missing})",
                key_vars(entry).join(" or "),
                file.display()
            )));
        }
        if let Some(k) = &key {
            secrets::register(k);
        }
        let tools_level = cfg
            .tools
            .as_deref()
            .and_then(ToolsLevel::parse)
            .unwrap_or(entry.tools);
        let timeout = o.timeout.or(cfg.timeout).unwrap_or(600.0);
        let timeout = crate::duration::seconds(timeout).map_err(|e| {
            ProviderError::Config(format!("timeout for the {use_type} use-type: {e}"))
        })?;
        Ok(Resolved {
            endpoint: Endpoint {
                provider: entry.id.to_string(),
                style: entry.style,
                base_url,
                key,
                tools_level,
                timeout: timeout.max(Duration::from_millis(1)),
                max_response_bytes: cfg
                    .max_response_bytes
                    .unwrap_or(crate::providers::body::DEFAULT_MAX_RESPONSE_BYTES)
                    .max(1),
                reads: crate::files::forms::Reads {
                    images: cfg.images.unwrap_or(entry.images),
                },
                max_concurrent_calls: cfg
                    .max_concurrent_calls
                    .unwrap_or(crate::providers::DEFAULT_MAX_CONCURRENT_CALLS)
                    .max(1),
            },
            model: o
                .model
                .clone()
                .or(cfg.model)
                .unwrap_or_else(|| entry.default_model.to_string()),
            max_tokens: o.max_tokens.or(cfg.max_tokens),
            temperature: o.temperature.or(cfg.temperature),
            use_type,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ollama_host_is_read_as_the_ollama_cli_reads_it() {
        for (host, url) in [
            ("0.0.0.0", "http://0.0.0.0:11434/v1"),
            ("gpu-box", "http://gpu-box:11434/v1"),
            ("gpu-box:8080", "http://gpu-box:8080/v1"),
            ("http://gpu-box/", "http://gpu-box:11434/v1"),
            (
                "https://ollama.example.com",
                "https://ollama.example.com/v1",
            ),
            ("[::1]", "http://[::1]:11434/v1"),
            ("[::1]:9000", "http://[::1]:9000/v1"),
        ] {
            assert_eq!(ollama_base_url(host), url, "{host}");
        }
    }

    #[test]
    fn an_audit_keep_may_be_years_in_days_and_is_checked() {
        let day = std::time::Duration::from_secs(86_400);
        assert_eq!(keep_duration("90d"), Ok(day * 90));
        assert_eq!(keep_duration("2555d"), Ok(day * 2555));
        assert!(
            keep_duration("400d1h")
                .unwrap_err()
                .contains("write it in days")
        );
        assert!(
            keep_duration("40000d")
                .unwrap_err()
                .contains("hundred years")
        );
        assert!(keep_duration("a month").is_err());
    }

    #[test]
    fn use_type_falls_back_to_general_and_overrides_win() {
        let mut c = Config::default();
        c.set("general", "provider", "ollama").unwrap();
        c.set("general", "model", "m1").unwrap();
        c.set("code", "provider", "ollama").unwrap();
        c.set("code", "model", "m2").unwrap();
        let chat = c
            .resolve(&Overrides {
                use_type: Some("chat".into()),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(chat.model, "m1");
        let code = c
            .resolve(&Overrides {
                use_type: Some("code".into()),
                model: Some("m3".into()),
                ..Default::default()
            })
            .unwrap();
        assert_eq!(code.model, "m3");
    }

    /// A use-type the file does not set reads general's table, and its messages name that one
    /// (they named `[use.helper]`, where a key alone makes a table without a provider).
    #[test]
    fn a_missing_key_names_the_table_read() {
        let mut c = Config::default();
        c.set("general", "provider", "groq").unwrap();
        c.set("general", "key_env", "COLONY_TEST_NEVER_SET_KEY")
            .unwrap();
        let e = c
            .resolve(&Overrides {
                use_type: Some("helper".into()),
                ..Default::default()
            })
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            "missing key for groq: [use.general] key_env names COLONY_TEST_NEVER_SET_KEY, \
             which is not set"
        );
    }

    #[test]
    fn unknown_provider_and_bad_field_are_named() {
        let mut c = Config::default();
        let e = c
            .set("general", "provider", "nope")
            .unwrap_err()
            .to_string();
        assert!(e.contains("nope") && e.contains("anthropic"), "{e}");
        let e = c.set("general", "colour", "x").unwrap_err().to_string();
        assert!(e.contains("colour"), "{e}");
        let e = c
            .resolve(&Overrides {
                provider: Some("nope".into()),
                ..Default::default()
            })
            .unwrap_err()
            .to_string();
        assert!(e.contains("unknown provider \"nope\""), "{e}");
    }

    #[test]
    fn an_empty_value_clears_and_unset_removes() {
        let mut c = Config::default();
        c.set("code", "provider", "openai").unwrap();
        c.set("code", "model", "m").unwrap();
        c.set("code", "provider", "").unwrap();
        assert_eq!(c.uses["code"].provider, None);
        c.set("code", "max_tokens", "").unwrap();
        assert!(c.unset("code", Some("model")).unwrap());
        assert!(!c.uses.contains_key("code"), "an emptied use-type goes");
        c.set("chat", "model", "m").unwrap();
        assert!(c.unset("chat", None).unwrap());
        assert!(!c.unset("chat", None).unwrap());
        assert!(c.unset("chat", Some("colour")).is_err());
    }

    #[test]
    fn every_field_sets_gets_and_unsets() {
        let values = [
            ("provider", "openai"),
            ("model", "m"),
            ("key", "sk-every-field-0123456789"),
            ("key_env", "SOME_KEY"),
            ("base_url", "http://127.0.0.1:9/v1"),
            ("max_tokens", "100"),
            ("temperature", "0.5"),
            ("timeout", "30"),
            ("max_response_bytes", "1024"),
            ("tools", "text"),
            ("images", "true"),
            ("max_concurrent_calls", "8"),
        ];
        assert_eq!(values.map(|(f, _)| f), FIELDS, "one value for every field");
        let mut c = Config::default();
        for (field, value) in values {
            c.set("code", field, value).unwrap();
            assert!(c.uses["code"].field(field).is_some(), "{field} reads back");
        }
        for (field, _) in values {
            assert!(c.unset("code", Some(field)).unwrap(), "{field} was set");
        }
        assert!(!c.uses.contains_key("code"), "nothing is left");
    }

    #[test]
    fn max_concurrent_calls_defaults_and_refuses_zero() {
        let mut c = Config::default();
        c.set("general", "provider", "ollama").unwrap();
        let ep = c.resolve(&Overrides::default()).unwrap().endpoint;
        assert_eq!(
            ep.max_concurrent_calls,
            crate::providers::DEFAULT_MAX_CONCURRENT_CALLS
        );
        c.set("general", "max_concurrent_calls", "4").unwrap();
        let ep = c.resolve(&Overrides::default()).unwrap().endpoint;
        assert_eq!(ep.max_concurrent_calls, 4);
        let e = c
            .set("general", "max_concurrent_calls", "0")
            .unwrap_err()
            .to_string();
        assert!(e.contains("at least 1"), "{e}");
        assert!(c.set("general", "max_concurrent_calls", "-1").is_err());
    }

    #[test]
    fn config_file_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        let mut c = Config::default();
        c.set("chat", "provider", "anthropic").unwrap();
        c.set("chat", "max_tokens", "100").unwrap();
        c.save_to(&p).unwrap();
        assert_eq!(Config::load_from(&p).unwrap(), c);
        std::fs::write(&p, "[use.chat]\nprovder = \"x\"\n").unwrap();
        let e = Config::load_from(&p).unwrap_err().to_string();
        assert!(e.contains("provder"), "{e}");
    }

    /// An `[mcp.NAME]` table's misspelt field and a name its tools could not be told apart by
    /// are named with the file and the table: `comand` read as "needs a url or a command" at
    /// the server's first use, `timeout` was dropped, and `a__b` was taken.
    #[test]
    fn a_value_of_the_wrong_type_is_told_in_words_not_rust_types() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        for (text, told) in [
            ("[use.general]\ntimeout = \"5\"\n", "expected a number"),
            ("[use]\ngeneral = \"openai\"\n", "expected a table"),
            (
                "[use.general]\nmax_tokens = -5\n",
                "expected a whole number, 0 or more",
            ),
        ] {
            std::fs::write(&p, text).unwrap();
            let e = Config::load_from(&p).unwrap_err().to_string();
            assert!(e.trim_end().ends_with(told), "{text}: {e}");
            assert!(
                !e.contains("f64") && !e.contains("struct") && !e.contains("u32"),
                "{e}"
            );
        }
    }

    #[test]
    fn an_mcp_servers_unknown_field_and_bad_name_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("c.toml");
        std::fs::write(
            &p,
            "[mcp.x]\ncomand = \"srv\"\ntimeout = 5\n[mcp.a__b]\ncommand = \"srv\"\n\
             [mcp.ok]\ncommand = \"srv\"\nargs = [\"-v\"]\nenv = { A = \"1\" }\n",
        )
        .unwrap();
        let e = Config::load_from(&p).unwrap_err().to_string();
        assert!(e.contains("c.toml"), "{e}");
        assert!(e.contains("3 problems"), "{e}");
        assert!(
            e.contains("[mcp.x] comand: unknown field (fields: url,"),
            "{e}"
        );
        assert!(e.contains("[mcp.x] timeout: unknown field"), "{e}");
        assert!(e.contains("[mcp.a__b]: not a server name"), "{e}");
        // A good table saves without the field set it was read with.
        std::fs::write(&p, "[mcp.ok]\ncommand = \"srv\"\n").unwrap();
        let c = Config::load_from(&p).unwrap();
        c.save_to(&p).unwrap();
        assert_eq!(Config::load_from(&p).unwrap(), c);
    }
}
