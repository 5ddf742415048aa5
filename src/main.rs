//! The `fencegate` binary: parses the command line and hands over to `cli`.

use clap::Parser;

fn main() {
    let args = fencegate::Cli::parse();
    std::process::exit(fencegate::run(args));
}
