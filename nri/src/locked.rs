//! A mutex taken even when a thread panicked holding it: the plugin's
//! state stays usable (each event's work runs on a thread of its own).

use std::sync::{Mutex, MutexGuard, PoisonError};

/// `m` locked, poisoned or not.
pub fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
