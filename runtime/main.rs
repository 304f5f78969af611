//! The `colony` binary: see `colony --help`.

/// mimalloc rather than the system's malloc: a step allocates and frees a few hundred small
/// blocks (strings, JSON values, Lua's own objects), and with mimalloc it takes about a sixth
/// fewer instructions (callgrind on `benches/peers`: 198 K a step against 243 K).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    colony::cli::main()
}
