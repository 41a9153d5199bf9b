//! Every saved fuzz input (the seed corpora and the crashes found and fixed)
//! is run through its target on stable, in the normal test suite.

use std::path::Path;

#[test]
fn every_saved_input_replays() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut ran = 0;
    for (name, f) in throttlewatch_fuzz_cases::TARGETS {
        let mut inputs = 0;
        for dir in ["corpus", "regressions"] {
            let Ok(rd) = std::fs::read_dir(root.join(dir).join(name)) else {
                continue;
            };
            for e in rd.flatten() {
                let data = std::fs::read(e.path()).unwrap();
                f(&data);
                inputs += 1;
            }
        }
        assert!(inputs > 0, "no saved inputs for fuzz target {name}");
        ran += inputs;
    }
    eprintln!("replayed {ran} fuzz inputs");
}
