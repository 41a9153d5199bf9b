//! `UpdateContainer` and `PostUpdateContainer` (a kubelet resize): the
//! burst is held off while the new quota is written and written back after,
//! clamped to it; on cgroup v2 the answer also sizes the spec's
//! `unified["cpu.max.burst"]` for the new quota (every update writes the
//! spec's `unified` again after the quota).

use std::path::Path;

use protobuf::MessageField;
use throttlewatch_cgroup::proc::cpu_cgroup_of_pid;
use throttlewatch_cgroup::CgroupMode;
use throttlewatch_lifecycle::held_burst::{self, HeldBurst};

use super::{lock, say, Plugin, V2_BURST_FILE};
use crate::api;
use crate::container::{burst_request, restore, spec_of};

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
        &self,
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
        if let Some(h) = lock(&self.held).remove(&c.id) {
            restore(cfg, &c.id, h);
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
            lock(&self.held).insert(c.id.clone(), h);
        }
    }

    pub(super) fn post_update_container(&self, c: &MessageField<api::Container>) {
        let s = self.settings();
        let cfg = &s.cfg;
        if let Some(h) = lock(&self.held).remove(&c.id) {
            restore(cfg, &c.id, h);
        }
    }
}
