//! What the runner and the candidate client share about a child process.

use std::io::BufRead;
use std::io::BufReader;

/// A child's stdout as lines on a channel, read by a thread of its own (so
/// a caller can wait on it with a timeout); the channel ends at EOF or
/// after the first read error, which it carries.
pub fn read_lines(
    stdout: std::process::ChildStdout,
) -> std::sync::mpsc::Receiver<std::io::Result<String>> {
    let mut stdout = BufReader::new(stdout);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || loop {
        let mut line = String::new();
        match stdout.read_line(&mut line) {
            Ok(0) => break,
            read => {
                let failed = read.is_err();
                if tx.send(read.map(|_| line)).is_err() || failed {
                    break;
                }
            }
        }
    });
    rx
}
