//! What the runner and the candidate client share about a child process:
//! its output read in bounded lines, decoded lossily, so no child can make
//! the reader buffer without limit (a stream with no newline) or stop
//! reading (a line that is not UTF-8: a closed relay would kill the child
//! with SIGPIPE), and text clipped before it goes into a report.

use std::io::{BufRead, BufReader, Read};

/// The longest protocol line read from a child's stdout (answers carry
/// arrays in files; a worker's result row is at most a few MiB).
pub const MAX_PROTOCOL_LINE: usize = 256 << 20;

/// The longest piece of a relayed stderr line: a longer line is relayed in
/// pieces of this size (nothing is dropped, nothing is held whole).
pub const MAX_RELAY_LINE: usize = 64 << 10;

/// The longest message or stderr line kept for a report; longer ones are
/// clipped with a note of how much was dropped.
pub const MAX_REPORTED: usize = 4096;

/// One line of at most `max` bytes (its newline removed); `Ok(None)` at
/// EOF. A line longer than `max` is returned in pieces of `max` bytes;
/// `whole` says whether the piece ended at a newline (or EOF).
fn next_line(r: &mut impl BufRead, max: usize) -> std::io::Result<Option<(Vec<u8>, bool)>> {
    let mut buf = Vec::new();
    loop {
        match r.take(max as u64).read_until(b'\n', &mut buf) {
            Ok(0) if buf.is_empty() => return Ok(None),
            Ok(_) => break,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        }
    }
    let whole = buf.last() == Some(&b'\n') || buf.len() < max;
    if buf.last() == Some(&b'\n') {
        buf.pop();
        if buf.last() == Some(&b'\r') {
            buf.pop();
        }
    }
    Ok(Some((buf, whole)))
}

/// Calls `f` with every line of `reader` (lossily decoded; a line longer
/// than [`MAX_RELAY_LINE`] in pieces), until EOF or a read error.
pub fn for_each_line(reader: impl Read, mut f: impl FnMut(String)) {
    let mut r = BufReader::new(reader);
    while let Ok(Some((line, _))) = next_line(&mut r, MAX_RELAY_LINE) {
        f(String::from_utf8_lossy(&line).into_owned());
    }
}

/// A child's stdout as lines on a channel, read by a thread of its own (so
/// a caller can wait on it with a timeout); the channel ends at EOF or
/// after the first read error, which it carries. A line longer than
/// [`MAX_PROTOCOL_LINE`] is an error (never buffered whole); bytes that
/// are not UTF-8 are replaced, not an error.
pub fn read_lines(
    stdout: std::process::ChildStdout,
) -> std::sync::mpsc::Receiver<std::io::Result<String>> {
    let mut stdout = BufReader::new(stdout);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || loop {
        let read = match next_line(&mut stdout, MAX_PROTOCOL_LINE + 1) {
            Ok(None) => break,
            Ok(Some((line, _))) if line.len() > MAX_PROTOCOL_LINE => Err(std::io::Error::other(
                format!("a line longer than {MAX_PROTOCOL_LINE} bytes"),
            )),
            Ok(Some((line, _))) => Ok(String::from_utf8_lossy(&line).into_owned()),
            Err(e) => Err(e),
        };
        let failed = read.is_err();
        if tx.send(read).is_err() || failed {
            break;
        }
    });
    rx
}

/// `s` with its control characters other than newline and tab escaped
/// (`\u{1b}`): text from a child (a candidate's message, name or stderr)
/// never moves the terminal's cursor, sets its title or hides what
/// follows, in the terminal or in a report.
pub fn printable(s: &str) -> std::borrow::Cow<'_, str> {
    let escaped = |c: char| c.is_control() && c != '\n' && c != '\t';
    if !s.chars().any(escaped) {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 16);
    for c in s.chars() {
        if escaped(c) {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
}

/// `s` [`printable`], clipped to at most `max` bytes (at a character
/// boundary), with a note of how many bytes were dropped.
pub fn clip(s: &str, max: usize) -> String {
    let s = printable(s);
    if s.len() <= max {
        return s.into_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} more bytes dropped)", &s[..end], s.len() - end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped_newlines_and_tabs_kept() {
        assert_eq!(printable("a\tb\nc"), "a\tb\nc");
        assert_eq!(printable("\x1b[31mred\x07\0"), "\\u{1b}[31mred\\u{7}\\u{0}");
        assert_eq!(printable("\r\u{9b}"), "\\u{d}\\u{9b}");
        // Escaped before clipping: what is kept is escaped too.
        assert!(clip(&"\x1b".repeat(100), 20).starts_with("\\u{1b}\\u{1b}"));
    }

    /// Issue 40, classes 11 and 12: stderr with no newline was buffered
    /// whole, and one line that is not UTF-8 closed the relay.
    #[test]
    fn lines_are_bounded_and_lossy_and_the_relay_goes_on() {
        let mut input = vec![b'a'; MAX_RELAY_LINE * 2 + 5];
        input.extend_from_slice(b"\nok\n\xff\xfe bad\nafter\r\nlast");
        let mut lines = Vec::new();
        for_each_line(&input[..], |l| lines.push(l));
        assert_eq!(
            lines.len(),
            7,
            "{:?}",
            lines.iter().map(String::len).collect::<Vec<_>>()
        );
        assert!(lines[..3].iter().all(|l| l.len() <= MAX_RELAY_LINE));
        assert_eq!(
            lines[0].len() + lines[1].len() + lines[2].len(),
            MAX_RELAY_LINE * 2 + 5
        );
        assert_eq!(lines[3], "ok");
        assert_eq!(lines[4], "\u{fffd}\u{fffd} bad");
        assert_eq!(lines[5], "after");
        assert_eq!(lines[6], "last");
    }

    #[test]
    fn clipped_text_says_how_much_was_dropped() {
        assert_eq!(clip("short", 10), "short");
        let long = "é".repeat(3000);
        let c = clip(&long, MAX_REPORTED);
        assert!(
            c.len() < MAX_REPORTED + 64 && c.contains("more bytes dropped"),
            "{c}"
        );
    }
}
