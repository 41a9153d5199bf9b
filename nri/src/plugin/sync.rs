//! `Synchronize`, at every connection (the plugin or the runtime started
//! again): the runtime's pods and containers, maybe in several pieces
//! (`more`). Answered at once; behind the answer:
//!
//! - bursts held for an update of the last connection are written back
//!   (its post-update will not come);
//! - after the last piece, the containers this plugin registered
//!   (`registered.rs`) that the runtime no longer lists, or lists stopped,
//!   are ended: they stopped or were removed while the plugin was down.
//!   Their `end` record (unless the agent wrote it already), burst record
//!   and exclusive cores go as at `RemoveContainer`;
//! - the running containers it watches get their annotation QoS again
//!   (the burst for their quota now) and are registered (an agent that
//!   watches one already says so: no second `start` record).

use std::collections::HashMap;
use std::sync::Arc;

use throttlewatch_core::{ContainerKey, EndReason, StateDir};

use super::end::Ended;
use super::{lock, say, Plugin};
use crate::api;
use crate::registered::Registered;

/// How a `Synchronize` lists a container.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listed {
    /// Created, running, paused or unknown: not ended here.
    Present,
    /// Stopped, with its exit code.
    Stopped(i32),
}

impl Listed {
    fn of(c: &api::Container) -> Listed {
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

impl Plugin {
    pub(super) fn synchronize(
        self: &Arc<Self>,
        req: api::SynchronizeRequest,
    ) -> api::SynchronizeResponse {
        let mut res = api::SynchronizeResponse::new();
        // `more` answered as asked: every piece is taken as it comes.
        res.more = req.more;
        lock(&self.listed).extend(req.containers.iter().map(|c| (c.id.clone(), Listed::of(c))));
        // Read now, before the answer: a container started after it has
        // its registration and is not in this list.
        let gone = if req.more { vec![] } else { self.gone_now() };
        let pods: HashMap<String, api::PodSandbox> =
            req.pods.into_iter().map(|p| (p.id.clone(), p)).collect();
        let running: Vec<(api::PodSandbox, api::Container)> = req
            .containers
            .into_iter()
            .filter(|c| c.state.enum_value_or_default() == api::ContainerState::CONTAINER_RUNNING)
            .map(|c| (pods.get(&c.pod_sandbox_id).cloned().unwrap_or_default(), c))
            .filter(|(p, c)| self.wanted(p, c))
            .collect();
        let me = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("nri-sync".into())
            .spawn(move || me.synchronized(gone, running));
        if let Err(e) = spawned {
            say(&format!(
                "cannot end or register the synchronized containers: {e}"
            ));
        }
        res
    }

    /// The registrations the pieces of this connection did not list
    /// running; the list starts again.
    fn gone_now(&self) -> Vec<(ContainerKey, Option<i32>)> {
        let seen = std::mem::take(&mut *lock(&self.listed));
        let listed: HashMap<ContainerKey, Listed> =
            seen.into_iter().map(|(id, l)| (self.key(&id), l)).collect();
        let cfg = &self.settings().cfg;
        let registered = Registered::new(&cfg.state_dir).all(&mut |e| {
            say(&format!(
                "Synchronize: {e}; removed (its container is not ended by the plugin)"
            ))
        });
        gone(registered, &listed)
    }

    /// Behind the answer: held bursts back, the gone ended, the running
    /// registered.
    fn synchronized(
        &self,
        gone: Vec<(ContainerKey, Option<i32>)>,
        running: Vec<(api::PodSandbox, api::Container)>,
    ) {
        self.restore_all_held();
        if !gone.is_empty() {
            let by_us = gone
                .iter()
                // After the runtime's delete, as at RemoveContainer.
                .filter(|(key, code)| self.end(key, EndReason::Poststop, *code) == Ended::Now)
                .count();
            say(&format!(
                "Synchronize: {} containers registered by this plugin are no longer running: ended ({by_us} end records written now, the others' by the agent before), their bursts and exclusive cores released",
                gone.len()
            ));
        }
        if running.is_empty() {
            return;
        }
        let watched = running
            .iter()
            .filter(|(p, c)| self.register_running(p, c))
            .count();
        say(&format!(
            "Synchronize: {watched} of {} running containers watched",
            running.len()
        ));
    }

    /// A container running before this plugin connected: its QoS again
    /// (the burst for its quota now) and its register, as at its start.
    /// Whether it is watched now.
    fn register_running(&self, pod: &api::PodSandbox, c: &api::Container) -> bool {
        if c.pid == 0 {
            say(&format!(
                "Synchronize: container {:?}: the runtime gave no pid; not watched",
                c.id
            ));
            return false;
        }
        self.on_task(pod, c);
        let cfg = &self.settings().cfg;
        !StateDir::new(&cfg.state_dir)
            .unwatched_file(&self.key(&c.id))
            .exists()
    }
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
