//! The `fencegate` binary: parses the command line and hands over to `cli`.

fn main() {
    let args = fencegate::Cli::parse_from_env();
    std::process::exit(fencegate::run(args));
}
