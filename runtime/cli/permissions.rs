//! The permission flags (`--sandbox`, `--allow-*`) and `--max-memory`, shared by the commands
//! that run a program.

use std::path::{Path, PathBuf};

use crate::permissions::{Grant, Permissions};

/// What a program may reach, in Deno's style. Without any of these, `colony run` grants
/// everything; with one, only what is allowed.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct SandboxArgs {
    /// Grant nothing but what --allow-* flags allow (implied by any --allow-* flag).
    #[arg(long)]
    sandbox: bool,
    /// Let the script's `http` reach these hosts (`host` or `host:port`, comma-separated), or
    /// every host when no list is given. Model providers and configured MCP servers are always
    /// reachable.
    #[arg(long, value_name = "HOST,...", num_args = 0..=1, require_equals = true,
          value_delimiter = ',', default_missing_value = EVERY, value_parser = listed())]
    allow_net: Option<Vec<String>>,
    /// Let the script read these files and folders (`fs`, `io.open`, attached files), or every
    /// path when no list is given.
    #[arg(long, value_name = "PATH,...", num_args = 0..=1, require_equals = true,
          value_delimiter = ',', default_missing_value = EVERY, value_parser = any_path())]
    allow_read: Option<Vec<PathBuf>>,
    /// Let the script write these files and folders, or every path when no list is given.
    #[arg(long, value_name = "PATH,...", num_args = 0..=1, require_equals = true,
          value_delimiter = ',', default_missing_value = EVERY, value_parser = any_path())]
    allow_write: Option<Vec<PathBuf>>,
    /// Let the script start processes (`proc.run`, `os.execute`, `io.popen`, stdio MCP servers
    /// it names itself, binary chunks in `load`).
    #[arg(long)]
    allow_run: bool,
    /// Let the script read the environment (`os.getenv`).
    #[arg(long)]
    allow_env: bool,
    /// Grant everything (the default of `colony run` without --sandbox or --allow-*).
    #[arg(long)]
    allow_all: bool,
    /// The most memory the program's Lua code may hold (`512M`, `2G`, or bytes; default 1G): an
    /// allocation past it fails the callback that made it with a `memory` error and the
    /// program goes on.
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    max_memory: Option<usize>,
}

impl SandboxArgs {
    /// The permissions these flags give, paths resolved against `base` (the current directory).
    pub fn permissions(&self, base: &Path) -> Permissions {
        let restricted = self.sandbox
            || self.allow_net.is_some()
            || self.allow_read.is_some()
            || self.allow_write.is_some()
            || self.allow_run
            || self.allow_env;
        if self.allow_all || !restricted {
            return Permissions::all();
        }
        self.granted(base)
    }

    /// Whether any of these flags was given (`--max-memory` aside).
    pub fn given(&self) -> bool {
        self.sandbox
            || self.allow_all
            || self.allow_net.is_some()
            || self.allow_read.is_some()
            || self.allow_write.is_some()
            || self.allow_run
            || self.allow_env
    }

    /// The flags again, as a command line that gives the same wherever it is started from
    /// (`colony mcp install` writes them into the entry it prints): a relative path is made
    /// absolute against `base`, as the program's own path is. An MCP client starts the server
    /// from a folder of its own, where `--allow-read=notes` would name another folder.
    pub fn flags(&self, base: &Path) -> Vec<String> {
        fn list<T>(
            name: &str,
            items: &Option<Vec<T>>,
            show: impl Fn(&T) -> String,
        ) -> Option<String> {
            let items = items.as_ref()?;
            let shown: Vec<String> = items.iter().map(show).filter(|s| s != EVERY).collect();
            Some(if shown.is_empty() {
                format!("--{name}")
            } else {
                format!("--{name}={}", shown.join(","))
            })
        }
        let path = |p: &PathBuf| {
            if p.as_os_str() == EVERY || p.is_absolute() {
                p.display().to_string()
            } else {
                base.join(p).display().to_string()
            }
        };
        let mut flags = Vec::new();
        flags.extend(self.sandbox.then(|| "--sandbox".to_string()));
        flags.extend(list("allow-net", &self.allow_net, |h: &String| {
            h.trim().to_string()
        }));
        flags.extend(list("allow-read", &self.allow_read, path));
        flags.extend(list("allow-write", &self.allow_write, path));
        flags.extend(self.allow_run.then(|| "--allow-run".to_string()));
        flags.extend(self.allow_env.then(|| "--allow-env".to_string()));
        flags.extend(self.allow_all.then(|| "--allow-all".to_string()));
        flags.extend(self.max_memory.map(|m| format!("--max-memory={m}")));
        flags
    }

    /// The permissions these flags give where nothing is granted by default (`colony serve`):
    /// only what they allow, paths resolved against `base`.
    pub fn granted(&self, base: &Path) -> Permissions {
        if self.allow_all {
            return Permissions::all();
        }
        Permissions {
            net: grant(self.allow_net.as_deref(), |h: &String| h == EVERY),
            read: grant(self.allow_read.as_deref(), |p: &PathBuf| {
                p.as_os_str() == EVERY
            }),
            write: grant(self.allow_write.as_deref(), |p: &PathBuf| {
                p.as_os_str() == EVERY
            }),
            run: self.allow_run,
            env: self.allow_env,
        }
        .resolved(base)
    }

    /// `--max-memory`, if given.
    pub fn max_memory(&self) -> Option<usize> {
        self.max_memory
    }
}

/// What a flag given without a list holds: it stands for everything. No one can type a NUL on a
/// command line, so `--allow-read=` (an empty list, as an unset shell variable gives) is told
/// apart from a bare `--allow-read`, and refused: it granted every path.
const EVERY: &str = "\0";

/// A list item, never empty.
fn item(text: &std::ffi::OsStr) -> Result<&std::ffi::OsStr, String> {
    if text.is_empty() {
        Err("an empty item: give a list (A,B), or the flag alone (no '=') to allow all".into())
    } else {
        Ok(text)
    }
}

/// A path as given (clap's own `PathBuf` parser refuses the value a bare flag stands for).
fn any_path() -> impl clap::builder::TypedValueParser<Value = PathBuf> {
    use clap::builder::TypedValueParser;
    clap::builder::OsStringValueParser::new().try_map(|s| item(&s).map(PathBuf::from))
}

/// A host as given.
fn listed() -> impl clap::builder::TypedValueParser<Value = String> {
    use clap::builder::TypedValueParser;
    clap::builder::StringValueParser::new().try_map(|s| {
        item(std::ffi::OsStr::new(s.trim()))?;
        if s == EVERY {
            return Ok(s);
        }
        crate::permissions::net_entry(&s)
    })
}

/// A flag's list: absent is nothing, given without a list is everything.
fn grant<T: Clone>(list: Option<&[T]>, every: impl Fn(&T) -> bool) -> Grant<T> {
    match list {
        None => Grant::None,
        Some(items) if items.iter().any(every) => Grant::All,
        Some(items) => Grant::Only(items.to_vec()),
    }
}

/// `1048576`, `64K`, `512M`, `2G` (also `KiB`, `MiB`, `GiB`): powers of 1,024, at least 1 MiB.
/// Written here because the size crates read `MB` as a power of 1,000, which a memory limit
/// should not.
fn parse_size(text: &str) -> Result<usize, String> {
    let t = text.trim();
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = t.split_at(digits);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a size (say 512M or 2G)"))?;
    let shift = match unit.trim().to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ if unit.starts_with('.') => {
            return Err(format!(
                "{text:?}: a size is a whole number of its unit (say 1536M for 1.5G)"
            ));
        }
        _ => return Err(format!("{text:?}: unknown unit (say 512M or 2G)")),
    };
    let bytes = number
        .checked_mul(1u64 << shift)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| format!("{text:?} is too large"))?;
    if bytes < 1 << 20 {
        return Err(format!(
            "{text:?} is too small: a program needs at least 1M"
        ));
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_are_powers_of_1024_and_nonsense_is_refused() {
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("1048576"), Ok(1 << 20));
        assert!(parse_size("1K").unwrap_err().contains("too small"));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("5X").unwrap_err().contains("unknown unit"));
        assert!(
            parse_size("1.5G")
                .unwrap_err()
                .contains("say 1536M for 1.5G")
        );
        assert!(
            parse_size("99999999999T")
                .unwrap_err()
                .contains("too large")
        );
    }
}
