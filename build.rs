//! Lists the example programs (`examples/*.lua`) for `runtime/shipped.rs` to compile in, so an
//! example added to the folder is known to `colony ask` without a list kept by hand; and, on
//! Linux, has a release `colony` binary's line tables compressed at link time.

use std::fmt::Write;

fn main() {
    compress_line_tables();
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

/// A release binary keeps its line tables (`debug = "line-tables-only"` in Cargo.toml), so a
/// panic's backtrace names file:line, but uncompressed they are four fifths of the binary that
/// `cargo install` puts on disk. The linker compresses them with zlib, which std's backtrace
/// reads (it does not read zstd-compressed sections: their frames lose their file:line). Only
/// the `colony` binary's link is affected; nothing is compiled differently.
fn compress_line_tables() {
    let release = std::env::var("PROFILE").as_deref() == Ok("release");
    let linux = std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux");
    if release && linux {
        println!("cargo::rustc-link-arg-bins=-Wl,--compress-debug-sections=zlib");
    }
}
