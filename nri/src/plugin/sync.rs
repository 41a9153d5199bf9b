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
//!   watches one already says so: no second `start` record). The runtime
//!   goes on meanwhile: a container it stops after the list was taken is
//!   not registered again (its `end` may be written already: a second
//!   register would start a second log), nor one whose process is gone.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError};

use throttlewatch_core::{ContainerKey, EndReason, StateDir};

use super::end::Ended;
use super::listed::{gone, Listed};
use super::Plugin;
use crate::api;
use crate::diag::say;
use crate::locked::lock;
use crate::registered::Registered;

impl Plugin {
    /// Container `id` ends (`StopContainer`, `RemoveContainer`): a
    /// `Synchronize` still registering does not register it again.
    pub(super) fn note_ended(&self, id: &str) {
        let mut s = lock(&self.syncing);
        if s.active > 0 {
            s.ended.insert(id.to_string());
        }
    }

    /// One `Synchronize` registration less; the ended set is forgotten
    /// with the last.
    fn sync_done(&self) {
        let mut s = lock(&self.syncing);
        s.active = s.active.saturating_sub(1);
        if s.active == 0 {
            s.ended.clear();
        }
    }

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
        let (all_running, wanted) = self.running_of(req.pods, req.containers);
        let me = Arc::clone(self);
        // Counted before the answer: the runtime's next events come after it.
        lock(&self.syncing).active += 1;
        let spawned = std::thread::Builder::new()
            .name("nri-sync".into())
            .spawn(move || {
                me.synchronized(gone, all_running, wanted);
                me.sync_done();
            });
        if let Err(e) = spawned {
            self.sync_done();
            say(&format!(
                "cannot end or register the synchronized containers: {e}"
            ));
        }
        res
    }

    /// The running containers of a `Synchronize` (piece): how many in all
    /// (watched or not: the summary's "of N" is what the runtime runs),
    /// and those this plugin asks for, each with its pod.
    pub(super) fn running_of(
        &self,
        pods: Vec<api::PodSandbox>,
        containers: Vec<api::Container>,
    ) -> (usize, Vec<(api::PodSandbox, api::Container)>) {
        let pods: HashMap<String, api::PodSandbox> =
            pods.into_iter().map(|p| (p.id.clone(), p)).collect();
        let running: Vec<(api::PodSandbox, api::Container)> = containers
            .into_iter()
            .filter(|c| c.state.enum_value_or_default() == api::ContainerState::CONTAINER_RUNNING)
            .map(|c| (pods.get(&c.pod_sandbox_id).cloned().unwrap_or_default(), c))
            .collect();
        let all = running.len();
        let wanted = running
            .into_iter()
            .filter(|(p, c)| self.wanted(p, c))
            .collect();
        (all, wanted)
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
        all_running: usize,
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
        if all_running == 0 {
            return;
        }
        let watched = running
            .iter()
            .filter(|(p, c)| self.register_running(p, c))
            .count();
        say(&summary(all_running, running.len(), watched));
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
        // No end of this container while it is registered here.
        let _gate = self
            .sync_gate
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        if lock(&self.syncing).ended.contains(&c.id) {
            say(&format!(
                "Synchronize: container {:?} ended after it was listed; not registered again",
                c.id
            ));
            return false;
        }
        if !std::path::Path::new(&format!("/proc/{}", c.pid)).exists() {
            say(&format!(
                "Synchronize: container {:?}: its process {} exited after it was listed; not registered",
                c.id, c.pid
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

/// What a `Synchronize` did with the running containers it listed:
/// `running` in all, `asked` of them this plugin watches (annotated, or
/// every one with `watch = "all"`), `watched` of those now watched.
pub fn summary(running: usize, asked: usize, watched: usize) -> String {
    let mut s = format!("Synchronize: {watched} of {running} running containers watched");
    let mut why = Vec::new();
    if running > asked {
        why.push(format!(
            "{} not asked for (no throttlewatch.io/ annotation, a pod of throttlewatch's own runtime handler, or a sandbox)",
            running - asked
        ));
    }
    if asked > watched {
        why.push(format!(
            "{} asked for but not watched (said above)",
            asked - watched
        ));
    }
    if !why.is_empty() {
        s.push_str(&format!(" ({})", why.join("; ")));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::WatchMode;
    use throttlewatch_core::config::Config;

    /// A `Synchronize` still registering when the runtime ends one of its
    /// containers, or when one's process is gone: neither is registered
    /// (nor noted as registered, which the end removed already), and
    /// nothing is reported as a problem.
    #[test]
    fn a_container_ended_after_the_list_is_not_registered_again() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config {
            log_dir: d.path().join("logs"),
            socket: d.path().join("none.sock"),
            state_dir: d.path().join("state"),
            start_agent: false,
            ..Config::default()
        };
        let p = Plugin::with_mode(cfg, None, WatchMode::All, None);
        let pod = api::PodSandbox::new();
        let mut c = api::Container::new();
        lock(&p.syncing).active = 1;
        // Ended meanwhile; its process still there (this one's pid).
        c.id = "ended".into();
        c.pid = std::process::id();
        p.note_ended(&c.id);
        assert!(!p.register_running(&pod, &c));
        // Its process gone (no such pid).
        c.id = "exited".into();
        c.pid = u32::MAX;
        assert!(!p.register_running(&pod, &c));
        let registered = Registered::new(&d.path().join("state"));
        for id in ["ended", "exited"] {
            assert!(!registered.contains(&p.key(id)), "{id} noted as registered");
        }
        assert!(
            !d.path().join("logs/hook.log").exists(),
            "a problem reported"
        );
        p.sync_done();
        assert!(lock(&p.syncing).ended.is_empty(), "forgotten with the last");
        p.note_ended("later");
        assert!(lock(&p.syncing).ended.is_empty(), "noted with none running");
    }

    #[test]
    fn summary_counts_every_running_container() {
        assert_eq!(
            summary(2, 1, 1),
            "Synchronize: 1 of 2 running containers watched (1 not asked for (no throttlewatch.io/ annotation, a pod of throttlewatch's own runtime handler, or a sandbox))"
        );
        assert_eq!(
            summary(3, 3, 3),
            "Synchronize: 3 of 3 running containers watched"
        );
        assert!(summary(3, 2, 1).ends_with("; 1 asked for but not watched (said above))"));
    }
}
