//! The providers colony knows by name. Any other OpenAI-compatible endpoint works by giving a
//! base URL with `provider = "openai"` (or a style).

use serde::Serialize;

use crate::vocab::Style;

/// How a provider takes tools: natively on the wire, described in the system prompt with a JSON
/// block asked back (`text`), or not at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolsLevel {
    Native,
    Text,
    None,
}

impl ToolsLevel {
    pub fn parse(s: &str) -> Option<ToolsLevel> {
        Some(match s {
            "native" => ToolsLevel::Native,
            "text" => ToolsLevel::Text,
            "none" => ToolsLevel::None,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct CatalogueEntry {
    pub id: &'static str,
    pub name: &'static str,
    pub style: Style,
    pub base_url: &'static str,
    pub default_model: &'static str,
    /// The environment variable the key is read from; empty when none is needed.
    pub key_env: &'static str,
    /// The environment variable that overrides the base URL.
    pub base_url_env: &'static str,
    pub tools: ToolsLevel,
    /// Whether a request without a key is still sent (local servers).
    pub key_optional: bool,
    /// Whether its default models read images where the style's table says a note (an
    /// OpenAI-compatible entry opting in); `images` in a use-type's config overrides it.
    pub images: bool,
}

pub const CATALOGUE: &[CatalogueEntry] = &[
    CatalogueEntry {
        id: "anthropic",
        name: "Anthropic",
        style: Style::Anthropic,
        base_url: "https://api.anthropic.com/v1",
        default_model: "claude-sonnet-4-5",
        key_env: "ANTHROPIC_API_KEY",
        base_url_env: "ANTHROPIC_BASE_URL",
        tools: ToolsLevel::Native,
        key_optional: false,
        images: false,
    },
    CatalogueEntry {
        id: "openai",
        name: "OpenAI",
        style: Style::Openai,
        base_url: "https://api.openai.com/v1",
        default_model: "gpt-4.1-mini",
        key_env: "OPENAI_API_KEY",
        base_url_env: "OPENAI_BASE_URL",
        tools: ToolsLevel::Native,
        key_optional: false,
        images: false,
    },
    CatalogueEntry {
        id: "groq",
        name: "Groq",
        style: Style::Openai,
        base_url: "https://api.groq.com/openai/v1",
        default_model: "llama-3.3-70b-versatile",
        key_env: "GROQ_API_KEY",
        base_url_env: "GROQ_BASE_URL",
        tools: ToolsLevel::Native,
        key_optional: false,
        images: false,
    },
    CatalogueEntry {
        id: "ollama",
        name: "Ollama (local)",
        style: Style::Openai,
        base_url: "http://127.0.0.1:11434/v1",
        default_model: "llama3.2",
        key_env: "",
        base_url_env: "OLLAMA_BASE_URL",
        tools: ToolsLevel::Native,
        key_optional: true,
        images: false,
    },
    CatalogueEntry {
        id: "kimi",
        name: "Kimi (Moonshot)",
        style: Style::Openai,
        base_url: "https://api.moonshot.ai/v1",
        default_model: "kimi-k2-0905-preview",
        key_env: "MOONSHOT_API_KEY",
        base_url_env: "MOONSHOT_BASE_URL",
        tools: ToolsLevel::Native,
        key_optional: false,
        images: false,
    },
    CatalogueEntry {
        id: "gemini",
        name: "Google Gemini",
        style: Style::Gemini,
        base_url: "https://generativelanguage.googleapis.com/v1beta",
        default_model: "gemini-2.5-flash",
        key_env: "GEMINI_API_KEY",
        base_url_env: "GEMINI_BASE_URL",
        tools: ToolsLevel::Native,
        key_optional: false,
        images: false,
    },
    CatalogueEntry {
        id: "replay",
        name: "Replay (cassette)",
        style: Style::Replay,
        base_url: "",
        default_model: "replay",
        key_env: "",
        base_url_env: "",
        tools: ToolsLevel::Native,
        key_optional: true,
        images: false,
    },
];

/// `moonshot` is another name for `kimi`.
pub fn find(id: &str) -> Option<&'static CatalogueEntry> {
    let id = if id == "moonshot" { "kimi" } else { id };
    CATALOGUE.iter().find(|e| e.id == id)
}

pub fn ids() -> Vec<&'static str> {
    CATALOGUE.iter().map(|e| e.id).collect()
}
