//! Every terminal row within the terminal's width: long rows (a
//! recommendation's reason, a legend) are wrapped at spaces, their
//! continuation indented under the row's text; a row with no space to wrap
//! at is cut. Colour escapes take no columns.

/// The width to fit: the terminal's columns when stdout is one, else 80.
pub fn width() -> usize {
    use std::io::IsTerminal;
    if std::io::stdout().is_terminal() {
        // SAFETY: TIOCGWINSZ writes a winsize into the struct given.
        let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
        if unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) } == 0
            && ws.ws_col >= 20
        {
            return ws.ws_col as usize;
        }
    }
    80
}

/// Columns a string takes: characters outside `ESC [ … m` sequences.
pub fn columns(s: &str) -> usize {
    let mut n = 0;
    let mut esc = false;
    for c in s.chars() {
        match (esc, c) {
            (false, '\x1b') => esc = true,
            (true, 'm') => esc = false,
            (true, _) => {}
            (false, _) => n += 1,
        }
    }
    n
}

/// `text` with every line at most `width` columns.
pub fn fit(text: &str, width: usize) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let (body, nl) = match line.strip_suffix('\n') {
            Some(b) => (b, "\n"),
            None => (line, ""),
        };
        if columns(body) <= width {
            out.push_str(line);
            continue;
        }
        let lead = body.len() - body.trim_start().len();
        let indent = " ".repeat((lead + 4).min(width / 2));
        let mut row = String::from(&body[..lead]);
        for word in body[lead..].split(' ') {
            let w = columns(word);
            let sep = usize::from(!row.trim().is_empty());
            if columns(&row) + sep + w > width && !row.trim().is_empty() {
                out.push_str(row.trim_end());
                out.push('\n');
                row = indent.clone();
            }
            if !row.trim().is_empty() {
                row.push(' ');
            }
            row.push_str(word);
        }
        out.push_str(&cut(&row, width));
        out.push_str(nl);
    }
    out
}

/// At most `width` columns of `s` (a row without a space to wrap at).
fn cut(s: &str, width: usize) -> String {
    if columns(s) <= width {
        return s.trim_end().to_string();
    }
    let mut out = String::new();
    let (mut n, mut esc) = (0, false);
    for c in s.chars() {
        match (esc, c) {
            (false, '\x1b') => esc = true,
            (true, 'm') => esc = false,
            (true, _) => {}
            (false, _) if n == width => continue,
            (false, _) => n += 1,
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_row_fits_and_no_word_is_lost() {
        let reason = format!(
            "  * resources.limits.cpu=0.7  (--cpus 0.7)\n    {}\n  |{}\n",
            "4 runnable threads under a quota of 0.3 CPUs freeze for 76.5ms of each throttled period (summed over CPUs): run 1 worker, or raise the limit to 0.7",
            "R".repeat(5000)
        );
        for width in [40, 80, 120] {
            let f = fit(&reason, width);
            assert!(f.lines().all(|l| columns(l) <= width), "{width}:\n{f}");
            let words = |s: &str| {
                s.split_whitespace()
                    .filter(|w| !w.starts_with("|R"))
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            };
            assert_eq!(words(&f), words(&reason), "{width}");
            // Continuations sit under the row's text.
            let lines: Vec<&str> = f.lines().collect();
            let at = lines
                .iter()
                .position(|l| l.starts_with("    4 runnable"))
                .unwrap();
            assert!(lines[at + 1].starts_with("        "), "{f}");
        }
        let coloured = "\x1b[1mbold\x1b[0m ".repeat(30);
        assert_eq!(columns("\x1b[1mbold\x1b[0m"), 4);
        assert!(fit(&coloured, 80).lines().all(|l| columns(l) <= 80));
        assert_eq!(fit("short\n", 80), "short\n");
    }
}
