//! The plugin's answers to the runtime: what each NRI event does with a
//! container, through `throttlewatch-lifecycle` as the other front ends do.
//!
//! - `Configure` (`configure.rs`): the runtime, its timeouts, the plugin configuration; the
//!   answer subscribes to the container events below.
//! - `Synchronize` (`sync.rs`): containers this plugin registered that
//!   the runtime no longer runs are ended; the running ones get their
//!   annotation QoS again and are registered with the agent (an agent that
//!   watches one already answers so: no second `start` record); answered at
//!   once, the work goes on behind it.
//! - `CreateContainer`: on cgroup v2, the burst asked for goes into the
//!   adjustment (`linux.resources.unified["cpu.max.burst"]`); NRI has no
//!   field for the v1 burst (`cpu.cfs_burst_us`), which is written at start.
//! - `StartContainer`: the task exists (its init waits for the start, the
//!   cgroup is there) and its entrypoint has not run: annotation QoS into
//!   the cgroup, then the register — the hook's createRuntime work.
//! - `UpdateContainer` / `PostUpdateContainer` (`update.rs`): the burst is
//!   cleared before the new quota is written (the kernel refuses a quota
//!   below the burst) and written back clamped to it after, or after
//!   [`Plugin::hold_limit`] when no post-update comes.
//! - `StopContainer` / `RemoveContainer` (`end.rs`): the agent writes the
//!   `end` record; the burst record and exclusive cores are released.
//!
//! Fail-open: every container event is answered within the runtime's
//! request timeout whatever the agent does; an event whose work is not done
//! by then is answered without it (the work finishes behind the answer) and
//! nothing is ever refused.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::sync_channel;
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use protobuf::{Message, MessageField};
use throttlewatch_cgroup::{CgroupMode, Hierarchies};
use throttlewatch_core::config::Config;
use throttlewatch_core::keys::PREFIX;
use throttlewatch_core::{ContainerKey, EndReason, Scope};
use throttlewatch_lifecycle::bundle_spec;
use throttlewatch_lifecycle::created::{self, Created};
use throttlewatch_lifecycle::held_burst::HeldBurst;
use throttlewatch_lifecycle::report::Reporter;
use throttlewatch_lifecycle::timing::Phases;
use throttlewatch_lifecycle::HookStage;
use ttrpc::{Code, Status};

use crate::api;
use crate::container::{burst_for, spec_of};
use crate::diag::say;
use crate::locked::lock;
use crate::options::WatchMode;
use crate::registered::Registered;
use crate::rpc::Answer;
use crate::NAME;
use held::Holds;
use listed::Listed;
use syncing::Syncing;

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

/// Set to 1: each event's answer time is said (the latency test reads it).
pub const TIMINGS_ENV: &str = "THROTTLEWATCH_NRI_TIMINGS";

/// What `Configure` told about the runtime.
#[derive(Debug, Clone)]
struct RuntimeInfo {
    name: String,
    request_timeout: Duration,
}

/// throttlewatch's configuration and the file it came from (handed to an
/// agent the lifecycle starts).
#[derive(Debug)]
pub struct LoadedConfig {
    pub cfg: Config,
    pub path: Option<PathBuf>,
}

/// The plugin: the node's throttlewatch configuration, the watch mode, the
/// bursts held across updates, and what this connection's `Synchronize`
/// listed so far.
pub struct Plugin {
    settings: Mutex<Arc<LoadedConfig>>,
    cli_watch: WatchMode,
    watch: Mutex<WatchMode>,
    runtime: Mutex<RuntimeInfo>,
    held: Mutex<Holds<HeldBurst>>,
    /// The containers of the `Synchronize` pieces of this connection, by id.
    listed: Mutex<HashMap<String, Listed>>,
    /// Containers ended while a `Synchronize`'s registrations run behind
    /// its answer (`sync.rs`): not registered again by it.
    syncing: Mutex<Syncing>,
    /// Keeps one such registration and an end of a container apart.
    sync_gate: RwLock<()>,
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
            settings: Mutex::new(Arc::new(LoadedConfig {
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
            listed: Mutex::default(),
            syncing: Mutex::default(),
            sync_gate: RwLock::default(),
            mode,
        }
    }

    /// The configuration now (a runtime-launched plugin may be given its
    /// file by `Configure`).
    pub fn settings(&self) -> Arc<LoadedConfig> {
        Arc::clone(&lock(&self.settings))
    }

    /// Answer one call of the runtime on the plugin service. With
    /// `THROTTLEWATCH_NRI_TIMINGS=1` each answer's time is said on stderr
    /// (`<method> answered in N us`: what the plugin adds to the event).
    pub fn handle(self: &Arc<Self>, service: &str, method: &str, payload: &[u8]) -> Answer {
        static TIMINGS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        if !*TIMINGS.get_or_init(|| std::env::var_os(TIMINGS_ENV).is_some_and(|v| v == "1")) {
            return self.answer(service, method, payload);
        }
        let t0 = std::time::Instant::now();
        let a = self.answer(service, method, payload);
        say(&format!(
            "{method} answered in {} us",
            t0.elapsed().as_micros()
        ));
        a
    }

    fn answer(self: &Arc<Self>, service: &str, method: &str, payload: &[u8]) -> Answer {
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
                // The process has exited, the runtime's low-level delete
                // (the cgroup's removal) comes after the answer: the shim's
                // `delete`.
                self.within(method, id, (), move |p| {
                    p.finish(&req.pod, &req.container, EndReason::Delete)
                });
                encode(&api::StopContainerResponse::new())
            }
            "RemoveContainer" => {
                let req: api::RemoveContainerRequest = decode(method, payload)?;
                let id = req.container.id.clone();
                // After the low-level delete, where runc runs poststop.
                self.within(method, id, (), move |p| {
                    p.finish(&req.pod, &req.container, EndReason::Poststop)
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
        work: impl FnOnce(&Arc<Plugin>) -> T + Send + 'static,
    ) -> T {
        let (tx, rx) = sync_channel(1);
        let me = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("nri-event".into())
            .spawn(move || {
                let _ = tx.send(work(&me));
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
        self.on_task(pod, c);
    }

    /// The hook's createRuntime work for a container whose task exists:
    /// its registration noted, the annotation QoS into its cgroup (the
    /// same values again for one that has them: idempotent), the register.
    fn on_task(&self, pod: &api::PodSandbox, c: &api::Container) {
        let s = self.settings();
        let cfg = &s.cfg;
        let key = self.key(&c.id);
        self.note_registered(&key);
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
            exit_reported: true,
        };
        if let Err(e) = created::on_created(cfg, s.path.as_deref(), &mut rep, created, &mut t) {
            rep.error(&format!("{e:#}"));
        }
    }

    /// `key` is registered through this plugin: a later `Synchronize` that
    /// no longer lists it ends it (written before the register, so that a
    /// plugin that dies in between still does).
    fn note_registered(&self, key: &ContainerKey) {
        let cfg = &self.settings().cfg;
        if let Err(e) = Registered::new(&cfg.state_dir).add(key) {
            say(&format!(
                "cannot note the registration of {key}: {e}; a Synchronize will not end it"
            ));
        }
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

mod configure;
mod end;
pub mod held;
pub mod listed;
pub(crate) mod sync;
mod syncing;
mod update;

#[cfg(test)]
#[path = "plugin_tests.rs"]
mod tests;
