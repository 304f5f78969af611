//! The programs a service runs when it is given no files: the config's `[[serve.programs]]`,
//! each with its arguments, state directory and permissions. Read at the start and again on
//! SIGHUP (a program added starts, one removed stops, one changed restarts).
//!
//! `colony serve` denies by default: a program reaches nothing beyond colony's own calls (model
//! providers, the config's MCP servers) but what its entry allows, in the terms of `colony
//! run`'s `--allow-*` flags (`allow_net = ["api.example.com"]`, `allow_read = ["data"]`,
//! `allow_write = true`, `allow_run = true`, `allow_env = true`, `allow_all = true`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::host::Launch;
use crate::config::{Allow, ServeConfig, ServeProgram};
use crate::permissions::{Grant, Permissions};
use crate::store::state_dir;

/// The config's programs, paths relative to `base` (the config file's folder). `Err` names the
/// entry and the field that is wrong.
pub fn from_config(settings: &ServeConfig, base: &Path) -> Result<Vec<Launch>, String> {
    let launches = settings
        .programs
        .iter()
        .enumerate()
        .map(|(i, p)| launch(p, base).map_err(|e| format!("[[serve.programs]] #{}: {e}", i + 1)))
        .collect::<Result<Vec<_>, _>>()?;
    if let Some((first, second)) = sharing_a_state(&launches) {
        return Err(format!(
            "[[serve.programs]] #{} and #{} would share the state directory {} (the second \
             could not lock it): give one of them a `state` of its own",
            first + 1,
            second + 1,
            launches[second].state.display()
        ));
    }
    Ok(launches)
}

/// The first two launches, by index, that name one state directory: a program's run holds its
/// state directory's lock, so the second of them could never start.
pub fn sharing_a_state(launches: &[Launch]) -> Option<(usize, usize)> {
    let dirs: Vec<PathBuf> = launches
        .iter()
        .map(|l| std::fs::canonicalize(&l.state).unwrap_or_else(|_| l.state.clone()))
        .collect();
    (1..dirs.len()).find_map(|i| dirs[..i].iter().position(|d| *d == dirs[i]).map(|j| (j, i)))
}

/// The config's entry for `file` (the same file once both paths are resolved), if it has one:
/// where `colony mcp serve FILE` finds the permissions `colony serve` would give it.
pub fn entry_for<'a>(
    settings: &'a ServeConfig,
    base: &Path,
    file: &Path,
) -> Option<&'a ServeProgram> {
    let wanted = std::fs::canonicalize(file).ok()?;
    settings
        .programs
        .iter()
        .find(|p| std::fs::canonicalize(base.join(&p.file)).is_ok_and(|f| f == wanted))
}

fn launch(p: &ServeProgram, base: &Path) -> Result<Launch, String> {
    let file = base.join(&p.file);
    let state = p
        .state
        .as_ref()
        .map(|s| base.join(s))
        .unwrap_or_else(|| state_dir::default_for(&file));
    Ok(Launch {
        file,
        args: p.args.clone(),
        state,
        permissions: Arc::new(permissions(p, base)?),
        store: None,
        max_memory: None,
        cluster: None,
    })
}

/// What the entry `p` allows, paths resolved against `base`.
pub fn permissions(p: &ServeProgram, base: &Path) -> Result<Permissions, String> {
    if p.allow_all {
        return Ok(Permissions::all());
    }
    let hosts = grant(p.allow_net.as_ref(), "allow_net", |h| {
        crate::permissions::net_entry(h).map_err(|e| format!("allow_net: {e}"))
    })?;
    let path = |field: &'static str| {
        move |p: &String| {
            if p.trim().is_empty() {
                Err(format!("{field}: an empty path"))
            } else {
                Ok(PathBuf::from(p))
            }
        }
    };
    Ok(Permissions {
        net: hosts,
        read: grant(p.allow_read.as_ref(), "allow_read", path("allow_read"))?,
        write: grant(p.allow_write.as_ref(), "allow_write", path("allow_write"))?,
        run: p.allow_run,
        env: p.allow_env,
    }
    .resolved(base))
}

fn grant<T>(
    allow: Option<&Allow>,
    field: &str,
    item: impl Fn(&String) -> Result<T, String>,
) -> Result<Grant<T>, String> {
    Ok(match allow {
        None | Some(Allow::Every(false)) => Grant::None,
        Some(Allow::Every(true)) => Grant::All,
        Some(Allow::Only(list)) if list.is_empty() => {
            return Err(format!(
                "{field} = [] allows nothing: leave it out, or say true for everything"
            ));
        }
        Some(Allow::Only(list)) => Grant::Only(list.iter().map(item).collect::<Result<_, _>>()?),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn program(toml_text: &str) -> ServeProgram {
        toml::from_str(toml_text).expect("an entry")
    }

    #[test]
    fn an_entry_grants_nothing_but_what_it_allows() {
        let base = Path::new("/srv/colony");
        let none = permissions(&program("file = \"a.lua\""), base).unwrap();
        assert_eq!(none, Permissions::none());
        let some = permissions(
            &program(
                "file = \"a.lua\"\nallow_net = [\"API.example.com\"]\nallow_write = [\"out\"]\nallow_read = true\nallow_env = true",
            ),
            base,
        )
        .unwrap();
        assert_eq!(some.net, Grant::Only(vec!["api.example.com".to_string()]));
        assert_eq!(
            some.write,
            Grant::Only(vec![PathBuf::from("/srv/colony/out")])
        );
        assert_eq!(some.read, Grant::All);
        assert!(some.env && !some.run);
        let all = permissions(&program("file = \"a.lua\"\nallow_all = true"), base).unwrap();
        assert!(all.is_all());
    }

    #[test]
    fn a_wrong_entry_names_its_number_and_field() {
        let settings: ServeConfig = toml::from_str(
            "[[programs]]\nfile = \"a.lua\"\n[[programs]]\nfile = \"b.lua\"\nallow_net = [\"http://x/\"]",
        )
        .unwrap();
        let err = from_config(&settings, Path::new("/srv")).unwrap_err();
        assert!(
            err.starts_with("[[serve.programs]] #2: allow_net:"),
            "{err}"
        );
        let settings: ServeConfig =
            toml::from_str("[[programs]]\nfile = \"a.lua\"\nallow_read = []").unwrap();
        let err = from_config(&settings, Path::new("/srv")).unwrap_err();
        assert!(err.contains("allow_read = [] allows nothing"), "{err}");
        // Neither a number nor a table: the config itself refuses it.
        assert!(toml::from_str::<ServeProgram>("file = \"a.lua\"\nallow_run = \"yes\"").is_err());
        // A path where a list is meant is told what is expected (it was "data did not match
        // any variant of untagged enum Allow").
        let err = toml::from_str::<ServeProgram>("file = \"a.lua\"\nallow_write = \"pages.log\"")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("expected true, false or a list of strings"),
            "{err}"
        );
    }
}
