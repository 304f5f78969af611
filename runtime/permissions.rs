//! What a program may reach beyond colony's own calls, in Deno's terms: the network from Lua
//! `http`, files read or written through `fs`, `io` and attached files, processes (`os.execute`,
//! `io.popen`, `proc.run`, stdio MCP servers a script starts itself, binary chunks given to
//! `load`), and the environment (`os.getenv`).
//!
//! Model providers and the MCP servers in the config are colony's own calls: always reachable.
//! `colony run FILE` grants everything unless an `--allow-*` flag or `--sandbox` is given; then
//! only what is allowed. A refusal names the flag that would grant it
//! (`fs.read: reading /etc/passwd needs --allow-read=/etc/passwd`).
//!
//! Paths are resolved before they are checked: `..` is taken after the symlinks before it are
//! followed, as the operating system would, so neither a `..` nor a symlink inside an allowed
//! folder reaches outside it.

use std::path::{Component, Path, PathBuf};

/// What is granted of one kind of access.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Grant<T> {
    /// Nothing.
    None,
    /// Everything.
    All,
    /// These only (hosts, or folders and files).
    Only(Vec<T>),
}

impl<T> Grant<T> {
    fn is_all(&self) -> bool {
        matches!(self, Grant::All)
    }
}

/// A program's permissions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Permissions {
    /// Hosts the script's `http` may reach (`host` or `host:port`).
    pub net: Grant<String>,
    /// Files and folders the script may read.
    pub read: Grant<PathBuf>,
    /// Files and folders the script may write.
    pub write: Grant<PathBuf>,
    /// Whether the script may start processes.
    pub run: bool,
    /// Whether the script may read the environment.
    pub env: bool,
}

impl Default for Permissions {
    /// Everything: what `colony run FILE` gives a program without `--allow-*` or `--sandbox`.
    fn default() -> Permissions {
        Permissions::all()
    }
}

/// A use the program's permissions do not grant; its text names the flag that would.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{who}: {what} needs {flag}")]
pub struct Denied {
    /// The function refused (`fs.read`, `http.get`, `os.execute`).
    pub who: String,
    /// What it was asked to do (`reading /etc/passwd`).
    pub what: String,
    /// The flag to grant it (`--allow-read=/etc/passwd`).
    pub flag: String,
}

/// Reading or writing a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

impl Permissions {
    /// Everything granted.
    pub fn all() -> Permissions {
        Permissions {
            net: Grant::All,
            read: Grant::All,
            write: Grant::All,
            run: true,
            env: true,
        }
    }

    /// Nothing granted: `--sandbox` without `--allow-*`.
    pub fn none() -> Permissions {
        Permissions {
            net: Grant::None,
            read: Grant::None,
            write: Grant::None,
            run: false,
            env: false,
        }
    }

    /// Whether every permission is granted (then nothing needs checking).
    pub fn is_all(&self) -> bool {
        self.net.is_all() && self.read.is_all() && self.write.is_all() && self.run && self.env
    }

    /// The same permissions with each allowed path resolved (relative to `base`), as checks
    /// compare resolved paths.
    pub fn resolved(mut self, base: &Path) -> Permissions {
        for grant in [&mut self.read, &mut self.write] {
            if let Grant::Only(paths) = grant {
                for p in paths.iter_mut() {
                    *p = resolve(&base.join(&*p));
                }
            }
        }
        self
    }

    /// Checks that `who` may read or write `path`; answers the path resolved (the one to use, so
    /// a symlink swapped in between is still the checked one where the caller opens it).
    pub fn check_path(&self, who: &str, access: Access, path: &Path) -> Result<PathBuf, Denied> {
        if self.paths(access).is_all() {
            return Ok(path.to_path_buf());
        }
        self.check_resolved(who, access, resolve(path))
    }

    fn paths(&self, access: Access) -> &Grant<PathBuf> {
        match access {
            Access::Read => &self.read,
            Access::Write => &self.write,
        }
    }

    fn check_resolved(
        &self,
        who: &str,
        access: Access,
        resolved: PathBuf,
    ) -> Result<PathBuf, Denied> {
        let allowed = match self.paths(access) {
            Grant::All => true,
            Grant::None => false,
            Grant::Only(paths) => paths.iter().any(|p| resolved.starts_with(p)),
        };
        if allowed {
            return Ok(resolved);
        }
        let (verb, flag) = match access {
            Access::Read => ("reading", "--allow-read"),
            Access::Write => ("writing", "--allow-write"),
        };
        Err(Denied {
            who: who.to_string(),
            what: format!("{verb} {}", resolved.display()),
            flag: format!("{flag}={}", resolved.display()),
        })
    }

    /// Checks that `who` may change the directory entry `path` itself (`os.remove`,
    /// `os.rename`): its folder resolved, its last name not followed, since removing or renaming
    /// a symlink changes the link, not what it points to.
    pub fn check_entry(&self, who: &str, access: Access, path: &Path) -> Result<PathBuf, Denied> {
        if self.paths(access).is_all() {
            return Ok(path.to_path_buf());
        }
        let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
        match (absolute.parent(), absolute.file_name()) {
            (Some(folder), Some(name)) => {
                self.check_resolved(who, access, resolve(folder).join(name))
            }
            _ => self.check_path(who, access, path),
        }
    }

    /// Checks that `who` may reach `url`'s host.
    pub fn check_net(&self, who: &str, url: &reqwest::Url) -> Result<(), Denied> {
        let host = url.host_str().unwrap_or_default().to_ascii_lowercase();
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let port = url.port_or_known_default();
        let allowed = match &self.net {
            Grant::All => true,
            Grant::None => false,
            Grant::Only(hosts) => hosts.iter().any(|h| host_matches(h, host, port)),
        };
        if allowed {
            return Ok(());
        }
        // An IPv6 address is written in brackets, as a URL writes it: `::1:8080` would read
        // as an address of its own.
        let bracketed = if host.contains(':') {
            format!("[{host}]")
        } else {
            host.to_string()
        };
        let named = match url.port() {
            Some(p) => format!("{bracketed}:{p}"),
            None => bracketed,
        };
        Err(Denied {
            who: who.to_string(),
            what: format!("reaching {named}"),
            flag: format!("--allow-net={named}"),
        })
    }

    /// Checks that `who` may start a process (`what` says which, for the message).
    pub fn check_run(&self, who: &str, what: &str) -> Result<(), Denied> {
        if self.run {
            return Ok(());
        }
        Err(Denied {
            who: who.to_string(),
            what: what.to_string(),
            flag: "--allow-run".into(),
        })
    }

    /// Checks that `who` may read the environment variable `name`.
    pub fn check_env(&self, who: &str, name: &str) -> Result<(), Denied> {
        if self.env {
            return Ok(());
        }
        Err(Denied {
            who: who.to_string(),
            what: format!("reading {name}"),
            flag: "--allow-env".into(),
        })
    }
}

/// An `--allow-net` entry (`host`, `host:port`, `[::1]:8080`, or a bare IPv6 address, `::1`)
/// checked and lowercased; the error says what is wrong with it. A port past 65535 read as no
/// port at all, so `127.0.0.1:99999` (a typo for 9999) admitted every port of the host; a URL
/// or a broken address admitted nothing without a word.
pub fn net_entry(text: &str) -> Result<String, String> {
    let entry = text.trim().to_ascii_lowercase();
    let wrong = |why: &str| Err(format!("{text:?} is not a host or host:port: {why}"));
    if entry.is_empty() {
        return wrong("it is empty");
    }
    if entry.contains("://") || entry.contains('/') {
        return wrong("give the host alone (\"api.example.com\", \"127.0.0.1:8080\"), not a URL");
    }
    if entry.parse::<std::net::Ipv6Addr>().is_ok() {
        return Ok(entry);
    }
    let (host, port) = if let Some(rest) = entry.strip_prefix('[') {
        let Some((address, after)) = rest.split_once(']') else {
            return wrong("a '[' without its ']'");
        };
        if address.parse::<std::net::Ipv6Addr>().is_err() {
            return wrong("what is in brackets is not an IPv6 address");
        }
        match after {
            "" => (address, None),
            _ => match after.strip_prefix(':') {
                Some(port) => (address, Some(port)),
                None => return wrong("after ']' comes ':' and a port"),
            },
        }
    } else {
        match entry.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (entry.as_str(), None),
        }
    };
    if host.is_empty() {
        return wrong("no host before the port");
    }
    if !entry.starts_with('[')
        && !host
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
    {
        return wrong("a host name is letters, digits, '.', '-' and '_'");
    }
    if let Some(port) = port {
        match port.parse::<u16>() {
            Ok(p) if p > 0 && port.bytes().all(|b| b.is_ascii_digit()) => {}
            _ => return wrong(&format!("the port {port:?} is not one (1 to 65535)")),
        }
    }
    Ok(entry)
}

/// Whether an allowed entry (`host` or `host:port`, `[::1]:8080` for IPv6, or a bare IPv6
/// address, `::1`) admits `host` and `port`. Addresses are compared as addresses
/// (`0:0:0:0:0:0:0:1` is `::1`).
fn host_matches(allowed: &str, host: &str, port: Option<u16>) -> bool {
    let allowed = allowed.trim().to_ascii_lowercase();
    if let Ok(ip) = allowed.parse::<std::net::Ipv6Addr>() {
        return host.parse::<std::net::Ipv6Addr>() == Ok(ip);
    }
    let (name, want_port) = match allowed.rsplit_once(':') {
        Some((h, p)) if !h.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) && !p.is_empty() => {
            // A port that is not one admits nothing (never every port): `net_entry` refuses
            // it before it gets here.
            let Ok(p) = p.parse::<u16>() else {
                return false;
            };
            (h.to_string(), Some(p))
        }
        _ => (allowed.clone(), None),
    };
    let name = name.trim_start_matches('[').trim_end_matches(']');
    let same = match (
        name.parse::<std::net::IpAddr>(),
        host.parse::<std::net::IpAddr>(),
    ) {
        (Ok(a), Ok(b)) => a == b,
        _ => name == host,
    };
    same && want_port.is_none_or(|p| Some(p) == port)
}

/// How many symlinks [`resolve`] follows through paths that do not exist yet (the kernel's
/// own limit is 40).
const MAX_LINKS: u32 = 40;

/// `path` made absolute and resolved as the operating system would: symlinks followed as far
/// as the path exists, `..` taken after the symlinks before it, the part that does not exist yet
/// kept as written. A dangling symlink is followed too: writing through it creates its target,
/// which is the path to check.
pub fn resolve(path: &Path) -> PathBuf {
    resolve_within(path, &mut 0)
}

/// `links`: the dangling links followed so far in this lookup, all of its branches counted (a
/// link `a -> a/../a`, counted per branch, took 2^40 lookups).
fn resolve_within(path: &Path, links: &mut u32) -> PathBuf {
    let absolute = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut out = PathBuf::new();
    for component in absolute.components() {
        match component {
            Component::Prefix(_) | Component::RootDir => out.push(component),
            Component::CurDir => {}
            Component::ParentDir => {
                out = canonical_prefix(&out, links);
                out.pop();
            }
            Component::Normal(name) => out.push(name),
        }
    }
    canonical_prefix(&out, links)
}

/// `path` with its longest existing prefix canonicalised and the rest appended as it is; a
/// dangling symlink on the way is replaced by its target, resolved in turn.
fn canonical_prefix(path: &Path, links: &mut u32) -> PathBuf {
    let mut existing = path.to_path_buf();
    let mut rest = Vec::new();
    loop {
        if let Ok(canonical) = existing.canonicalize() {
            let mut out = canonical;
            out.extend(rest.iter().rev());
            return out;
        }
        let dangling = *links < MAX_LINKS
            && existing
                .symlink_metadata()
                .is_ok_and(|m| m.file_type().is_symlink());
        if let Some(target) = dangling
            .then(|| std::fs::read_link(&existing).ok())
            .flatten()
        {
            // A relative target is relative to the link's folder; `join` keeps an absolute one.
            let mut next = existing
                .parent()
                .map(Path::to_path_buf)
                .unwrap_or_default()
                .join(target);
            next.extend(rest.iter().rev());
            *links += 1;
            return resolve_within(&next, links);
        }
        match existing.file_name() {
            Some(name) => {
                rest.push(name.to_os_string());
                existing.pop();
            }
            None => return path.to_path_buf(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_allow_net_entry_is_a_host_or_host_and_port_and_nothing_else() {
        for good in [
            "example.com",
            "API.Example.com:443",
            "127.0.0.1:8080",
            "::1",
            "[::1]",
            "[::1]:8080",
            "my_host",
        ] {
            assert!(net_entry(good).is_ok(), "{good}");
        }
        assert_eq!(net_entry(" API.example.com ").unwrap(), "api.example.com");
        for (bad, says) in [
            (
                "127.0.0.1:99999",
                "the port \"99999\" is not one (1 to 65535)",
            ),
            ("127.0.0.1:65536", "is not one (1 to 65535)"),
            ("127.0.0.1:0", "is not one"),
            ("127.0.0.1:abc", "the port \"abc\""),
            ("127.0.0.1:", "the port \"\""),
            ("http://127.0.0.1:8080", "not a URL"),
            ("example.com/api", "not a URL"),
            ("[::1", "without its ']'"),
            ("[nope]:80", "not an IPv6 address"),
            ("[::1]x", "after ']'"),
            (":8080", "no host"),
            ("exa mple.com", "letters, digits"),
        ] {
            let err = net_entry(bad).expect_err(bad);
            assert!(err.contains(says), "{bad}: {err}");
            assert!(err.contains(&format!("{bad:?}")), "{bad}: {err}");
        }
    }

    /// A port that is not one, had it got past `net_entry`, admits nothing, never every port.
    #[test]
    fn an_entry_with_a_port_past_65535_admits_no_port() {
        assert!(!host_matches("127.0.0.1:99999", "127.0.0.1", Some(18555)));
        assert!(host_matches("127.0.0.1:9999", "127.0.0.1", Some(9999)));
        assert!(host_matches("127.0.0.1", "127.0.0.1", Some(18555)));
    }

    fn only_read(dir: &Path) -> Permissions {
        Permissions {
            read: Grant::Only(vec![dir.to_path_buf()]),
            ..Permissions::none()
        }
        .resolved(Path::new("/"))
    }

    #[test]
    fn a_path_inside_an_allowed_folder_is_granted_and_one_outside_is_not() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), "a").unwrap();
        let p = only_read(dir.path());
        assert!(
            p.check_path("fs.read", Access::Read, &dir.path().join("a.txt"))
                .is_ok()
        );
        let e = p
            .check_path("fs.read", Access::Read, Path::new("/etc/passwd"))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "fs.read: reading /etc/passwd needs --allow-read=/etc/passwd"
        );
        // Reading is granted, writing is not.
        assert!(
            p.check_path("fs.write", Access::Write, &dir.path().join("a.txt"))
                .is_err()
        );
    }

    #[test]
    fn a_link_that_leads_back_through_itself_is_followed_a_bounded_number_of_times() {
        let root = tempfile::tempdir().unwrap();
        // Each `..` used to start a fresh budget of 40 links: 2^40 lookups for this one.
        std::os::unix::fs::symlink("a/../a", root.path().join("a")).unwrap();
        std::os::unix::fs::symlink("b/../b/../b", root.path().join("b")).unwrap();
        let p = only_read(root.path());
        for name in ["a", "b"] {
            // It ends, and what it ends at is checked like any other path.
            let _ = p.check_path("fs.read", Access::Read, &root.path().join(name));
        }
    }

    #[test]
    fn dot_dot_and_symlinks_do_not_escape_an_allowed_folder() {
        let root = tempfile::tempdir().unwrap();
        let allowed = root.path().join("allowed");
        let secret = root.path().join("secret");
        std::fs::create_dir_all(&allowed).unwrap();
        std::fs::create_dir_all(&secret).unwrap();
        std::fs::write(secret.join("key"), "k").unwrap();
        std::os::unix::fs::symlink(&secret, allowed.join("link")).unwrap();
        let p = only_read(&allowed);
        for escape in [
            allowed.join("../secret/key"),
            allowed.join("link/key"),
            allowed.join("link/../allowed/../secret/key"),
            allowed.join("missing/../../secret/key"),
        ] {
            let e = p.check_path("fs.read", Access::Read, &escape).unwrap_err();
            assert!(e.what.contains("secret"), "{escape:?}: {e}");
        }
        // A file not there yet, inside the folder, is inside.
        assert!(
            p.check_path("fs.read", Access::Read, &allowed.join("new/file"))
                .is_ok()
        );
    }

    #[test]
    fn hosts_are_matched_by_name_and_by_port_when_one_is_given() {
        let p = Permissions {
            net: Grant::Only(vec!["example.com".into(), "127.0.0.1:8080".into()]),
            ..Permissions::none()
        };
        let url = |u: &str| reqwest::Url::parse(u).unwrap();
        assert!(
            p.check_net("http.get", &url("https://example.com/x"))
                .is_ok()
        );
        assert!(
            p.check_net("http.get", &url("http://127.0.0.1:8080/"))
                .is_ok()
        );
        let e = p
            .check_net("http.get", &url("http://127.0.0.1:9090/"))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "http.get: reaching 127.0.0.1:9090 needs --allow-net=127.0.0.1:9090"
        );
        assert!(p.check_net("http.get", &url("https://evil.com/")).is_err());
    }

    #[test]
    fn an_ipv6_address_is_allowed_bare_or_in_brackets_and_named_in_brackets() {
        let url = |u: &str| reqwest::Url::parse(u).unwrap();
        let allow = |h: &str| Permissions {
            net: Grant::Only(vec![h.into()]),
            ..Permissions::none()
        };
        for entry in ["::1", "[::1]", "0:0:0:0:0:0:0:1", "[::1]:8080"] {
            assert!(
                allow(entry)
                    .check_net("http.get", &url("http://[::1]:8080/"))
                    .is_ok(),
                "{entry}"
            );
        }
        assert!(
            allow("[::1]:8080")
                .check_net("http.get", &url("http://[::1]:9090/"))
                .is_err()
        );
        assert!(
            allow("::1")
                .check_net("http.get", &url("http://[::2]/"))
                .is_err()
        );
        let e = Permissions::none()
            .check_net("http.get", &url("http://[::1]:8080/"))
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            "http.get: reaching [::1]:8080 needs --allow-net=[::1]:8080"
        );
        let e = Permissions::none()
            .check_net("http.get", &url("http://[::1]/"))
            .unwrap_err();
        assert!(e.to_string().ends_with("needs --allow-net=[::1]"), "{e}");
    }

    #[test]
    fn run_and_env_name_their_flags() {
        let p = Permissions::none();
        assert_eq!(
            p.check_run("os.execute", "running \"sleep 4\"")
                .unwrap_err()
                .to_string(),
            "os.execute: running \"sleep 4\" needs --allow-run"
        );
        assert_eq!(
            p.check_env("os.getenv", "HOME").unwrap_err().to_string(),
            "os.getenv: reading HOME needs --allow-env"
        );
        assert!(Permissions::all().is_all());
    }
}
