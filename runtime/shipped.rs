//! What ships inside the binary: the Lua front ends under `scripts/` (run by `colony chat` and
//! `colony ask`, listed by `colony scripts`) and the example programs under `examples/` (which
//! `colony ask` grounds its answers with). Compiled in, so the binary knows them wherever it runs.

/// A Lua file compiled into the binary.
pub struct Shipped {
    /// The file name, e.g. `chat.lua`.
    pub file: &'static str,
    pub source: &'static str,
}

impl Shipped {
    /// The name without `.lua` (what `colony scripts cat NAME` takes).
    pub fn name(&self) -> &'static str {
        self.file.trim_end_matches(".lua")
    }

    /// The opening comment's first line, without its `-- file:` prefix: what the file is for.
    pub fn summary(&self) -> &'static str {
        let first = self
            .source
            .lines()
            .next()
            .and_then(|l| l.strip_prefix("--"))
            .unwrap_or("")
            .trim();
        match first.split_once(": ") {
            Some((_, rest)) => rest,
            None => first,
        }
    }
}

/// The front ends, in `scripts/`.
pub const SCRIPTS: &[Shipped] = &[
    Shipped {
        file: "ask.lua",
        source: include_str!("../scripts/ask.lua"),
    },
    Shipped {
        file: "chat.lua",
        source: include_str!("../scripts/chat.lua"),
    },
];

/// The example programs, `examples/*.lua` in name order (listed by `build.rs`).
pub const EXAMPLES: &[Shipped] = include!(concat!(env!("OUT_DIR"), "/examples.rs"));

/// The script called `name` (with or without `.lua`).
pub fn script(name: &str) -> Option<&'static Shipped> {
    SCRIPTS.iter().find(|s| s.file == name || s.name() == name)
}

/// colony's subcommands and what each does (`colony.commands()` in Lua), as the binary's command
/// line declares them: told once by the binary as it starts ([`set_commands`]), so the Lua layer
/// knows them without reaching up into the command line. Empty in an embedding application.
static COMMANDS: std::sync::OnceLock<Vec<(String, String)>> = std::sync::OnceLock::new();

/// Records the binary's subcommands (name, what it does); the first call wins.
pub fn set_commands(commands: Vec<(String, String)>) {
    let _ = COMMANDS.set(commands);
}

/// The subcommands recorded by [`set_commands`].
pub fn commands() -> &'static [(String, String)] {
    COMMANDS.get().map(Vec::as_slice).unwrap_or_default()
}
