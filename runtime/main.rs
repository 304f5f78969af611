//! The `colony` binary: see `colony --help`.

fn main() -> std::process::ExitCode {
    colony::cli::main()
}
