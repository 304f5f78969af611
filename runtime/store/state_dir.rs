//! Where a program's state lives, and the lock that keeps it to one process at a time.
//!
//! A program's state directory is `$XDG_STATE_HOME/colony/<script stem>-<hash>` by default
//! ([`default_for`]), with `<hash>` the first 12 hex digits of the SHA-256 of the script's
//! absolute path: two scripts of the same name in different folders keep apart, and moving a
//! script starts it afresh. Inside:
//!
//! - `lock`: locked exclusively while a process uses the directory; it holds that process's pid
//!   and command line, for the message a second process gets;
//! - `store.sqlite3` (and SQLite's `-wal`/`-shm` beside it while open): the [`SqliteStore`].

use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Seek, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use sha2::{Digest, Sha256};

use super::sqlite::SqliteStore;
use super::{Store, StoreError, StoreResult};

/// The lock file's name inside a state directory.
pub const LOCK_FILE: &str = "lock";
/// The store's file name inside a state directory.
pub const STORE_FILE: &str = "store.sqlite3";

/// The state directory of a replay (`colony run --replay` without `--state`), made for this
/// run and removed at its end, however it ends: [`remove_scratch`] is also called where the
/// process is ended at once (`os.exit`, the last resort after a signal), which left one in the
/// temp directory at every such run.
static SCRATCH: std::sync::Mutex<Option<PathBuf>> = std::sync::Mutex::new(None);

/// A fresh state directory for this process's run, in the temp directory, removed by
/// [`remove_scratch`].
pub fn scratch() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("colony-replay-{}", std::process::id()));
    *SCRATCH.lock().unwrap_or_else(|e| e.into_inner()) = Some(dir.clone());
    dir
}

/// Removes the directory [`scratch`] gave, if any (once; nothing after).
pub fn remove_scratch() {
    let dir = SCRATCH.lock().unwrap_or_else(|e| e.into_inner()).take();
    if let Some(dir) = dir {
        let _ = std::fs::remove_dir_all(dir);
    }
}

/// The default state directory for `script`: `<state home>/colony/<stem>-<hash>` where the state
/// home is `$XDG_STATE_HOME`, else `~/.local/state` (else the temp directory, on a machine with
/// no home).
pub fn default_for(script: &Path) -> PathBuf {
    default_under(&state_home(), script)
}

/// The user's state home: `$XDG_STATE_HOME`, else `~/.local/state` (else the temp directory, on
/// a machine with no home). colony's own state lives in its `colony` folder.
pub fn state_home() -> PathBuf {
    dirs::state_dir()
        .or_else(|| dirs::home_dir().map(|h| h.join(".local").join("state")))
        .unwrap_or_else(std::env::temp_dir)
}

/// [`default_for`] with the state home given: `<state_home>/colony/<stem>-<hash>`, both of the
/// script's canonical path (symlinks resolved), so a program run through a link and by its own
/// name keeps one state. A directory an older colony named after the link is still used.
pub fn default_under(state_home: &Path, script: &Path) -> PathBuf {
    let root = state_home.join("colony");
    let canonical = std::fs::canonicalize(script).ok();
    let hash = path_hash(canonical.as_deref(), script);
    let own = root.join(format!(
        "{}-{hash}",
        stem(canonical.as_deref().unwrap_or(script))
    ));
    let as_invoked = root.join(format!("{}-{hash}", stem(script)));
    if as_invoked != own && !own.exists() && as_invoked.join(STORE_FILE).exists() {
        return as_invoked;
    }
    own
}

/// The first 12 hex digits of the SHA-256 of the script's absolute path: the canonical one
/// when the script exists.
fn path_hash(canonical: Option<&Path>, script: &Path) -> String {
    let absolute = canonical
        .map(Path::to_path_buf)
        .or_else(|| std::path::absolute(script).ok())
        .unwrap_or_else(|| script.to_path_buf());
    let digest = Sha256::digest(absolute.as_os_str().as_encoded_bytes());
    digest.iter().take(6).map(|b| format!("{b:02x}")).collect()
}

fn stem(script: &Path) -> String {
    script
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "script".to_string())
}

/// An open state directory: locked by this process until the store is dropped.
#[derive(Debug)]
pub struct StateDir {
    path: PathBuf,
    store: Arc<SqliteStore>,
}

impl StateDir {
    /// Creates `dir` if missing (mode 0700), locks it, and opens its store.
    ///
    /// [`StoreError::Locked`] when another process (or another `StateDir` in this one) holds
    /// it, naming the directory and the holder's pid and command line; the store's own errors
    /// ([`StoreError::TooNew`], [`StoreError::Damaged`], [`StoreError::Io`]) otherwise. The lock
    /// lives as long as the store: it is released when the last `Arc` from [`StateDir::store`]
    /// and the `StateDir` itself are dropped.
    pub fn open(dir: &Path) -> StoreResult<StateDir> {
        create_dir(dir)?;
        let lock = lock(dir)?;
        let store = SqliteStore::open(&dir.join(STORE_FILE))?.hold_lock(lock);
        Ok(StateDir {
            path: dir.to_path_buf(),
            store: Arc::new(store),
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The store (holding the directory's lock).
    pub fn store(&self) -> Arc<SqliteStore> {
        Arc::clone(&self.store)
    }

    /// The store as the trait object the residents use.
    pub fn dyn_store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }
}

fn create_dir(dir: &Path) -> StoreResult<()> {
    let mut builder = std::fs::DirBuilder::new();
    builder.recursive(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    // Neither a file where the folder goes nor a folder this user may not write heals by
    // itself: refused (a service does not retry them; SIGHUP or /restart does once mended).
    // Retried as a store that could not be reached, a file said only "File exists".
    if dir.exists() && !dir.is_dir() {
        return Err(StoreError::Refused(format!(
            "the state directory {} is a file, not a folder: give the program's state a folder",
            dir.display()
        )));
    }
    // A link to a folder not there (a volume not mounted yet) said only "File exists". Not
    // refused: the folder may appear (a service tries again).
    if let Ok(target) = std::fs::read_link(dir)
        && !dir.exists()
    {
        return Err(StoreError::Io(format!(
            "the state directory {} is a link to {}, which is not there (a volume not mounted?)",
            dir.display(),
            target.display()
        )));
    }
    builder.create(dir).map_err(|e| {
        let message = format!("cannot create the state directory {}: {e}", dir.display());
        match e.kind() {
            std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem => {
                StoreError::Refused(format!("{message} (this user may not write there)"))
            }
            _ => StoreError::Io(message),
        }
    })
}

/// The locks a process holds on a state directory while it uses it: its `lock` file (which
/// says who holds it) and the folder itself. The folder's is what a removed lock file cannot
/// undo: "in use by process N" sends people to delete the file, and a second process then
/// took a new one and shared the store, each overwriting the other's saves.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
    _folder: Option<File>,
}

/// Takes the exclusive locks on `dir/lock` and on `dir`, and writes this process into the file.
fn lock(dir: &Path) -> StoreResult<DirLock> {
    let path = dir.join(LOCK_FILE);
    let io = |doing: &str, e: std::io::Error| {
        let message = format!("{}: cannot {doing}: {e}", path.display());
        match e.kind() {
            // A folder this user may not write does not heal by itself (see `create_dir`).
            std::io::ErrorKind::PermissionDenied | std::io::ErrorKind::ReadOnlyFilesystem => {
                StoreError::Refused(format!("{message} (this user may not write there)"))
            }
            _ => StoreError::Io(message),
        }
    };
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| io("open the lock file", e))?;
    let said = || std::fs::read_to_string(&path).unwrap_or_default();
    if !take(&file, || holder_pid(&said())).map_err(|e| io("lock it", e))? {
        return Err(StoreError::Locked(format!(
            "{} is in use by {}",
            dir.display(),
            holder(&said())
        )));
    }
    // The lock file was free but the folder is not: the holder's lock file was removed. Not
    // waited for (a fork of ours shared both locks and was waited out above). A file system
    // that cannot lock a folder (NFS emulates flock with locks a read-only descriptor cannot
    // take) keeps the lock file alone, as before.
    let folder = File::open(dir).ok();
    if let Some(folder) = &folder {
        match take(folder, || Some(0)) {
            Ok(true) => {}
            Ok(false) => {
                return Err(StoreError::Locked(format!(
                    "{} is in use by another process, whose lock file was removed (it still \
                     holds the folder; stop it before starting another)",
                    dir.display()
                )));
            }
            Err(e) => tracing::debug!("{}: the folder cannot be locked: {e}", dir.display()),
        }
    }
    let me = format!("{}\n{}\n", std::process::id(), command_line());
    file.set_len(0).map_err(|e| io("write it", e))?;
    file.rewind().map_err(|e| io("write it", e))?;
    file.write_all(me.as_bytes())
        .map_err(|e| io("write it", e))?;
    Ok(DirLock {
        _file: file,
        _folder: folder,
    })
}

/// Takes `file`'s exclusive lock: `Ok(false)` when another holds it. One this process holds
/// (`holder` names this pid) is waited for a moment: a store of ours just closed, but a child
/// this process was starting at that moment still shares the lock until it `exec`s (`flock`
/// follows the open file, which a fork duplicates). That lasts an instant; a `StateDir` of ours
/// that is still open does not, and is refused.
fn take(file: &File, holder: impl Fn() -> Option<u32>) -> std::io::Result<bool> {
    let mut waited = Duration::ZERO;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(true),
            Err(TryLockError::WouldBlock) => {
                let ours = holder().is_none_or(|pid| pid == std::process::id());
                if ours && waited < SELF_HELD_WAIT {
                    std::thread::sleep(SELF_HELD_POLL);
                    waited += SELF_HELD_POLL;
                    continue;
                }
                return Ok(false);
            }
            Err(TryLockError::Error(e)) => return Err(e),
        }
    }
}

/// How long a lock this process itself holds is waited for before it is refused, and how often
/// it is tried meanwhile.
const SELF_HELD_WAIT: Duration = Duration::from_secs(1);
const SELF_HELD_POLL: Duration = Duration::from_millis(10);

/// The pid a lock file names.
fn holder_pid(text: &str) -> Option<u32> {
    text.lines().next()?.trim().parse().ok()
}

/// "process 1234 (colony run watcher.lua)" from a lock file's text.
fn holder(text: &str) -> String {
    let mut lines = text.lines();
    let pid = lines.next().map(str::trim).unwrap_or("");
    let command = lines.next().map(str::trim).unwrap_or("");
    match (pid.parse::<u32>(), command.is_empty()) {
        (Ok(pid), false) => format!("process {pid} ({command})"),
        (Ok(pid), true) => format!("process {pid}"),
        (Err(_), _) => "another process".to_string(),
    }
}

/// This process's command line, the program by its file name: `colony run watcher.lua`.
fn command_line() -> String {
    let mut args = std::env::args_os();
    let program = args
        .next()
        .map(|p| {
            Path::new(&p)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| p.to_string_lossy().into_owned())
        })
        .unwrap_or_default();
    std::iter::once(program)
        .chain(args.map(|a| a.to_string_lossy().into_owned()))
        .collect::<Vec<_>>()
        .join(" ")
        .replace('\n', " ")
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn default_dir_is_stem_and_hash_of_the_absolute_path() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("watcher.lua");
        std::fs::write(&script, "").unwrap();
        let home = Path::new("/state/home");
        let got = default_under(home, &script);
        let absolute = std::fs::canonicalize(&script).unwrap();
        let digest = Sha256::digest(absolute.as_os_str().as_encoded_bytes());
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            got,
            home.join("colony").join(format!("watcher-{}", &hex[..12]))
        );
        // A relative path to the same file lands in the same place.
        let other = dir.path().join("sub");
        std::fs::create_dir(&other).unwrap();
        let relative = other.join("..").join("watcher.lua");
        assert_eq!(default_under(home, &relative), got);
        // The same name elsewhere does not.
        let elsewhere = other.join("watcher.lua");
        std::fs::write(&elsewhere, "").unwrap();
        assert_ne!(default_under(home, &elsewhere), got);
    }

    #[test]
    fn a_script_run_through_a_link_keeps_the_state_of_its_own_name() {
        let dir = tempfile::tempdir().unwrap();
        let script = dir.path().join("watcher.lua");
        std::fs::write(&script, "").unwrap();
        let link = dir.path().join("w.lua");
        std::os::unix::fs::symlink(&script, &link).unwrap();
        let home = dir.path().join("home");
        let own = default_under(&home, &script);
        assert_eq!(default_under(&home, &link), own);
        // A directory an older colony named after the link, holding a store, is still found.
        let old = own.with_file_name(
            own.file_name()
                .unwrap()
                .to_string_lossy()
                .replacen("watcher", "w", 1),
        );
        std::fs::create_dir_all(&old).unwrap();
        std::fs::write(old.join(STORE_FILE), "").unwrap();
        assert_eq!(default_under(&home, &link), old);
        assert_eq!(default_under(&home, &script), own);
    }

    #[test]
    fn open_creates_the_directory_private_and_the_store() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("a").join("b");
        let state = StateDir::open(&dir).unwrap();
        assert_eq!(state.path(), dir);
        assert!(dir.join(STORE_FILE).is_file());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o700);
        }
        let text = std::fs::read_to_string(dir.join(LOCK_FILE)).unwrap();
        let first = text.lines().next().unwrap();
        assert_eq!(first, std::process::id().to_string());
        state.store().set("", "k", &json!(1)).unwrap();
        assert_eq!(state.dyn_store().get("", "k").unwrap(), Some(json!(1)));
    }

    /// A file where the state directory goes is refused for what it is (it said "File exists",
    /// and `colony serve` retried it for good as a store it could not reach).
    #[test]
    fn a_file_for_a_state_directory_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let file = root.path().join("state");
        std::fs::write(&file, "").unwrap();
        let Err(err) = StateDir::open(&file) else {
            panic!("a file for a state directory was taken")
        };
        assert_eq!(err.kind(), "refused", "{err}");
        assert_eq!(
            err.to_string(),
            format!(
                "the state directory {} is a file, not a folder: give the program's state a \
                 folder",
                file.display()
            )
        );
    }

    /// A link to a folder that is not there (a volume not mounted yet) is named with its
    /// target: it said "cannot create the state directory: File exists".
    #[test]
    fn a_link_to_a_folder_not_there_is_named() {
        let root = tempfile::tempdir().unwrap();
        let link = root.path().join("state");
        std::os::unix::fs::symlink(root.path().join("volume"), &link).unwrap();
        let err = StateDir::open(&link).unwrap_err();
        assert!(
            err.to_string().contains(&format!(
                "is a link to {}, which is not there",
                root.path().join("volume").display()
            )),
            "{err}"
        );
        std::fs::create_dir(root.path().join("volume")).unwrap();
        drop(StateDir::open(&link).unwrap());
    }

    #[test]
    fn a_second_open_is_locked_until_the_first_store_is_dropped() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("state");
        let first = StateDir::open(&dir).unwrap();
        let err = StateDir::open(&dir).unwrap_err();
        assert_eq!(err.kind(), "locked");
        let expected_start = format!(
            "{} is in use by process {} (",
            dir.display(),
            std::process::id()
        );
        assert!(err.to_string().starts_with(&expected_start), "{err}");

        // The lock follows the store, not the StateDir value.
        let store = first.store();
        drop(first);
        assert_eq!(StateDir::open(&dir).unwrap_err().kind(), "locked");
        drop(store);
        let again = StateDir::open(&dir).unwrap();
        drop(again);
    }

    /// A lock this process holds only for an instant (a store closing while a child of ours
    /// was between fork and exec, sharing it) is waited for rather than refused.
    #[test]
    fn a_lock_this_process_lets_go_of_is_waited_for() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("state");
        let first = StateDir::open(&dir).unwrap();
        let (release, held) = std::sync::mpsc::channel::<()>();
        let closer = std::thread::spawn(move || {
            held.recv().unwrap();
            // Let the second open find it held first.
            std::thread::sleep(Duration::from_millis(50));
            drop(first);
        });
        release.send(()).unwrap();
        let second = StateDir::open(&dir).unwrap();
        closer.join().unwrap();
        drop(second);
    }

    /// "in use by process N" sends people to delete the lock file: a second process then took
    /// a new one and shared the store, each overwriting the other's saves. The folder's own
    /// lock still refuses it.
    #[test]
    fn a_removed_lock_file_does_not_let_a_second_open_in() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("state");
        let first = StateDir::open(&dir).unwrap();
        std::fs::remove_file(dir.join(LOCK_FILE)).unwrap();
        let err = StateDir::open(&dir).unwrap_err();
        assert_eq!(err.kind(), "locked");
        assert!(
            err.to_string().contains("whose lock file was removed"),
            "{err}"
        );
        drop(first);
        drop(StateDir::open(&dir).unwrap());
    }

    /// A state directory moved (or deleted) under an open store: later writes are refused,
    /// saying so, where each was answered as saved into a file nothing could reach again.
    #[test]
    fn a_store_whose_folder_was_moved_refuses_to_write() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("state");
        let state = StateDir::open(&dir).unwrap();
        std::fs::rename(&dir, root.path().join("moved")).unwrap();
        let err = state.store().set("", "k", &json!(1)).unwrap_err();
        assert_eq!(err.kind(), "refused", "{err}");
        assert!(
            err.to_string()
                .contains("was deleted, moved or replaced while this program had it open"),
            "{err}"
        );
        // And stays refused, though nothing is looked at again within the second.
        assert_eq!(
            state.store().set("", "k", &json!(2)).unwrap_err().kind(),
            "refused"
        );
    }

    #[test]
    fn holder_reads_the_lock_file() {
        assert_eq!(
            holder("1234\ncolony run watcher.lua\n"),
            "process 1234 (colony run watcher.lua)"
        );
        assert_eq!(holder("1234\n"), "process 1234");
        assert_eq!(holder(""), "another process");
    }
}
