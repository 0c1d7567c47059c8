//! The `talosctl` binary: parses the command line and hands it to the library.

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = talosctl::Cli::parse();
    talosctl::init_logging();
    talosctl::exit_code(talosctl::run(cli))
}
