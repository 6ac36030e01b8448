//! Plugin-supplied text on its way to a terminal or a log: bounded and stripped of control
//! characters. A plugin is untrusted code; its error messages, names and descriptions must not
//! flood the terminal (a 30 MB error string) or drive it (escape sequences, NUL).

/// The most bytes of one plugin-supplied string that are shown; the rest is cut, saying how
/// much. A real error message or description fits with room to spare.
pub const MAX_SHOWN_BYTES: usize = 4096;

/// `text` fit to show: control characters (ESC, NUL, CR, ...) replaced by U+FFFD except line
/// feeds and tabs, at most [`MAX_SHOWN_BYTES`] bytes, with a note of how many bytes were cut.
pub fn shown(text: &str) -> String {
    bounded(text, MAX_SHOWN_BYTES)
}

/// [`shown`] with another bound (train.log keeps a whole error chain).
pub fn bounded(text: &str, max_bytes: usize) -> String {
    let (kept, cut) = split_at_most(text, max_bytes);
    let mut clean: String = kept.chars().map(|c| if is_unsafe_control(c) { '\u{FFFD}' } else { c }).collect();
    if cut > 0 {
        clean.push_str(&format!(" [... {cut} more bytes cut]"));
    }
    clean
}

/// A control character other than the line feed and the tab (which layout needs).
pub fn is_unsafe_control(c: char) -> bool {
    c.is_control() && c != '\n' && c != '\t'
}

/// The longest prefix of at most `max_bytes` bytes that ends on a character boundary, and the
/// number of bytes left out.
fn split_at_most(text: &str, max_bytes: usize) -> (&str, usize) {
    if text.len() <= max_bytes {
        return (text, 0);
    }
    let mut end = max_bytes;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    (&text[..end], text.len() - end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_text_is_cut_with_the_count_of_cut_bytes() {
        let long = "é".repeat(MAX_SHOWN_BYTES); // 2 bytes each: the cut falls on a boundary
        let shown = shown(&long);
        assert!(shown.starts_with(&"é".repeat(MAX_SHOWN_BYTES / 2)));
        assert!(shown.ends_with(&format!(" [... {} more bytes cut]", MAX_SHOWN_BYTES)), "{}", &shown[shown.len() - 40..]);
        let odd = format!("a{}", "é".repeat(MAX_SHOWN_BYTES)); // boundary one byte back
        assert!(shown_len_ok(&super::shown(&odd)));
    }

    fn shown_len_ok(text: &str) -> bool {
        text.len() <= MAX_SHOWN_BYTES + " [... 4097 more bytes cut]".len()
    }

    #[test]
    fn control_characters_are_replaced_but_newlines_and_tabs_kept() {
        assert_eq!(shown("a\u{1b}[31mred\0\r\n\tb"), "a\u{FFFD}[31mred\u{FFFD}\u{FFFD}\n\tb");
        assert_eq!(shown("plain"), "plain");
    }
}
