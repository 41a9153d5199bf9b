//! How a `Synchronize` lists each container, and which of this plugin's
//! registrations a whole one no longer lists running (they are ended).

use std::collections::HashMap;

use throttlewatch_core::ContainerKey;

use crate::api;

/// How a `Synchronize` lists a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listed {
    /// Created, running, paused or unknown: not ended here.
    Present,
    /// Stopped, with its exit code.
    Stopped(i32),
}

impl Listed {
    pub fn of(c: &api::Container) -> Listed {
        match c.state.enum_value_or_default() {
            api::ContainerState::CONTAINER_STOPPED => Listed::Stopped(c.exit_code),
            _ => Listed::Present,
        }
    }
}

/// The registrations a whole `Synchronize` no longer lists running, and
/// the exit code of those it lists stopped: what ends them.
pub fn gone(
    registered: Vec<ContainerKey>,
    listed: &HashMap<ContainerKey, Listed>,
) -> Vec<(ContainerKey, Option<i32>)> {
    registered
        .into_iter()
        .filter_map(|k| match listed.get(&k) {
            None => Some((k, None)),
            Some(Listed::Stopped(code)) => Some((k, Some(*code))),
            Some(Listed::Present) => None,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gone_is_what_a_whole_sync_does_not_list_running() {
        let k = |id: &str| ContainerKey::new(id, None);
        let listed: HashMap<ContainerKey, Listed> = [
            (k("running"), Listed::Present),
            (k("stopped"), Listed::Stopped(137)),
            (k("other-front-end"), Listed::Stopped(0)),
        ]
        .into_iter()
        .collect();
        let registered = vec![k("removed"), k("running"), k("stopped")];
        assert_eq!(
            gone(registered, &listed),
            vec![(k("removed"), None), (k("stopped"), Some(137))],
            "only this plugin's registrations, and not the running one"
        );
        // The same id in another scope is another container.
        let scoped = ContainerKey::new(
            "running",
            Some(throttlewatch_core::Scope::of_namespace("x")),
        );
        assert_eq!(gone(vec![scoped.clone()], &listed), vec![(scoped, None)]);
    }
}
