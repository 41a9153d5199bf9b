//! The unified diff that `install`/`uninstall` print (and `--dry-run` shows).

/// A unified diff (3 lines of context) from an LCS of the lines.
pub(crate) fn unified_diff(old: &str, new: &str, path: &str) -> String {
    let (a, b): (Vec<&str>, Vec<&str>) = (old.lines().collect(), new.lines().collect());
    let mut lcs = vec![vec![0usize; b.len() + 1]; a.len() + 1];
    for i in (0..a.len()).rev() {
        for j in (0..b.len()).rev() {
            lcs[i][j] = if a[i] == b[j] {
                lcs[i + 1][j + 1] + 1
            } else {
                lcs[i + 1][j].max(lcs[i][j + 1])
            };
        }
    }
    // (tag, line, old index, new index)
    let mut ops: Vec<(char, &str, usize, usize)> = Vec::new();
    let (mut i, mut j) = (0, 0);
    while i < a.len() || j < b.len() {
        if i < a.len() && j < b.len() && a[i] == b[j] {
            ops.push((' ', a[i], i, j));
            (i, j) = (i + 1, j + 1);
        } else if j < b.len() && (i == a.len() || lcs[i][j + 1] >= lcs[i + 1][j]) {
            ops.push(('+', b[j], i, j));
            j += 1;
        } else {
            ops.push(('-', a[i], i, j));
            i += 1;
        }
    }
    let changed: Vec<usize> = ops
        .iter()
        .enumerate()
        .filter(|(_, o)| o.0 != ' ')
        .map(|(k, _)| k)
        .collect();
    if changed.is_empty() {
        return String::new();
    }
    let from = if old.is_empty() {
        "/dev/null".to_string()
    } else {
        format!("a{path}")
    };
    let to = if new.is_empty() {
        "/dev/null".to_string()
    } else {
        format!("b{path}")
    };
    let mut out = format!("--- {from}\n+++ {to}\n");
    let mut k = 0;
    while k < changed.len() {
        let start = changed[k].saturating_sub(3);
        let mut end = changed[k];
        while k < changed.len() && changed[k] <= end + 7 {
            end = changed[k];
            k += 1;
        }
        let end = (end + 4).min(ops.len());
        let hunk = &ops[start..end];
        let old_n = hunk.iter().filter(|o| o.0 != '+').count();
        let new_n = hunk.iter().filter(|o| o.0 != '-').count();
        let old_start = if old_n == 0 { hunk[0].2 } else { hunk[0].2 + 1 };
        let new_start = if new_n == 0 { hunk[0].3 } else { hunk[0].3 + 1 };
        out.push_str(&format!(
            "@@ -{old_start},{old_n} +{new_start},{new_n} @@\n"
        ));
        for (tag, line, _, _) in hunk {
            out.push_str(&format!("{tag}{line}\n"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_shows_insertions_with_context() {
        let d = unified_diff("a\nb\nc\n", "a\nb\nX\nc\n", "/f");
        assert_eq!(d, "--- a/f\n+++ b/f\n@@ -1,3 +1,4 @@\n a\n b\n+X\n c\n");
        assert_eq!(unified_diff("same\n", "same\n", "/f"), "");
        assert!(unified_diff("", "new\n", "/f")
            .starts_with("--- /dev/null\n+++ b/f\n@@ -0,0 +1,1 @@\n+new\n"));
        assert!(unified_diff("old\n", "", "/f").starts_with("--- a/f\n+++ /dev/null\n"));
    }
}
