//! What the `Synchronize` registrations running behind their answers
//! share with the container ends (sync.rs): how many run, and the
//! containers ended since the first of them began.

use std::collections::HashSet;

#[derive(Debug, Default)]
pub(super) struct Syncing {
    pub(super) active: usize,
    pub(super) ended: HashSet<String>,
}
