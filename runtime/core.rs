//! The Rust core a program talks to: configuration, the providers, and the multi-thread runtime
//! that does the waiting. It is `Send + Sync` and cheap to clone; the Lua thread holds one and
//! hands work to it by spawning onto [`Core::handle`].

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use tracing::Instrument;

use crate::config::{Config, ConfigError, Overrides, Resolved};
use crate::providers::{Endpoint, ProviderError, Providers, ToolsLevel};
use crate::vocab::{InferRequest, Inferred, Message, Style};

/// Where a program's model calls go and how they are configured.
#[derive(Clone)]
pub struct Core {
    inner: Arc<Inner>,
}

struct Inner {
    /// Shared by every clone (and every `with_own_client`): a reload reaches them all.
    config: Arc<LiveConfig>,
    providers: Providers,
    handle: tokio::runtime::Handle,
    replaying: bool,
    /// The program's files by hash, shared by every clone (and every `with_own_client`).
    files: Arc<crate::files::Library>,
}

/// The parts of one `ask`: what to send and which use-type's settings to send it with.
#[derive(Debug, Clone, Default)]
pub struct Ask {
    pub overrides: Overrides,
    pub system: Option<String>,
    pub messages: Vec<Message>,
    pub tools: Vec<crate::vocab::ToolSpec>,
    pub tool_choice: crate::vocab::ToolChoice,
    pub stop_sequences: Vec<String>,
    pub extra: Option<serde_json::Value>,
}

impl Ask {
    /// These settings under `defaults` (a route's, under which a resident is hired): each field
    /// this ask sets wins, the others come from `defaults`. Messages and tools are not settings:
    /// the result has none.
    pub fn under(self, defaults: &Ask) -> Ask {
        let r = &defaults.overrides;
        let o = self.overrides;
        Ask {
            overrides: Overrides {
                use_type: o.use_type.or_else(|| r.use_type.clone()),
                provider: o.provider.or_else(|| r.provider.clone()),
                model: o.model.or_else(|| r.model.clone()),
                key: o.key.or_else(|| r.key.clone()),
                base_url: o.base_url.or_else(|| r.base_url.clone()),
                timeout: o.timeout.or(r.timeout),
                max_tokens: o.max_tokens.or(r.max_tokens),
                temperature: o.temperature.or(r.temperature),
            },
            system: self.system.or_else(|| defaults.system.clone()),
            messages: Vec::new(),
            tools: Vec::new(),
            tool_choice: self.tool_choice,
            stop_sequences: if self.stop_sequences.is_empty() {
                defaults.stop_sequences.clone()
            } else {
                self.stop_sequences
            },
            extra: self.extra.or_else(|| defaults.extra.clone()),
        }
    }
}

impl Core {
    pub fn new(config: Config, providers: Providers, handle: tokio::runtime::Handle) -> Core {
        Core::build(LiveConfig::fixed(config), providers, handle)
    }

    /// A core whose config is the file at `path`, read now and again whenever
    /// [`Core::refresh_config`] finds it changed on disk.
    pub fn from_config_file(
        path: &Path,
        providers: Providers,
        handle: tokio::runtime::Handle,
    ) -> Result<Core, ConfigError> {
        Ok(CoreParts::from_config_file(path, providers)?.start(handle))
    }

    fn build(config: LiveConfig, providers: Providers, handle: tokio::runtime::Handle) -> Core {
        let replaying = providers.is_replaying();
        Core {
            inner: Arc::new(Inner {
                config: Arc::new(config),
                providers,
                handle,
                replaying,
                files: Arc::new(crate::files::Library::new()),
            }),
        }
    }

    /// The same core with its own HTTP connection pool, for a thread that drives its own calls
    /// (the Lua thread); see [`Providers::with_own_client`].
    pub fn with_own_client(&self) -> Core {
        Core {
            inner: Arc::new(Inner {
                config: self.inner.config.clone(),
                providers: self.inner.providers.with_own_client(),
                handle: self.inner.handle.clone(),
                replaying: self.inner.replaying,
                files: self.inner.files.clone(),
            }),
        }
    }

    pub fn handle(&self) -> &tokio::runtime::Handle {
        &self.inner.handle
    }

    pub fn providers(&self) -> &Providers {
        &self.inner.providers
    }

    /// The config as last read.
    pub fn config(&self) -> Arc<Config> {
        self.inner.config.current()
    }

    /// Re-reads the config file if it changed on disk since it was last read, and answers the
    /// config's generation: a new one means the settings may have changed. A file that no
    /// longer parses is reported once and the settings before it stay. Cheap (one `stat`) when
    /// nothing changed; a core without a file always answers 0.
    pub fn refresh_config(&self) -> u64 {
        self.inner.config.refresh()
    }

    /// Reads the config file again whether or not it looks changed (`colony serve` on SIGHUP:
    /// an edit that kept the file's time and size is still seen), and answers the generation.
    pub fn reload_config(&self) -> u64 {
        self.inner.config.forget_seen();
        self.inner.config.refresh()
    }

    /// Why the config file as it is now is not the one in use (it does not parse, it is gone
    /// or empty: the settings read before stay), as its last reading found; `None` when it is.
    pub fn config_unread(&self) -> Option<String> {
        self.inner
            .config
            .unread
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Whether model calls are answered from a cassette (whose answers no setting changes).
    pub fn is_replaying(&self) -> bool {
        self.inner.replaying
    }

    /// The program's files: one copy of each attached file, found by its reference.
    pub fn files(&self) -> &crate::files::Library {
        &self.inner.files
    }

    /// Settings for one request. While a cassette answers, no key or URL is needed: the cassette
    /// stands in for every provider.
    pub fn resolve(&self, o: &Overrides) -> Result<Resolved, ProviderError> {
        if self.inner.replaying {
            return Ok(Resolved {
                endpoint: Endpoint {
                    reads: Default::default(),
                    provider: "replay".into(),
                    style: Style::Replay,
                    base_url: String::new(),
                    key: None,
                    tools_level: ToolsLevel::Native,
                    timeout: std::time::Duration::from_secs(600),
                    max_response_bytes: crate::providers::body::DEFAULT_MAX_RESPONSE_BYTES,
                    max_concurrent_calls: crate::providers::DEFAULT_MAX_CONCURRENT_CALLS,
                },
                model: o.model.clone().unwrap_or_else(|| "replay".into()),
                max_tokens: o.max_tokens,
                temperature: o.temperature,
                use_type: o.use_type.clone().unwrap_or_else(|| "general".into()),
            });
        }
        self.inner.config.current().resolve(o)
    }

    /// Resolves settings and builds the neutral request.
    pub fn prepare(&self, ask: Ask) -> Result<(InferRequest, Endpoint), ProviderError> {
        let overrides = ask.overrides.clone();
        let mut req = self.request(ask);
        let ep = self.settle(&overrides, &mut req)?;
        Ok((req, ep))
    }

    /// The neutral request of `ask`, its settings not resolved yet ([`Core::settle`] does).
    pub fn request(&self, ask: Ask) -> InferRequest {
        InferRequest {
            model: String::new(),
            system: ask.system,
            messages: ask.messages,
            tools: ask.tools,
            tool_choice: ask.tool_choice,
            max_tokens: None,
            temperature: None,
            stop_sequences: ask.stop_sequences,
            extra: ask.extra,
            response_schema: None,
            files_from: None,
        }
    }

    /// Resolves settings afresh and writes the resolved model, max tokens and temperature into
    /// `req`, returning where to send it. A request that lives across several calls (a turn's)
    /// is settled before each one, so a rotated key or a changed config lands mid-turn.
    pub fn settle(&self, o: &Overrides, req: &mut InferRequest) -> Result<Endpoint, ProviderError> {
        let resolved = self.resolve(o)?;
        // `tools = "none"`: the model takes no tools, so none are ever sent; a call that offers
        // some would be answered by a model that cannot use them, so it says so instead.
        if resolved.endpoint.tools_level == ToolsLevel::None && !req.tools.is_empty() {
            let names: Vec<&str> = req.tools.iter().map(|t| t.name.as_str()).collect();
            return Err(ProviderError::Config(format!(
                "use-type {:?} has tools = \"none\" (its model takes no tools), but this call \
                 offers {}: leave the tools out, or set tools to native or text",
                resolved.use_type,
                names.join(", ")
            )));
        }
        req.model = resolved.model;
        req.max_tokens = resolved.max_tokens;
        req.temperature = resolved.temperature;
        Ok(resolved.endpoint)
    }

    /// One model call as the innermost step of every middleware stack: the provider called
    /// ([`Providers::call`]) inside a traced `step` span that records the tokens used. It has no
    /// retries, breaker or context handling: those are the layers of [`crate::infer`] around it.
    pub async fn call_provider(
        &self,
        req: &InferRequest,
        ep: &Endpoint,
        on_text: Option<&mut (dyn FnMut(&str) + Send)>,
    ) -> Result<Inferred, ProviderError> {
        // A source's or a tool's call for a resident over its budget is not made.
        if let Some(why) = crate::infer::spending::refusal() {
            return Err(ProviderError::Budget(why));
        }
        let span = tracing::info_span!(
            "step",
            gen_ai.system = %ep.provider,
            gen_ai.request.model = %req.model,
            gen_ai.usage.input_tokens = tracing::field::Empty,
            gen_ai.usage.output_tokens = tracing::field::Empty,
        );
        let result = self
            .inner
            .providers
            .call(req, ep, on_text)
            .instrument(span.clone())
            .await;
        match &result {
            Ok(inferred) => {
                span.record("gen_ai.usage.input_tokens", inferred.usage.input);
                span.record("gen_ai.usage.output_tokens", inferred.usage.output);
                tracing::debug!(stop = inferred.stop.as_str(), "inferred");
                crate::infer::spending::charge(&inferred.usage, &ep.provider, &req.model);
            }
            Err(e) => tracing::debug!(kind = e.kind(), error = %e, "inference failed"),
        }
        result
    }
}

/// A core before it has a runtime: its config file, read, and its providers. `colony run` reads
/// them first and starts opening the program's store (whose place the config may name) before
/// it builds the runtime, so that the two overlap; [`CoreParts::start`] then makes the core.
pub struct CoreParts {
    config: LiveConfig,
    providers: Providers,
}

impl CoreParts {
    /// The config file at `path`, read now (and again, once started, whenever
    /// [`Core::refresh_config`] finds it changed on disk).
    pub fn from_config_file(path: &Path, providers: Providers) -> Result<CoreParts, ConfigError> {
        Ok(CoreParts {
            config: LiveConfig::load(path)?,
            providers,
        })
    }

    /// The config as read.
    pub fn config(&self) -> Arc<Config> {
        self.config.current()
    }

    /// The core, its tasks spawned on `handle`.
    pub fn start(self, handle: tokio::runtime::Handle) -> Core {
        Core::build(self.config, self.providers, handle)
    }
}

/// The config a program resolves against and the file it came from. A running program re-reads
/// the file when asked ([`Core::refresh_config`]: a blocked resident asks once a second), so a
/// key or a provider fixed on disk reaches it without a restart. Polling the file's `stat` was
/// chosen over a file-system watcher (the `notify` crate): it is only done while a resident is
/// blocked, costs one system call, needs no new dependency, and sees an editor's
/// write-and-rename, a network file system and a file created later alike.
struct LiveConfig {
    current: RwLock<Arc<Config>>,
    file: Option<PathBuf>,
    /// The file as last seen, and the generation (bumped by each successful re-read).
    seen: Mutex<Option<Stamp>>,
    generation: AtomicU64,
    /// The settings in use were read from a file that was there (not the defaults of none).
    from_file: AtomicBool,
    /// Why the file as it is now is not in use (it does not parse, it is gone or empty), since
    /// the last read of it that failed; `None` once one succeeds.
    unread: Mutex<Option<String>>,
}

/// What tells a changed file from the one read: its modification time, size and inode (`None`:
/// there was no file).
type Stamp = Option<(std::time::SystemTime, u64, u64)>;

/// Whether the file stamped is there and not empty.
fn holds_something(stamp: &Stamp) -> bool {
    stamp.is_some_and(|(_, len, _)| len > 0)
}

fn stamp(path: &Path) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len(), meta.ino()))
}

impl LiveConfig {
    fn fixed(config: Config) -> LiveConfig {
        LiveConfig {
            current: RwLock::new(Arc::new(config)),
            file: None,
            seen: Mutex::new(None),
            generation: AtomicU64::new(0),
            from_file: AtomicBool::new(false),
            unread: Mutex::new(None),
        }
    }

    fn load(path: &Path) -> Result<LiveConfig, ConfigError> {
        // Stamped before reading: a change made while it is read is seen at the next refresh.
        let seen = stamp(path);
        let config = Config::load_from(path)?;
        Ok(LiveConfig {
            current: RwLock::new(Arc::new(config)),
            file: Some(path.to_path_buf()),
            from_file: AtomicBool::new(holds_something(&seen)),
            seen: Mutex::new(Some(seen)),
            generation: AtomicU64::new(0),
            unread: Mutex::new(None),
        })
    }

    fn current(&self) -> Arc<Config> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Makes the next [`LiveConfig::refresh`] read the file whatever its stamp.
    fn forget_seen(&self) {
        *self.seen.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    fn refresh(&self) -> u64 {
        let Some(path) = &self.file else {
            return self.generation.load(Ordering::Acquire);
        };
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
        let now = stamp(path);
        if seen.as_ref() == Some(&now) {
            return self.generation.load(Ordering::Acquire);
        }
        let there = holds_something(&now);
        *seen = Some(now);
        // A file that was read and is gone or emptied (a deploy moving it, a slip of `rm`, a
        // writer that truncates before it writes) is not a wish for the defaults: every key
        // and setting went with it, and `colony serve` stopped every program at the next
        // SIGHUP.
        if !there && self.from_file.load(Ordering::Acquire) {
            tracing::warn!(
                "the config file {} is gone or empty: the settings read from it stay until it \
                 holds some again (a file holding only a comment gives the defaults)",
                path.display()
            );
            self.set_unread(Some(format!("{} is gone or empty", path.display())));
            return self.generation.load(Ordering::Acquire);
        }
        match Config::load_from(path) {
            Ok(config) => {
                self.set_unread(None);
                self.from_file.store(there, Ordering::Release);
                *self.current.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(config);
                tracing::info!(path = %path.display(), "the config file changed: read it again");
                self.generation.fetch_add(1, Ordering::AcqRel) + 1
            }
            Err(e) => {
                tracing::warn!(
                    "the config file changed but cannot be used (the settings before it stay): {e}"
                );
                self.set_unread(Some(e.to_string()));
                self.generation.load(Ordering::Acquire)
            }
        }
    }

    fn set_unread(&self, why: Option<String>) {
        *self.unread.lock().unwrap_or_else(|e| e.into_inner()) = why;
    }
}
