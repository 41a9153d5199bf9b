//! Helpers shared by the unit tests of several crates of the workspace. A
//! dev-dependency only: nothing here is built into a binary.

use std::path::Path;

/// The names of the entries of directory `d`, sorted: what a test that
/// creates, rotates or prunes files compares with what it expects.
pub fn names(d: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d)
        .unwrap_or_else(|e| panic!("reading directory {}: {e}", d.display()))
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    v.sort();
    v
}

#[cfg(test)]
mod tests {
    use super::names;

    #[test]
    fn names_are_sorted_and_a_missing_directory_says_which() {
        let d = tempfile::tempdir().unwrap();
        for n in ["b", "a", "c.1"] {
            std::fs::write(d.path().join(n), "").unwrap();
        }
        assert_eq!(names(d.path()), ["a", "b", "c.1"]);
        let missing = d.path().join("gone");
        let e = std::panic::catch_unwind(|| names(&missing)).unwrap_err();
        let msg = e.downcast_ref::<String>().unwrap();
        assert!(msg.contains("gone"), "{msg}");
    }
}
