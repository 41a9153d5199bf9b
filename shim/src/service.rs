//! The shim's three lives, as containerd runs it:
//! `start` (spawn or reuse the daemon, print its address on stdout),
//! `delete` (clean up after a dead daemon, print a DeleteResponse protobuf),
//! and the daemon itself (the ttrpc Task service).
//!
//! The bootstrap is ours rather than `containerd_shim::run`: that one serves
//! only `containerd.task.v3.Task` and answers `start` in the JSON form of
//! containerd ≥ 1.7, while containerd 1.6 speaks task v2 and reads a bare
//! address. We serve the same service under both names.

use std::io::{IsTerminal, Read, Write};
use std::os::fd::IntoRawFd;
use std::os::unix::fs::FileTypeExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::Path;
use std::sync::{mpsc, Arc};

use containerd_shim::bootstrap::{BootstrapParams, BootstrapResult};
use containerd_shim::protos::protobuf::{Message, MessageField};
use containerd_shim::protos::shim::event::Envelope;
use containerd_shim::protos::shim::events::ForwardRequest;
use containerd_shim::protos::ttrpc::{self, Server};
use containerd_shim::protos::EventsClient;
use containerd_shim::{api, Context, ExitSignal, Flags, StartOpts};
use log::{error, info, warn};
use throttlewatch_core::config::{BadConfig, Config};
use throttlewatch_lifecycle::spec_file::CONFIG_JSON;

use crate::runc::{runc_binary, runc_root, Runc};
use crate::state::Event;
use crate::task::TaskService;

pub use crate::info::RUNTIME_ID;

/// Spec annotations that put containers into one shim, first match wins
/// (the runc shim's list, ours first).
pub const GROUP_ANNOTATIONS: [&str; 3] = [
    "io.containerd.throttlewatch.v2.group",
    "io.containerd.runc.v2.group",
    "io.kubernetes.cri.sandbox-id",
];

type BoxError = Box<dyn std::error::Error>;

/// The ttrpc worker pool of each connection (see [`ttrpc_server`]).
pub(crate) const POOL_MIN: usize = 1;
pub(crate) const POOL_DEFAULT: usize = 2;
pub(crate) const POOL_MAX: usize = 64;

/// How long the daemon waits, after Shutdown, for other requests to be answered.
const DRAIN_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

/// The flags, as the runc shim's `-help` lists them (Go's flag package: on
/// stderr, exit 0).
const USAGE_FLAGS: &str = "  -address string
    \tgrpc address back to main containerd
  -bundle string
    \tpath to the bundle if not workdir
  -debug
    \tenable debug output in logs
  -id string
    \tid of the task
  -info
    \tget the option protobuf from stdin, print the shim info protobuf to stdout, and exit
  -namespace string
    \tnamespace that owns the shim
  -publish-binary string
    \tpath to publish binary (used for publishing events)
  -socket string
    \tsocket path to serve
  -v\t
  -version
    \tshow the shim version and exit
";

/// `-h`, `-help` or `--help` (Go's flag package takes one or two dashes).
fn wants_help(args: &[std::ffi::OsString]) -> bool {
    args.iter()
        .any(|a| matches!(a.to_str(), Some("-h" | "-help" | "--h" | "--help")))
}

pub fn main() -> i32 {
    let args: Vec<_> = std::env::args_os().collect();
    if wants_help(&args[1..]) {
        eprint!("Usage of {}:\n{USAGE_FLAGS}", args[0].to_string_lossy());
        return 0;
    }
    let flags = match containerd_shim::parse(&args[1..]) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("{RUNTIME_ID}: {e}");
            return 1;
        }
    };
    if flags.version {
        println!(
            "containerd-shim-throttlewatch-v2 {} ({RUNTIME_ID})",
            env!("CARGO_PKG_VERSION")
        );
        return 0;
    }
    if flags.info {
        let (cfg, _) = load_config();
        return match crate::info::main(&crate::runc::runc_binary(&cfg)) {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("{RUNTIME_ID}: {e}");
                1
            }
        };
    }
    if flags.namespace.is_empty() {
        eprintln!("{RUNTIME_ID}: -namespace is required");
        return 1;
    }
    let r = match flags.action.as_str() {
        "start" => start(&flags),
        "delete" => delete(&flags),
        _ => serve(&flags),
    };
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{RUNTIME_ID}: {e}");
            error!("{e}");
            1
        }
    }
}

/// The configuration, or the built-in defaults for paths and the runtime
/// with the reason it could not be used: the task service then changes no
/// spec (the defaults would allow every key) and honours the fail mode the
/// file meant.
fn load_config() -> (Config, Option<BadConfig>) {
    match throttlewatch_core::config_check::load(None) {
        Ok(c) => (c, None),
        Err(bad) => {
            warn!("{bad}; specs are left unchanged");
            eprintln!("{RUNTIME_ID}: {bad}; specs are left unchanged");
            (Config::default(), Some(bad))
        }
    }
}

/// The grouping key of a bundle's spec (cwd is the bundle on `start`).
pub fn group_of(spec_json: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(spec_json).ok()?;
    GROUP_ANNOTATIONS.iter().find_map(|k| {
        v["annotations"][*k]
            .as_str()
            .filter(|s| !s.is_empty())
            .map(String::from)
    })
}

fn socket_path(address: &str) -> &str {
    address.strip_prefix("unix://").unwrap_or(address)
}

/// Why `start` cannot use the bootstrap params on its stdin.
#[derive(Debug, thiserror::Error)]
enum BootstrapError {
    /// The params are for another shim instance than the flags name.
    #[error("bootstrap params for {namespace}/{instance_id} do not match command line arguments {flag_namespace}/{flag_id}")]
    Mismatch {
        namespace: String,
        instance_id: String,
        flag_namespace: String,
        flag_id: String,
    },
    #[error("bootstrap params carry no containerd TTRPC address")]
    NoTtrpcAddress,
}

/// What `start` was told: containerd 2.3's bootstrap protocol
/// (`BootstrapParams` on stdin, for this id and namespace: containerd's
/// docs/runtime-v2.md), else the flags and environment of older ones (whose
/// stdin is the runtime options).
fn start_opts(flags: &Flags, stdin: &[u8]) -> Result<(StartOpts, bool), BootstrapError> {
    let legacy = StartOpts {
        id: flags.id.clone(),
        publish_binary: flags.publish_binary.clone(),
        address: flags.address.clone(),
        ttrpc_address: std::env::var("TTRPC_ADDRESS").unwrap_or_default(),
        namespace: flags.namespace.clone(),
        debug: flags.debug,
        ..Default::default()
    };
    let Some(p) = (!stdin.is_empty())
        .then(|| BootstrapParams::parse_from_bytes(stdin).ok())
        .flatten()
        // An `Any` of runtime options parses as one that names only an id
        // and a namespace (fields 1 and 2): that is the older protocol.
        .filter(|p| {
            *p != BootstrapParams {
                instance_id: p.instance_id.clone(),
                namespace: p.namespace.clone(),
                ..Default::default()
            }
        })
    else {
        return Ok((legacy, false));
    };
    if p.instance_id != flags.id || p.namespace != flags.namespace {
        return Err(BootstrapError::Mismatch {
            namespace: p.namespace,
            instance_id: p.instance_id,
            flag_namespace: flags.namespace.clone(),
            flag_id: flags.id.clone(),
        });
    }
    let or = |a: &str, b: &str| {
        if a.is_empty() {
            b.to_string()
        } else {
            a.to_string()
        }
    };
    let opts = StartOpts {
        publish_binary: or(&p.containerd_binary, &legacy.publish_binary),
        address: or(&p.containerd_grpc_address, &legacy.address),
        ttrpc_address: or(&p.containerd_ttrpc_address, &legacy.ttrpc_address),
        containerd_version: p.containerd_version.clone(),
        socket_dir: p.socket_dir.clone().filter(|d| !d.is_empty()),
        ..legacy
    };
    if opts.ttrpc_address.is_empty() {
        return Err(BootstrapError::NoTtrpcAddress);
    }
    Ok((opts, true))
}

fn start(flags: &Flags) -> Result<(), BoxError> {
    let mut stdin = Vec::new();
    if !std::io::stdin().is_terminal() {
        std::io::stdin()
            .lock()
            .take(10 << 20)
            .read_to_end(&mut stdin)?;
    }
    let (opts, bootstrap) = start_opts(flags, &stdin)?;
    let spec = std::fs::read_to_string(CONFIG_JSON).unwrap_or_default();
    let grouping = group_of(&spec).unwrap_or_else(|| flags.id.clone());
    let address = opts.socket_address(&grouping);
    // Another container of the same sandbox already has a live shim: reuse it.
    let address = if UnixStream::connect(socket_path(&address)).is_ok() {
        address
    } else {
        containerd_shim::spawn(opts, &grouping, Vec::new())?.1
    };
    containerd_shim::util::write_address(&address)?;
    let mut out = std::io::stdout().lock();
    if bootstrap {
        let result = BootstrapResult {
            version: containerd_shim::protos::TASK_API_VERSION,
            address,
            protocol: "ttrpc".into(),
            ..Default::default()
        };
        result.write_to_writer(&mut out)?;
    } else {
        out.write_all(address.as_bytes())?;
    }
    out.flush()?;
    Ok(())
}

fn delete(flags: &Flags) -> Result<(), BoxError> {
    reap_children()?; // runc's exit status arrives through the reaper
    let (cfg, _) = load_config();
    let runc = Runc {
        binary: runc_binary(&cfg),
        root: runc_root(&flags.namespace),
    };
    if let Err(e) = runc.delete(&flags.id) {
        eprintln!("{RUNTIME_ID}: cleanup of {}: {e}", flags.id);
    }
    let bundle = if flags.bundle.is_empty() {
        std::env::current_dir()?
    } else {
        flags.bundle.clone().into()
    };
    let rootfs = bundle.join("rootfs");
    let _ = containerd_shim::mount::umount_recursive(rootfs.to_str(), 0);
    let resp = api::DeleteResponse {
        exit_status: 128 + libc::SIGKILL as u32,
        exited_at: Some(containerd_shim::util::timestamp()?).into(),
        ..Default::default()
    };
    let mut out = std::io::stdout().lock();
    resp.write_to_writer(&mut out)?;
    out.flush()?;
    Ok(())
}

/// SIGCHLD → reap every child → the monitor (the Task service's exit watcher
/// and runc invocations subscribe there).
fn reap_children() -> std::io::Result<()> {
    use signal_hook::consts::{SIGCHLD, SIGINT, SIGPIPE, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGCHLD, SIGTERM, SIGINT, SIGPIPE])?;
    std::thread::spawn(move || {
        for sig in signals.forever() {
            if sig != SIGCHLD {
                continue;
            }
            loop {
                let mut status = 0;
                // SAFETY: waitpid(2) with a valid status pointer.
                let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
                if pid <= 0 {
                    break;
                }
                let code = if libc::WIFEXITED(status) {
                    libc::WEXITSTATUS(status)
                } else if libc::WIFSIGNALED(status) {
                    128 + libc::WTERMSIG(status)
                } else {
                    continue;
                };
                let _ = containerd_shim::monitor::monitor_notify_by_pid(pid, code);
            }
        }
    });
    Ok(())
}

/// Publish events in order, off the request threads, straight through
/// containerd's Events service (`RemotePublisher::publish` would pack them
/// with protobuf reflection, which costs heap).
fn publish_events(
    address: &str,
    namespace: String,
    rx: mpsc::Receiver<Event>,
) -> Result<(), BoxError> {
    let address = if address.contains("://") {
        address.to_string()
    } else {
        format!("unix://{address}")
    };
    let client = EventsClient::new(ttrpc::Client::connect(&address)?);
    std::thread::spawn(move || {
        for (topic, ev) in rx {
            let envelope = Envelope {
                timestamp: MessageField::some(
                    containerd_shim::util::timestamp().unwrap_or_default(),
                ),
                namespace: namespace.clone(),
                topic: topic.into(),
                event: MessageField::some(ev),
                ..Default::default()
            };
            let req = ForwardRequest {
                envelope: MessageField::some(envelope),
                ..Default::default()
            };
            if let Err(e) = client.forward(Context::default(), &req) {
                warn!("publish {topic}: {e}");
            }
            // Every event follows a request (create, start, exit, delete)
            // that parsed specs or ran runc: hand freed heap pages back.
            // SAFETY: malloc_trim(3) has no preconditions.
            unsafe { libc::malloc_trim(0) };
        }
    });
    Ok(())
}

fn bind(address: &str) -> std::io::Result<Option<UnixListener>> {
    let path = Path::new(socket_path(address));
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    match UnixListener::bind(path) {
        Ok(l) => Ok(Some(l)),
        Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
            if UnixStream::connect(path).is_ok() {
                return Ok(None); // a live shim already serves this group
            }
            std::fs::remove_file(path)?;
            UnixListener::bind(path).map(Some)
        }
        Err(e) => Err(e),
    }
}

fn serve(flags: &Flags) -> Result<(), BoxError> {
    if flags.socket.is_empty() {
        return Err("-socket is required".into());
    }
    containerd_shim::logger::init(flags.debug, "info", &flags.namespace, &flags.id)?;
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER): container processes re-parent to us.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        return Err(format!("set subreaper: {}", std::io::Error::last_os_error()).into());
    }
    reap_children()?;
    let (cfg, bad_config) = load_config();
    let runc = Runc {
        binary: runc_binary(&cfg),
        root: runc_root(&flags.namespace),
    };
    let (tx, rx) = mpsc::channel();
    let ttrpc_address = std::env::var("TTRPC_ADDRESS").map_err(|_| "TTRPC_ADDRESS is not set")?;
    publish_events(&ttrpc_address, flags.namespace.clone(), rx)?;
    let exit = Arc::new(ExitSignal::default());
    let task = Arc::new(TaskService::new(runc, cfg, tx, exit.clone()).with_bad_config(bad_config));

    let Some(listener) = bind(&flags.socket)? else {
        containerd_shim::util::write_address(&flags.socket)?;
        signal_started();
        return Ok(());
    };
    let in_flight = crate::drain::InFlight::default();
    let mut methods = containerd_shim::protos::create_task(task.clone());
    for (name, m) in containerd_shim::protos::create_task(task) {
        methods.insert(
            name.replace("/containerd.task.v3.", "/containerd.task.v2."),
            m,
        );
    }
    let mut server = ttrpc_server(listener.into_raw_fd(), in_flight.wrap(methods))?;
    server.start_listen()?;
    signal_started();
    info!("serving {} for {}", flags.socket, flags.id);
    exit.wait();
    in_flight.drain(DRAIN_LIMIT); // answer what is in flight (crate::drain)
    server.shutdown();
    let path = socket_path(&flags.socket);
    if std::fs::metadata(path)
        .map(|m| m.file_type().is_socket())
        .unwrap_or(false)
    {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// The shim's ttrpc server on `fd`, its worker pool per connection at
/// least [`POOL_MIN`] idle, [`POOL_DEFAULT`] at first, and a worker leaving
/// only when more than [`POOL_MAX`] are idle.
///
/// ttrpc 0.10's sync pool counts idle workers with an atomic that a worker
/// bumps before it checks the ceiling and takes back before it leaves; a
/// request taken in that window sees the leaver as idle and starts no
/// replacement. With a ceiling of one, two workers leaving at once left a
/// connection with no worker at all: every later request on it (containerd's
/// State, Kill, Delete) went unanswered for good. Seen on loaded machines:
/// CI's critest on containerd 2.3 (StopPodSandbox: "failed to get task ...
/// context deadline exceeded", the run past its 300 s) and two local loaded
/// runs (1.6, 2.3); gdb of the hung 2.3 shim showed its second connection's
/// reader, writer and controller threads and no worker. With a ceiling of 64 a worker leaves
/// only after a burst of that many requests, so the window is never
/// entered in practice; idle workers cost a stack each. `Wait`, which blocks
/// until the process exits, runs on a thread of its own (crate::drain).
pub(crate) fn ttrpc_server(
    fd: std::os::fd::RawFd,
    methods: crate::drain::Methods,
) -> ttrpc::Result<Server> {
    Ok(Server::new()
        .set_thread_count_min(POOL_MIN)
        .set_thread_count_default(POOL_DEFAULT)
        .set_thread_count_max(POOL_MAX)
        .add_listener(fd)?
        .register_service(methods))
}

/// `start` reads our stdout until it closes: point it at stderr (/dev/null).
fn signal_started() {
    // SAFETY: dup2 of the standard descriptors.
    unsafe { libc::dup2(libc::STDERR_FILENO, libc::STDOUT_FILENO) };
}

#[cfg(test)]
#[path = "pool_tests.rs"]
mod pool_tests;

#[cfg(test)]
#[path = "service_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "service_bootstrap_tests.rs"]
mod bootstrap_tests;
