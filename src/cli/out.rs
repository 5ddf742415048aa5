//! What the commands print. A reader that goes away early
//! (`fencegate snapshot inspect FILE | head -1`) closes the pipe, and the
//! standard `println!` then panics. This module's `println!` and `print!`
//! shadow the standard ones in every module of `cli` (it is declared first,
//! `#[macro_use]`), so no command can print the other way: a broken pipe
//! ends the process quietly with `exit::BROKEN_PIPE`, as a shell reports a
//! coreutils tool in the same place; another failed write (a full disk) is
//! said on stderr and exits 1. `eprintln!` ignores a closed stderr: there
//! is nowhere left to say anything.

use std::fmt::Arguments;
use std::io::Write;

macro_rules! println {
    () => { $crate::cli::out::stdout(format_args!("\n")) };
    ($($arg:tt)*) => { $crate::cli::out::stdout(format_args!("{}\n", format_args!($($arg)*))) };
}

// Unused today; here so that a `print!` written later cannot panic either.
#[allow(unused_macros)]
macro_rules! print {
    ($($arg:tt)*) => { $crate::cli::out::stdout(format_args!($($arg)*)) };
}

macro_rules! eprintln {
    ($($arg:tt)*) => { $crate::cli::out::stderr(format_args!("{}\n", format_args!($($arg)*))) };
}

/// Write `args` to stdout, or end the process if it cannot take them.
pub(super) fn stdout(args: Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    match out.write_fmt(args).and_then(|()| out.flush()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(super::exit::BROKEN_PIPE),
        Err(e) => {
            stderr(format_args!("fencegate: writing to stdout: {e}\n"));
            std::process::exit(1)
        }
    }
}

/// Write `args` to stderr, if it is still there.
pub(super) fn stderr(args: Arguments<'_>) {
    let _ = std::io::stderr().lock().write_fmt(args);
}
