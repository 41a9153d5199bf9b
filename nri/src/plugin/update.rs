//! `UpdateContainer` and `PostUpdateContainer` (a kubelet resize): the
//! burst is held off while the new quota is written and written back after,
//! clamped to it; on cgroup v2 the answer also sizes the spec's
//! `unified["cpu.max.burst"]` for the new quota (every update writes the
//! spec's `unified` again after the quota). A post-update that never comes
//! (the update failed) is waited for [`Plugin::hold_limit`] (`held.rs`).

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use protobuf::MessageField;
use throttlewatch_cgroup::proc::cpu_cgroup_of_pid;
use throttlewatch_cgroup::CgroupMode;
use throttlewatch_lifecycle::held_burst::{self, HeldBurst};

use super::{Plugin, V2_BURST_FILE};
use crate::api;
use crate::container::{burst_request, restore, spec_of};
use crate::diag::say;
use crate::locked::lock;

impl Plugin {
    pub(super) fn update_response(
        &self,
        req: &api::UpdateContainerRequest,
    ) -> api::UpdateContainerResponse {
        let mut res = api::UpdateContainerResponse::new();
        let (pod, c) = (&*req.pod, &*req.container);
        if self.mode != Some(CgroupMode::V2) || !self.wanted(pod, c) {
            return res;
        }
        let quota = req
            .linux_resources
            .cpu
            .quota
            .as_ref()
            .and_then(|q| u64::try_from(q.value).ok())
            .filter(|q| *q > 0);
        let s = self.settings();
        let us = burst_request(&s.cfg, &spec_of(pod, c)).and_then(|r| r.burst_for_quota(quota));
        if let Some(us) = us {
            let mut u = api::ContainerUpdate::new();
            u.container_id = c.id.clone();
            let resources = u
                .linux
                .mut_or_insert_default()
                .resources
                .mut_or_insert_default();
            resources
                .unified
                .insert(V2_BURST_FILE.into(), us.to_string());
            res.update.push(u);
        }
        res
    }

    pub(super) fn update_container(
        self: &Arc<Self>,
        pod: &MessageField<api::PodSandbox>,
        c: &MessageField<api::Container>,
    ) {
        let s = self.settings();
        let cfg = &s.cfg;
        let (pod, c) = (pod.get_or_default(), c.get_or_default());
        if !self.wanted(pod, c) {
            return;
        }
        // One left from an update that never got its post-update: back first.
        let left = lock(&self.held).take(&c.id);
        if let Some(h) = left {
            restore(cfg, "UpdateContainer", &c.id, h);
        }
        let key = self.key(&c.id);
        let spec = spec_of(pod, c);
        let pid = c.pid;
        let mut warn = |m: &str| say(&format!("UpdateContainer of {:?}: {m}", c.id));
        let taken = HeldBurst::take(
            cfg,
            &key,
            |w| {
                held_burst::derive_from_spec(
                    cfg,
                    &key,
                    &spec,
                    |mode| cpu_cgroup_of_pid(Path::new("/proc"), pid, mode).ok(),
                    w,
                )
            },
            &mut warn,
        );
        if let Some(h) = taken {
            self.hold_burst(&c.id, h);
        }
    }

    /// How long a held burst waits for its `PostUpdateContainer`: twice
    /// the runtime's request timeout. An update that has not written its
    /// quota by then is taken as failed (the runtime answers a failed
    /// update with an error and no post-update).
    pub fn hold_limit(&self) -> Duration {
        lock(&self.runtime).request_timeout * 2
    }

    /// Hold `h` until the post-update, and start the timer that writes it
    /// back if none comes within [`Plugin::hold_limit`].
    fn hold_burst(self: &Arc<Self>, id: &str, h: HeldBurst) {
        let limit = self.hold_limit();
        let (token, old) = lock(&self.held).hold(id, h, Instant::now() + limit);
        if let Some(old) = old {
            restore(&self.settings().cfg, "UpdateContainer", id, old);
        }
        let me = Arc::clone(self);
        let owned = id.to_string();
        let spawned = std::thread::Builder::new()
            .name("nri-held-burst".into())
            .spawn(move || {
                std::thread::sleep(limit);
                let due = lock(&me.held).take_due(&owned, token, Instant::now());
                let Some(h) = due else { return };
                if let Some(us) = restore(&me.settings().cfg, "UpdateContainer", &owned, h) {
                    say(&format!(
                        "UpdateContainer of {owned:?}: no PostUpdateContainer within {limit:?} (the update failed in the runtime): burst {us} µs written back for the quota now"
                    ));
                }
            });
        if let Err(e) = spawned {
            say(&format!(
                "UpdateContainer of {id:?}: {e}; its burst waits for the post-update or the next event"
            ));
        }
    }

    pub(super) fn post_update_container(&self, c: &MessageField<api::Container>) {
        let s = self.settings();
        let held = lock(&self.held).take(&c.id);
        if let Some(h) = held {
            restore(&s.cfg, "PostUpdateContainer", &c.id, h);
        }
    }

    /// A new connection: no post-update of the old one will come.
    pub(super) fn restore_all_held(&self) {
        let held = lock(&self.held).take_all();
        let s = self.settings();
        for (id, h) in held {
            restore(&s.cfg, "Synchronize", &id, h);
        }
    }
}
