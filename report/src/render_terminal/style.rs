//! How the terminal report is drawn: colour and Unicode, or plain.

#[derive(Debug, Clone, Copy)]
pub struct Style {
    pub color: bool,
    pub unicode: bool,
}

impl Style {
    /// Decide from the output and the environment (https://no-color.org).
    pub fn detect() -> Style {
        use std::io::IsTerminal;
        let on = throttlewatch_core::printable::colour_on(std::io::stdout().is_terminal());
        Style {
            color: on,
            unicode: on,
        }
    }
    pub fn plain() -> Style {
        Style {
            color: false,
            unicode: false,
        }
    }
    pub(crate) fn paint(&self, code: &str, s: &str) -> String {
        if self.color {
            format!("\x1b[{code}m{s}\x1b[0m")
        } else {
            s.to_string()
        }
    }
    pub(crate) fn bold(&self, s: &str) -> String {
        self.paint("1", s)
    }
    pub(crate) fn warn(&self, s: &str) -> String {
        self.paint("1;31", s)
    }
    pub(crate) fn dim(&self, s: &str) -> String {
        self.paint("2", s)
    }
}
