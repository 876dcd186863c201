//! Writing to stdout and stderr as Unix tools do: a closed pipe (`--list |
//! head -1`, a run piped into `head`, a reader that went away) ends the
//! writing quietly instead of panicking, and the run goes on to write its
//! reports and exit with its own code. Every print of the runner goes
//! through [`outln!`], [`out!`], [`errln!`] and [`err!`].

use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};

static STDOUT_CLOSED: AtomicBool = AtomicBool::new(false);
static STDERR_CLOSED: AtomicBool = AtomicBool::new(false);

/// Writes to stdout; after a failed write (a closed pipe), writes nothing.
pub fn stdout(text: std::fmt::Arguments) {
    write(&STDOUT_CLOSED, &mut std::io::stdout().lock(), text);
}

/// Writes to stderr; after a failed write (a closed pipe), writes nothing.
pub fn stderr(text: std::fmt::Arguments) {
    write(&STDERR_CLOSED, &mut std::io::stderr().lock(), text);
}

fn write(closed: &AtomicBool, to: &mut dyn Write, text: std::fmt::Arguments) {
    if closed.load(Ordering::Relaxed) {
        return;
    }
    if to.write_fmt(text).and_then(|()| to.flush()).is_err() {
        closed.store(true, Ordering::Relaxed);
    }
}

/// Whether stdout was found closed.
pub fn stdout_closed() -> bool {
    STDOUT_CLOSED.load(Ordering::Relaxed)
}

/// `println!` that never panics (see the module docs).
#[macro_export]
macro_rules! outln {
    () => { $crate::console::stdout(format_args!("\n")) };
    ($($t:tt)*) => { $crate::console::stdout(format_args!("{}\n", format_args!($($t)*))) };
}

/// `print!` that never panics.
#[macro_export]
macro_rules! out {
    ($($t:tt)*) => { $crate::console::stdout(format_args!($($t)*)) };
}

/// `eprintln!` that never panics.
#[macro_export]
macro_rules! errln {
    () => { $crate::console::stderr(format_args!("\n")) };
    ($($t:tt)*) => { $crate::console::stderr(format_args!("{}\n", format_args!($($t)*))) };
}

/// `eprint!` that never panics.
#[macro_export]
macro_rules! err {
    ($($t:tt)*) => { $crate::console::stderr(format_args!($($t)*)) };
}
