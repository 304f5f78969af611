//! Lists the example programs (`examples/*.lua`) for `runtime/shipped.rs` to compile in, so an
//! example added to the folder is known to `colony ask` without a list kept by hand; and, on
//! Linux, has a release `colony` binary linked small (see `shrink_release_binary`).

use std::fmt::Write;

fn main() {
    shrink_release_binary();
    println!("cargo::rerun-if-changed=examples");
    let mut names: Vec<String> = std::fs::read_dir("examples")
        .expect("the examples folder")
        .filter_map(|e| {
            let name = e.ok()?.file_name().to_string_lossy().into_owned();
            name.ends_with(".lua").then_some(name)
        })
        .collect();
    names.sort();
    let mut list = String::from("&[\n");
    for name in names {
        let _ = writeln!(
            list,
            "    Shipped {{ file: {name:?}, source: include_str!(concat!(env!(\"CARGO_MANIFEST_DIR\"), \"/examples/{name}\")) }},"
        );
    }
    list.push_str("]\n");
    let out = std::path::Path::new(&std::env::var("OUT_DIR").expect("OUT_DIR")).join("examples.rs");
    std::fs::write(out, list).expect("write the examples list");
}

/// What `cargo install` puts on disk, kept small while a panic's backtrace still names
/// file:line and function. Cargo.toml splits colony's debug info (`split-debuginfo =
/// "unpacked"`, DWARF 5 by .cargo/config.toml): the binary keeps the line table of colony's code
/// (with what it inlines), which gives colony's frames their file:line; the function names and
/// the inlined frames are in a `.dwo` file under `target/`, named by its absolute path. The
/// link, on Linux, for the `colony` binary only (examples and benches keep everything, so a
/// profiler names their functions):
/// - compresses the debug sections with zlib, which std's backtrace reads (it does not read
///   zstd: frames in zstd-compressed sections lose their file:line);
/// - drops the local symbols (`--discard-all`, 4 MB: the names of every Rust function after
///   LTO). A frame's name comes from the `.dwo` instead; without it (after `cargo clean`, or a
///   binary copied to another machine) frames keep their file:line and read `<unknown>`, and
///   so do a dependency's frames, which have no debug info. std's short backtrace finds its
///   ends by two function names, so colony prints it itself (`cli::panic`).
///   `COLONY_KEEP_SYMBOLS=1` at build time keeps them, for a profiler;
/// - packs relative relocations (`-z pack-relative-relocs`, 1 MB less), where the C library
///   applies them (glibc 2.36 and later; an older one refuses to start such a binary).
fn shrink_release_binary() {
    println!("cargo::rerun-if-env-changed=COLONY_KEEP_SYMBOLS");
    let release = std::env::var("PROFILE").as_deref() == Ok("release");
    let linux = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux");
    if !(release && linux) {
        return;
    }
    println!("cargo::rustc-link-arg-bins=-Wl,--compress-debug-sections=zlib");
    if std::env::var_os("COLONY_KEEP_SYMBOLS").is_none_or(|v| v.is_empty() || v == "0") {
        println!("cargo::rustc-link-arg-bins=-Wl,--discard-all");
    }
    if glibc_reads_relr() {
        println!("cargo::rustc-link-arg-bins=-Wl,-z,pack-relative-relocs");
    }
}

/// Whether the binary is built for this machine and its glibc is 2.36 or later, the first to
/// apply packed relative relocations (DT_RELR). Unknown (a cross build, musl, no `getconf`)
/// means no.
fn glibc_reads_relr() -> bool {
    let native = std::env::var("HOST").ok() == std::env::var("TARGET").ok();
    let gnu = std::env::var("CARGO_CFG_TARGET_ENV").as_deref() == Ok("gnu");
    if !(native && gnu) {
        return false;
    }
    let Ok(out) = std::process::Command::new("getconf")
        .arg("GNU_LIBC_VERSION")
        .output()
    else {
        return false;
    };
    // "glibc 2.36"
    let text = String::from_utf8_lossy(&out.stdout);
    let mut version = text.trim().trim_start_matches("glibc ").split('.');
    let major: u32 = version.next().and_then(|v| v.parse().ok()).unwrap_or(0);
    let minor: u32 = version.next().and_then(|v| v.parse().ok()).unwrap_or(0);
    (major, minor) >= (2, 36)
}
