//! Text that containers choose (thread names, ids, annotation values) on its
//! way to a terminal or a line-based log: control characters are escaped,
//! so a name cannot move the cursor, recolour the screen or forge a line.

use std::borrow::Cow;

/// Colour (and other escapes) on an output stream: only on a terminal, and
/// never with `NO_COLOR` set to a non-empty value (https://no-color.org).
pub fn colour_on(stream_is_terminal: bool) -> bool {
    colour_allowed(stream_is_terminal, std::env::var_os("NO_COLOR"))
}

fn colour_allowed(terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    terminal && no_color.is_none_or(|v| v.is_empty())
}

/// `s` with every control character (C0, DEL, C1) written as an escape:
/// `\n`, `\r`, `\t`, else `\u{1b}`; a backslash stays as it is.
pub fn printable(s: &str) -> Cow<'_, str> {
    if !s.chars().any(char::is_control) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => out.push_str(&format!("\\u{{{:x}}}", c as u32)),
            c => out.push(c),
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_characters_are_escaped() {
        assert!(matches!(printable("web-1 é"), Cow::Borrowed("web-1 é")));
        assert_eq!(printable("a\nb\rc\td"), "a\\nb\\rc\\td");
        assert_eq!(
            printable("\u{1b}[2J\u{7f}\u{9b}x"),
            "\\u{1b}[2J\\u{7f}\\u{9b}x"
        );
        assert!(!printable("\u{1b}]0;pwned\u{7}")
            .chars()
            .any(char::is_control));
    }

    #[test]
    fn colour_only_on_a_terminal_without_no_color() {
        assert!(colour_allowed(true, None));
        assert!(!colour_allowed(false, None));
        assert!(!colour_allowed(true, Some("1".into())));
        assert!(colour_allowed(true, Some("".into())));
    }
}
