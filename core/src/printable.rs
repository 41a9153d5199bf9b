//! Text that containers choose (thread names, ids, annotation values) on its
//! way to a terminal or a line-based log: control characters are escaped,
//! so a name cannot move the cursor, recolour the screen or forge a line.

use std::borrow::Cow;

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
}
