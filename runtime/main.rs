//! The `colony` binary: see `colony --help`.

/// mimalloc rather than the system's malloc: the small blocks a step allocates and frees (JSON
/// values, strings, Lua's own objects) cost about half as many instructions.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    colony::cli::main()
}
