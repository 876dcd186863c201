//! `println!`/`eprintln!` that never panic: a closed stdout or stderr
//! (xtask piped into `head`) ends the printing quietly, and the wrapped
//! child's exit code is still ours. (The runner has its own copy of these
//! few lines in `conformance::console`: xtask cannot depend on that crate.)

use std::io::Write;

pub fn write(to: &mut dyn Write, text: std::fmt::Arguments) {
    let _ = to.write_fmt(text).and_then(|()| to.flush());
}

macro_rules! println {
    () => { $crate::console::write(&mut std::io::stdout().lock(), format_args!("\n")) };
    ($($t:tt)*) => { $crate::console::write(&mut std::io::stdout().lock(), format_args!("{}\n", format_args!($($t)*))) };
}

macro_rules! eprintln {
    () => { $crate::console::write(&mut std::io::stderr().lock(), format_args!("\n")) };
    ($($t:tt)*) => { $crate::console::write(&mut std::io::stderr().lock(), format_args!("{}\n", format_args!($($t)*))) };
}

macro_rules! print {
    ($($t:tt)*) => { $crate::console::write(&mut std::io::stdout().lock(), format_args!($($t)*)) };
}
