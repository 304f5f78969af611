//! Lists the example programs (`examples/*.lua`) for `runtime/shipped.rs` to compile in, so an
//! example added to the folder is known to `colony ask` without a list kept by hand.

use std::fmt::Write;

fn main() {
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
