//! The plugin's answers to the runtime: what each NRI event does with a
//! container, through `throttlewatch-lifecycle` as the other front ends do.
//!
//! - `Configure`: the runtime, its timeouts, the plugin configuration; the
//!   answer subscribes to the container events below.
//! - `Synchronize`: containers already running are registered with the
//!   agent (an agent that watches one already answers so: no second `start`
//!   record); answered at once, the registers go on behind it.
//! - `CreateContainer`: on cgroup v2, the burst asked for goes into the
//!   adjustment (`linux.resources.unified["cpu.max.burst"]`); NRI has no
//!   field for the v1 burst (`cpu.cfs_burst_us`), which is written at start.
//! - `StartContainer`: the task exists (its init waits for the start, the
//!   cgroup is there) and its entrypoint has not run: annotation QoS into
//!   the cgroup, then the register — the hook's createRuntime work.
//! - `UpdateContainer` / `PostUpdateContainer`: the burst is cleared before
//!   the new quota is written (the kernel refuses a quota below the burst)
//!   and written back clamped to it after.
//! - `StopContainer` / `RemoveContainer`: the agent writes the `end` record;
//!   the burst record and exclusive cores are released.
//!
//! Fail-open: every container event is answered within the runtime's
//! request timeout whatever the agent does; an event whose work is not done
//! by then is answered without it (the work finishes behind the answer) and
//! nothing is ever refused.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::mpsc::sync_channel;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use protobuf::{Message, MessageField};
use throttlewatch_cgroup::proc::cpu_cgroup_of_pid;
use throttlewatch_cgroup::{CgroupMode, Hierarchies};
use throttlewatch_core::config::Config;
use throttlewatch_core::keys::PREFIX;
use throttlewatch_core::logfmt::now_unix_ns;
use throttlewatch_core::protocol::Register;
use throttlewatch_core::{ContainerKey, EndReason, Scope};
use throttlewatch_lifecycle::bundle_spec::{self, BundleSpec, Cpu, Linux, Resources, SpecProcess};
use throttlewatch_lifecycle::burst_record::{self, BurstRecord, RECORD_VERSION};
use throttlewatch_lifecycle::create_marks::CreateMarks;
use throttlewatch_lifecycle::created::{self, Created};
use throttlewatch_lifecycle::held_burst::{self, HeldBurst};
use throttlewatch_lifecycle::report::Reporter;
use throttlewatch_lifecycle::timing::Phases;
use throttlewatch_lifecycle::{qos, AgentClient, AgentError, HookStage, StateDir};
use ttrpc::{Code, Status};

use crate::api;
use crate::options::{NriConfig, WatchMode};
use crate::rpc::Answer;
use crate::NAME;

/// The plugin service's name on the wire.
pub const PLUGIN_SERVICE: &str = "nri.pkg.api.v1alpha1.Plugin";
/// The runtime service's name on the wire.
pub const RUNTIME_SERVICE: &str = "nri.pkg.api.v1alpha1.Runtime";
/// NRI's default request timeout, until `Configure` tells the runtime's.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// The runtime handler of throttlewatch's own shim: its containers are
/// watched by the shim already.
pub const SHIM_HANDLER: &str = "throttlewatch";
/// The containerd namespace of the CRI, whose containers NRI reports.
pub const CRI_NAMESPACE: &str = "k8s.io";
/// The cgroup v2 file of the CFS burst.
pub const V2_BURST_FILE: &str = "cpu.max.burst";

/// The events subscribed to.
pub const EVENTS: [api::Event; 6] = [
    api::Event::CREATE_CONTAINER,
    api::Event::START_CONTAINER,
    api::Event::UPDATE_CONTAINER,
    api::Event::POST_UPDATE_CONTAINER,
    api::Event::STOP_CONTAINER,
    api::Event::REMOVE_CONTAINER,
];

/// NRI's event mask: bit `event - 1` for each event.
pub fn event_mask(events: &[api::Event]) -> i32 {
    events
        .iter()
        .map(|e| 1i32 << ((*e as i32) - 1))
        .fold(0, |m, b| m | b)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// One line on stderr, never a terminal escape or a forged second line.
pub fn say(msg: &str) {
    eprintln!("{NAME}: {}", throttlewatch_core::printable::printable(msg));
}

/// What `Configure` told about the runtime.
#[derive(Debug, Clone)]
struct RuntimeInfo {
    name: String,
    request_timeout: Duration,
}

/// throttlewatch's configuration and the file it came from (handed to an
/// agent the lifecycle starts).
#[derive(Debug)]
pub struct Settings {
    pub cfg: Config,
    pub path: Option<PathBuf>,
}

/// The plugin: the node's throttlewatch configuration, the watch mode, and
/// the bursts held across updates.
pub struct Plugin {
    settings: Mutex<Arc<Settings>>,
    cli_watch: WatchMode,
    watch: Mutex<WatchMode>,
    runtime: Mutex<RuntimeInfo>,
    held: Mutex<HashMap<String, HeldBurst>>,
    /// The cgroup version of the cpu controller (None: not found).
    mode: Option<CgroupMode>,
}

impl Plugin {
    pub fn new(cfg: Config, config_path: Option<PathBuf>, watch: WatchMode) -> Plugin {
        let mode = match Hierarchies::discover() {
            Ok(h) => Some(h.mode),
            Err(e) => {
                say(&format!("cgroup hierarchies: {e}; no burst adjustments"));
                None
            }
        };
        Plugin::with_mode(cfg, config_path, watch, mode)
    }

    /// As [`Plugin::new`] on a given cgroup version (tests).
    pub fn with_mode(
        cfg: Config,
        config_path: Option<PathBuf>,
        watch: WatchMode,
        mode: Option<CgroupMode>,
    ) -> Plugin {
        Plugin {
            settings: Mutex::new(Arc::new(Settings {
                cfg,
                path: config_path,
            })),
            cli_watch: watch,
            watch: Mutex::new(watch),
            runtime: Mutex::new(RuntimeInfo {
                name: String::new(),
                request_timeout: DEFAULT_REQUEST_TIMEOUT,
            }),
            held: Mutex::default(),
            mode,
        }
    }

    /// The configuration now (a runtime-launched plugin may be given its
    /// file by `Configure`).
    pub fn settings(&self) -> Arc<Settings> {
        Arc::clone(&lock(&self.settings))
    }

    /// Answer one call of the runtime on the plugin service.
    pub fn handle(self: &Arc<Self>, service: &str, method: &str, payload: &[u8]) -> Answer {
        if service != PLUGIN_SERVICE {
            return Err(unimplemented(service, method));
        }
        match method {
            "Configure" => encode(&self.configure(decode(method, payload)?)),
            "Synchronize" => encode(&self.synchronize(decode(method, payload)?)),
            "Shutdown" => encode(&api::Empty::new()),
            "CreateContainer" => {
                let req: api::CreateContainerRequest = decode(method, payload)?;
                let id = req.container.id.clone();
                let fallback = api::CreateContainerResponse::new();
                encode(&self.within(method, id, fallback, move |p| p.create_container(&req)))
            }
            "StartContainer" => {
                let req: api::StartContainerRequest = decode(method, payload)?;
                let id = req.container.id.clone();
                self.within(method, id, (), move |p| {
                    p.start_container(&req.pod, &req.container)
                });
                encode(&api::StartContainerResponse::new())
            }
            "UpdateContainer" => {
                let req: api::UpdateContainerRequest = decode(method, payload)?;
                // Computed here (no I/O): the resize depends on it.
                let res = self.update_response(&req);
                let id = req.container.id.clone();
                self.within(method, id, (), move |p| {
                    p.update_container(&req.pod, &req.container)
                });
                encode(&res)
            }
            "PostUpdateContainer" => {
                let req: api::PostUpdateContainerRequest = decode(method, payload)?;
                let id = req.container.id.clone();
                self.within(method, id, (), move |p| {
                    p.post_update_container(&req.container)
                });
                encode(&api::PostUpdateContainerResponse::new())
            }
            "StopContainer" => {
                let req: api::StopContainerRequest = decode(method, payload)?;
                let id = req.container.id.clone();
                self.within(method, id, (), move |p| {
                    p.finish(&req.pod, &req.container, EndReason::Poststop)
                });
                encode(&api::StopContainerResponse::new())
            }
            "RemoveContainer" => {
                let req: api::RemoveContainerRequest = decode(method, payload)?;
                let id = req.container.id.clone();
                self.within(method, id, (), move |p| {
                    p.finish(&req.pod, &req.container, EndReason::Delete)
                });
                encode(&api::RemoveContainerResponse::new())
            }
            // The deprecated catch-all of events not subscribed to.
            "StateChange" => encode(&api::Empty::new()),
            _ => Err(unimplemented(service, method)),
        }
    }

    /// How long an event's work may take before it is answered without it:
    /// three quarters of the runtime's request timeout.
    pub fn deadline(&self) -> Duration {
        let t = lock(&self.runtime).request_timeout;
        (t * 3 / 4).max(Duration::from_millis(50))
    }

    /// `work` on a thread of its own, its result if it is done by the
    /// deadline, else `fallback` (the work goes on).
    fn within<T: Send + 'static>(
        self: &Arc<Self>,
        event: &str,
        container: String,
        fallback: T,
        work: impl FnOnce(&Plugin) -> T + Send + 'static,
    ) -> T {
        let (tx, rx) = sync_channel(1);
        let me = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("nri-event".into())
            .spawn(move || {
                let _ = tx.send(work(me.as_ref()));
            });
        if let Err(e) = spawned {
            say(&format!(
                "{event} of {container:?}: {e}; answered without its work"
            ));
            return fallback;
        }
        let deadline = self.deadline();
        match rx.recv_timeout(deadline) {
            Ok(v) => v,
            Err(_) => {
                say(&format!(
                    "{event} of {container:?}: not done within {deadline:?}; answered without waiting (fail-open), it goes on"
                ));
                fallback
            }
        }
    }

    fn configure(&self, req: api::ConfigureRequest) -> api::ConfigureResponse {
        let timeout = u64::try_from(req.request_timeout)
            .ok()
            .filter(|ms| *ms > 0)
            .map(Duration::from_millis)
            .unwrap_or(DEFAULT_REQUEST_TIMEOUT);
        *lock(&self.runtime) = RuntimeInfo {
            name: req.runtime_name.clone(),
            request_timeout: timeout,
        };
        let watch = match NriConfig::parse(&req.config) {
            Ok(c) => {
                if let Some(path) = c.config {
                    self.load_settings(path);
                }
                c.watch.unwrap_or(self.cli_watch)
            }
            Err(e) => {
                say(&format!("{e}; watching {:?} containers", self.cli_watch));
                self.cli_watch
            }
        };
        *lock(&self.watch) = watch;
        say(&format!(
            "configured by {}/{} (NRI {}), request timeout {timeout:?}, watching {} containers",
            req.runtime_name,
            req.runtime_version,
            req.NRI_version,
            match watch {
                WatchMode::All => "all",
                WatchMode::Annotated => "annotated",
            }
        ));
        let mut res = api::ConfigureResponse::new();
        res.events = event_mask(&EVENTS);
        res
    }

    /// throttlewatch's configuration from `path` (named by the runtime's
    /// plugin configuration); one that cannot be used leaves the current one.
    fn load_settings(&self, path: PathBuf) {
        if self.settings().path.as_deref() == Some(path.as_path()) {
            return;
        }
        match throttlewatch_core::config_check::load_cached(Some(&path)) {
            Ok(cfg) => {
                say(&format!(
                    "throttlewatch configuration from {}",
                    path.display()
                ));
                *lock(&self.settings) = Arc::new(Settings {
                    cfg,
                    path: Some(path),
                });
            }
            Err(bad) => say(&format!("{bad}; keeping the configuration in use")),
        }
    }

    fn synchronize(self: &Arc<Self>, req: api::SynchronizeRequest) -> api::SynchronizeResponse {
        let mut res = api::SynchronizeResponse::new();
        // Pieces of a split sync are taken as they come: each container
        // stands on its own. `more` answered as asked.
        res.more = req.more;
        let pods: HashMap<String, api::PodSandbox> =
            req.pods.into_iter().map(|p| (p.id.clone(), p)).collect();
        let containers: Vec<(api::PodSandbox, api::Container)> = req
            .containers
            .into_iter()
            .filter(|c| c.state.enum_value_or_default() == api::ContainerState::CONTAINER_RUNNING)
            .map(|c| (pods.get(&c.pod_sandbox_id).cloned().unwrap_or_default(), c))
            .filter(|(p, c)| self.wanted(p, c))
            .collect();
        if containers.is_empty() {
            return res;
        }
        let me = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("nri-sync".into())
            .spawn(move || {
                let watched = containers
                    .iter()
                    .filter(|(p, c)| me.register_running(p, c))
                    .count();
                say(&format!(
                    "Synchronize: {watched} of {} running containers watched",
                    containers.len()
                ));
            });
        if let Err(e) = spawned {
            say(&format!("cannot register the running containers: {e}"));
        }
        res
    }

    /// Whether the plugin watches this container: not our shim's, and
    /// annotated (pod or container) unless every container is watched.
    pub fn wanted(&self, pod: &api::PodSandbox, c: &api::Container) -> bool {
        if pod.runtime_handler == SHIM_HANDLER
            || bundle_spec::is_pod_sandbox(|k| c.annotations.get(k).map(String::as_str))
        {
            return false;
        }
        let annotated = |m: &HashMap<String, String>| m.keys().any(|k| k.starts_with(PREFIX));
        *lock(&self.watch) == WatchMode::All
            || annotated(&pod.annotations)
            || annotated(&c.annotations)
    }

    /// The container's key: its id in the CRI's containerd namespace
    /// (the shim keys it the same), or bare under another runtime.
    pub fn key(&self, id: &str) -> ContainerKey {
        let scope =
            (lock(&self.runtime).name == "containerd").then(|| Scope::of_namespace(CRI_NAMESPACE));
        ContainerKey::new(id, scope)
    }

    fn create_container(&self, req: &api::CreateContainerRequest) -> api::CreateContainerResponse {
        let s = self.settings();
        let cfg = &s.cfg;
        let mut res = api::CreateContainerResponse::new();
        let (pod, c) = (&*req.pod, &*req.container);
        if !self.wanted(pod, c) || self.mode != Some(CgroupMode::V2) {
            return res;
        }
        let spec = spec_of(pod, c);
        if let Some(us) = burst_for(cfg, &spec) {
            let adjust = res.adjust.mut_or_insert_default();
            let resources = adjust
                .linux
                .mut_or_insert_default()
                .resources
                .mut_or_insert_default();
            resources
                .unified
                .insert(V2_BURST_FILE.into(), us.to_string());
        }
        res
    }

    fn start_container(
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
        if c.pid == 0 {
            say(&format!(
                "StartContainer of {:?}: the runtime gave no pid; not watched",
                c.id
            ));
            return;
        }
        let key = self.key(&c.id);
        let spec = spec_of(pod, c);
        let mut rep = Reporter::new(cfg, HookStage::CreateRuntime, NAME);
        rep.set_container(&c.id);
        let mut t = Phases::start(NAME);
        let created = Created {
            key: &key,
            bundle: Path::new(""),
            pid: c.pid,
            spec: &spec,
            created_ns: u64::try_from(c.created_at).ok().filter(|ns| *ns > 0),
        };
        if let Err(e) = created::on_created(cfg, s.path.as_deref(), &mut rep, created, &mut t) {
            rep.error(&format!("{e:#}"));
        }
    }

    /// A container running before this plugin (or before it reconnected):
    /// registered without its QoS again (it was applied at its start).
    fn register_running(&self, pod: &api::PodSandbox, c: &api::Container) -> bool {
        let s = self.settings();
        let cfg = &s.cfg;
        if c.pid == 0 {
            return false;
        }
        let spec = spec_of(pod, c);
        let (req, _) = qos::request(cfg, &spec);
        if req.watch == Some(false) {
            return false;
        }
        let rel = Hierarchies::discover()
            .map_err(|e| e.to_string())
            .and_then(|h| {
                cpu_cgroup_of_pid(Path::new("/proc"), c.pid, h.mode).map_err(|e| e.to_string())
            });
        let rel = match rel {
            Ok(r) => r,
            Err(e) => {
                say(&format!(
                    "Synchronize: container {:?}: {e}; not watched",
                    c.id
                ));
                return false;
            }
        };
        let key = self.key(&c.id);
        let reg = Register {
            container_id: key.id.clone(),
            scope: key.scope.clone(),
            container_name: spec.container_name(),
            pid: Some(c.pid),
            cgroup_path: rel,
            annotations: spec.annotations.clone(),
            created_ns: u64::try_from(c.created_at).ok().filter(|ns| *ns > 0),
            hook_ns: Some(now_unix_ns()),
            threshold_ns: req.threshold().map(|d| d.as_nanos() as u64),
            ..Default::default()
        };
        match AgentClient::of(cfg).register(&reg, None) {
            Ok(_) => {
                CreateMarks::new(&cfg.state_dir, &key).watched();
                true
            }
            Err(e) => {
                say(&format!(
                    "Synchronize: cannot register container {key}: {e}"
                ));
                false
            }
        }
    }

    /// cgroup v2: the burst the create put in the container's spec
    /// (`unified`) is written again by every update after the new quota, so
    /// it is sized for the new quota here (the kernel refuses a burst above
    /// the quota, and with it the whole update).
    fn update_response(&self, req: &api::UpdateContainerRequest) -> api::UpdateContainerResponse {
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

    fn update_container(
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

    fn post_update_container(&self, c: &MessageField<api::Container>) {
        let s = self.settings();
        let cfg = &s.cfg;
        if let Some(h) = lock(&self.held).remove(&c.id) {
            restore(cfg, &c.id, h);
        }
    }

    /// The container stopped or was removed: the `end` record (a second
    /// call finds it ended), the burst record and exclusive cores released.
    fn finish(
        &self,
        pod: &MessageField<api::PodSandbox>,
        c: &MessageField<api::Container>,
        why: EndReason,
    ) {
        let s = self.settings();
        let cfg = &s.cfg;
        let (pod, c) = (pod.get_or_default(), c.get_or_default());
        lock(&self.held).remove(&c.id);
        if !self.wanted(pod, c) {
            return;
        }
        let key = self.key(&c.id);
        let exit_code = (c.state.enum_value_or_default() == api::ContainerState::CONTAINER_STOPPED)
            .then_some(c.exit_code);
        if !CreateMarks::new(&cfg.state_dir, &key).take_refusal() {
            match AgentClient::of(cfg).unregister(&key, why, exit_code) {
                Ok(_) => {}
                Err(AgentError::Refused(r)) => say(&format!(
                    "the agent refused to end the log of {key}: {}",
                    r.error.unwrap_or_else(|| "no reason given".into())
                )),
                Err(e) => say(&format!("{e}; the end record of {key} may not be written")),
            }
        }
        release(cfg, &key);
    }
}

/// The burst record and the exclusive cores of a container that ended.
fn release(cfg: &Config, key: &ContainerKey) {
    let state = StateDir::new(&cfg.state_dir);
    let cpusets = state.cpusets_dir();
    if cpusets
        .join(throttlewatch_qos::exclusive::STATE_FILE)
        .exists()
    {
        let released = throttlewatch_qos::ExclusiveAllocator::open(&cpusets).and_then(|a| {
            a.with_lock_timeout(cfg.cpuset_lock_timeout())
                .release(&key.qualified())
        });
        if let Err(e) = released {
            say(&format!(
                "cannot release the exclusive cpuset of {key}: {e}"
            ));
        }
    }
    let had = burst_record::load(&state, key).ok().flatten();
    burst_record::remove(&state, key);
    if let Some(r) = had.filter(|r| r.applied_us > 0) {
        for w in throttlewatch_lifecycle::pod_burst::share_here(&state, &r.cgroup_path).warnings {
            say(&w);
        }
    }
}

fn restore(cfg: &Config, id: &str, h: HeldBurst) {
    let mut warn = |m: &str| say(&format!("PostUpdateContainer of {id:?}: {m}"));
    if let Err(e) = h.restore(cfg, &mut warn) {
        say(&e.to_string());
    }
}

/// The burst `spec` asks for, as a record to size it for a quota (none
/// without a burst).
fn burst_request(cfg: &Config, spec: &BundleSpec) -> Option<BurstRecord> {
    let (req, _) = qos::request(cfg, spec);
    let asked = req.burst?;
    Some(BurstRecord {
        v: RECORD_VERSION,
        container_id: String::new(),
        scope: None,
        cgroup_path: String::new(),
        request: asked.into(),
        cap_percent: req.burst_cap_percent,
        applied_us: 0,
    })
}

/// The burst in µs `spec` asks for under its quota (none without a quota
/// or a burst).
pub fn burst_for(cfg: &Config, spec: &BundleSpec) -> Option<u64> {
    burst_request(cfg, spec)?
        .burst_for_quota(spec.cpu_quota().0)
        .filter(|us| *us > 0)
}

/// The container as throttlewatch reads a bundle: its annotations with the
/// pod's `throttlewatch.io/` ones under them (the container's win), its
/// environment, its CPU resources.
pub fn spec_of(pod: &api::PodSandbox, c: &api::Container) -> BundleSpec {
    let mut annotations: BTreeMap<String, String> = pod
        .annotations
        .iter()
        .filter(|(k, _)| k.starts_with(PREFIX))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    annotations.extend(c.annotations.iter().map(|(k, v)| (k.clone(), v.clone())));
    let linux = c.linux.as_ref();
    let cpu = linux
        .and_then(|l| l.resources.as_ref())
        .and_then(|r| r.cpu.as_ref())
        .map(|cpu| Cpu {
            quota: cpu.quota.as_ref().map(|q| q.value),
            period: cpu.period.as_ref().map(|p| p.value),
            cpus: Some(cpu.cpus.clone()).filter(|s| !s.is_empty()),
        });
    BundleSpec {
        annotations,
        process: Some(SpecProcess { env: c.env.clone() }),
        linux: Some(Linux {
            cgroups_path: linux
                .map(|l| l.cgroups_path.clone())
                .filter(|p| !p.is_empty()),
            resources: Some(Resources { cpu }),
        }),
        ..Default::default()
    }
}

fn decode<M: Message>(method: &str, payload: &[u8]) -> Result<M, Status> {
    M::parse_from_bytes(payload).map_err(|e| {
        ttrpc::get_status(
            Code::INVALID_ARGUMENT,
            format!("{method}: the request is not a {}: {e}", M::NAME),
        )
    })
}

fn encode<M: Message>(m: &M) -> Answer {
    m.write_to_bytes()
        .map_err(|e| ttrpc::get_status(Code::INTERNAL, format!("encoding the answer: {e}")))
}

fn unimplemented(service: &str, method: &str) -> Status {
    ttrpc::get_status(
        Code::UNIMPLEMENTED,
        format!("{service}/{method} is not served by {NAME}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn private_config(dir: &Path) -> Config {
        Config {
            log_dir: dir.join("logs"),
            socket: dir.join("none.sock"),
            state_dir: dir.join("state"),
            start_agent: false,
            ..Config::default()
        }
    }

    fn plugin(dir: &Path, watch: WatchMode, mode: CgroupMode) -> Arc<Plugin> {
        Arc::new(Plugin::with_mode(
            private_config(dir),
            None,
            watch,
            Some(mode),
        ))
    }

    fn call<Q: Message, A: Message>(p: &Arc<Plugin>, method: &str, q: &Q) -> A {
        let bytes = p
            .handle(PLUGIN_SERVICE, method, &q.write_to_bytes().unwrap())
            .unwrap_or_else(|s| panic!("{method}: {s:?}"));
        A::parse_from_bytes(&bytes).unwrap()
    }

    fn container(id: &str, annotations: &[(&str, &str)], quota: Option<i64>) -> api::Container {
        let mut c = api::Container::new();
        c.id = id.into();
        c.pod_sandbox_id = "pod".into();
        c.annotations = annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        if let Some(q) = quota {
            let cpu = c
                .linux
                .mut_or_insert_default()
                .resources
                .mut_or_insert_default()
                .cpu
                .mut_or_insert_default();
            cpu.quota.mut_or_insert_default().value = q;
            cpu.period.mut_or_insert_default().value = 100_000;
        }
        c
    }

    fn create(
        p: &Arc<Plugin>,
        pod: api::PodSandbox,
        c: api::Container,
    ) -> api::CreateContainerResponse {
        let mut q = api::CreateContainerRequest::new();
        q.pod = MessageField::some(pod);
        q.container = MessageField::some(c);
        call(p, "CreateContainer", &q)
    }

    /// The mask NRI's `EventMask.Set` builds for these events.
    #[test]
    fn configure_subscribes_to_the_container_events() {
        let d = tempfile::tempdir().unwrap();
        let p = plugin(d.path(), WatchMode::Annotated, CgroupMode::V1);
        let mut q = api::ConfigureRequest::new();
        q.runtime_name = "containerd".into();
        q.runtime_version = "v2.3.4".into();
        q.request_timeout = 2000;
        let res: api::ConfigureResponse = call(&p, "Configure", &q);
        // CreateContainer 4, StartContainer 6, UpdateContainer 8,
        // PostUpdateContainer 9, StopContainer 10, RemoveContainer 11.
        assert_eq!(res.events, 0b111_1010_1000);
        assert_eq!(p.deadline(), Duration::from_millis(1500));
        assert_eq!(p.key("c").scope, Some(Scope::of_namespace("k8s.io")));
        let e = p.handle(PLUGIN_SERVICE, "Nope", b"").unwrap_err();
        assert_eq!(e.code.enum_value_or_default(), Code::UNIMPLEMENTED);
        let e = p
            .handle(PLUGIN_SERVICE, "Configure", b"\xff\xff")
            .unwrap_err();
        assert_eq!(e.code.enum_value_or_default(), Code::INVALID_ARGUMENT);
    }

    #[test]
    fn opt_in_by_annotation_or_configuration() {
        let d = tempfile::tempdir().unwrap();
        let p = plugin(d.path(), WatchMode::Annotated, CgroupMode::V1);
        let mut pod = api::PodSandbox::new();
        let plain = container("a", &[], None);
        assert!(!p.wanted(&pod, &plain));
        assert!(p.wanted(
            &pod,
            &container("b", &[("throttlewatch.io/watch", "true")], None)
        ));
        pod.annotations
            .insert("throttlewatch.io/cpu-burst".into(), "20ms".into());
        assert!(p.wanted(&pod, &plain));
        pod.runtime_handler = SHIM_HANDLER.into();
        assert!(!p.wanted(&pod, &plain), "our shim's pods are the shim's");
        let all = plugin(d.path(), WatchMode::All, CgroupMode::V1);
        let mut q = api::ConfigureRequest::new();
        q.config = "watch = \"annotated\"".into();
        let _: api::ConfigureResponse = call(&all, "Configure", &q);
        assert!(!all.wanted(&api::PodSandbox::new(), &plain));
        q.config = String::new();
        let _: api::ConfigureResponse = call(&all, "Configure", &q);
        assert!(all.wanted(&api::PodSandbox::new(), &plain));
        let sandbox = container(
            "s",
            &[("io.kubernetes.cri.container-type", "sandbox")],
            None,
        );
        assert!(!all.wanted(&api::PodSandbox::new(), &sandbox));
    }

    /// cgroup v2: the burst in the unified map, clamped to the quota; v1
    /// and unannotated containers: no adjustment.
    #[test]
    fn create_adjusts_the_v2_burst() {
        let d = tempfile::tempdir().unwrap();
        let v2 = plugin(d.path(), WatchMode::Annotated, CgroupMode::V2);
        let burst = [("throttlewatch.io/cpu-burst", "20ms")];
        let res = create(
            &v2,
            api::PodSandbox::new(),
            container("a", &burst, Some(50_000)),
        );
        let unified = &res.adjust.linux.resources.unified;
        assert_eq!(
            unified.get(V2_BURST_FILE).map(String::as_str),
            Some("20000")
        );
        let half = [("throttlewatch.io/cpu-burst", "50%")];
        let res = create(
            &v2,
            api::PodSandbox::new(),
            container("b", &half, Some(30_000)),
        );
        assert_eq!(
            res.adjust
                .linux
                .resources
                .unified
                .get(V2_BURST_FILE)
                .map(String::as_str),
            Some("15000")
        );
        let res = create(&v2, api::PodSandbox::new(), container("c", &burst, None));
        assert!(res.adjust.is_none(), "no quota, no burst: {res:?}");
        let res = create(
            &v2,
            api::PodSandbox::new(),
            container("d", &[], Some(50_000)),
        );
        assert!(res.adjust.is_none());
        let v1 = plugin(d.path(), WatchMode::Annotated, CgroupMode::V1);
        let res = create(
            &v1,
            api::PodSandbox::new(),
            container("e", &burst, Some(50_000)),
        );
        assert!(res.adjust.is_none(), "NRI has no v1 burst field: {res:?}");
    }

    /// cgroup v2: an update's burst is sized for the new quota (the create's
    /// is in the spec and would be written again after it).
    #[test]
    fn update_resizes_the_v2_burst() {
        let d = tempfile::tempdir().unwrap();
        let v2 = plugin(d.path(), WatchMode::Annotated, CgroupMode::V2);
        let burst = [("throttlewatch.io/cpu-burst", "20ms")];
        let update = |p: &Arc<Plugin>, quota: i64| {
            let mut q = api::UpdateContainerRequest::new();
            q.container = MessageField::some(container("u", &burst, Some(50_000)));
            q.linux_resources
                .mut_or_insert_default()
                .cpu
                .mut_or_insert_default()
                .quota
                .mut_or_insert_default()
                .value = quota;
            let res: api::UpdateContainerResponse = call(p, "UpdateContainer", &q);
            res.update
                .iter()
                .map(|u| {
                    let v = u.linux.resources.unified.get(V2_BURST_FILE).cloned();
                    (u.container_id.clone(), v.unwrap_or_default())
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            update(&v2, 10_000),
            [("u".to_string(), "10000".to_string())]
        );
        assert_eq!(
            update(&v2, 80_000),
            [("u".to_string(), "20000".to_string())]
        );
        assert_eq!(update(&v2, -1), [], "no quota: the spec's burst stands");
        let v1 = plugin(d.path(), WatchMode::Annotated, CgroupMode::V1);
        assert_eq!(update(&v1, 10_000), [], "v1: nothing in the spec to resize");
    }

    /// No agent: start and stop are answered at once, nothing refused.
    #[test]
    fn events_are_answered_without_an_agent() {
        let d = tempfile::tempdir().unwrap();
        let p = plugin(d.path(), WatchMode::Annotated, CgroupMode::V1);
        let mut c = container("a", &[("throttlewatch.io/watch", "true")], Some(50_000));
        c.pid = std::process::id();
        let mut q = api::StartContainerRequest::new();
        q.container = MessageField::some(c.clone());
        let t0 = std::time::Instant::now();
        let _: api::StartContainerResponse = call(&p, "StartContainer", &q);
        let mut q = api::StopContainerRequest::new();
        q.container = MessageField::some(c);
        let _: api::StopContainerResponse = call(&p, "StopContainer", &q);
        assert!(t0.elapsed() < p.deadline() * 2 + Duration::from_millis(500));
    }

    /// An agent that accepts and never answers: the start is answered by
    /// the deadline (three quarters of the runtime's request timeout).
    #[test]
    fn a_slow_agent_holds_no_start_up() {
        let d = tempfile::tempdir().unwrap();
        let p = plugin(d.path(), WatchMode::Annotated, CgroupMode::V1);
        let listener = std::os::unix::net::UnixListener::bind(d.path().join("none.sock")).unwrap();
        let _held = std::thread::spawn(move || {
            let conns: Vec<_> = listener.incoming().take(2).collect();
            std::thread::sleep(Duration::from_secs(30));
            drop(conns);
        });
        let mut q = api::ConfigureRequest::new();
        q.request_timeout = 400;
        let _: api::ConfigureResponse = call(&p, "Configure", &q);
        assert_eq!(p.deadline(), Duration::from_millis(300));
        let mut c = container("slow", &[("throttlewatch.io/watch", "true")], Some(50_000));
        c.pid = std::process::id();
        let mut q = api::StartContainerRequest::new();
        q.container = MessageField::some(c);
        let t0 = std::time::Instant::now();
        let _: api::StartContainerResponse = call(&p, "StartContainer", &q);
        let took = t0.elapsed();
        assert!(
            took >= Duration::from_millis(250) && took < Duration::from_millis(1000),
            "answered after {took:?}"
        );
    }

    #[test]
    fn spec_takes_the_pods_keys_under_the_containers() {
        let mut pod = api::PodSandbox::new();
        pod.annotations
            .insert("throttlewatch.io/cpu-burst".into(), "5ms".into());
        pod.annotations
            .insert("throttlewatch.io/watch".into(), "true".into());
        pod.annotations.insert("other".into(), "x".into());
        let c = container("a", &[("throttlewatch.io/cpu-burst", "7ms")], Some(40_000));
        let s = spec_of(&pod, &c);
        assert_eq!(
            s.annotations.get("throttlewatch.io/cpu-burst").unwrap(),
            "7ms"
        );
        assert_eq!(s.annotations.get("throttlewatch.io/watch").unwrap(), "true");
        assert!(!s.annotations.contains_key("other"));
        assert_eq!(s.cpu_quota(), (Some(40_000), Some(100_000)));
    }

    #[test]
    fn event_mask_is_nris() {
        assert_eq!(event_mask(&[api::Event::RUN_POD_SANDBOX]), 1);
        assert_eq!(event_mask(&[api::Event::CREATE_CONTAINER]), 1 << 3);
        assert_eq!(event_mask(&[]), 0);
    }
}
