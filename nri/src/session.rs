//! One connection to the runtime, from registration to its end, and the
//! two ways a plugin gets one:
//!
//! - a daemon dials the runtime's NRI socket ([`run_daemon`]), and dials
//!   again whenever the connection ends (the runtime restarted): every new
//!   connection registers again and is synchronized again;
//! - a plugin the runtime launched from its plugin directory inherits a
//!   connected socket, its descriptor in `NRI_PLUGIN_SOCKET`
//!   ([`inherited_socket`]); when that connection ends the plugin exits, and
//!   the runtime launches it again when it restarts.
//!
//! Either way the peer must be root or this plugin's own user: the
//! runtime's events make the plugin write cgroups and register processes,
//! so a socket anyone could have bound is not trusted.

use std::io;
use std::os::fd::{FromRawFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use crate::api;
use crate::diag::say;
use crate::mux::{Mux, MuxError, PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN};
use crate::options::Identity;
use crate::plugin::{Plugin, RUNTIME_SERVICE};
use crate::rpc::{self, Client, Handler, RpcError};
use crate::NRI_VERSION;

/// How long the runtime has to answer the registration (NRI's default
/// registration timeout).
pub const REGISTRATION_TIMEOUT: Duration = Duration::from_secs(5);
/// A daemon's pause between two dials of the runtime's socket.
pub const REDIAL_INTERVAL: Duration = Duration::from_millis(500);
/// NRI's environment variable for an inherited connection.
pub const SOCKET_ENV: &str = "NRI_PLUGIN_SOCKET";
/// How long a daemon waits for the agent before it registers anyway.
pub const AGENT_WAIT: Duration = Duration::from_secs(30);

/// Why a connection to the runtime ended or never began.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error(
        "{SOCKET_ENV}={value:?}: expected the number of an open unix socket descriptor, 3 or above"
    )]
    BadDescriptor { value: String },
    #[error("{SOCKET_ENV}={fd}: descriptor {fd} is {what}; expected an open unix socket")]
    NotASocket { fd: RawFd, what: String },
    #[error("the peer of the NRI connection runs as uid {uid}; accepted: 0 (root) or {ours} (this plugin's)")]
    UntrustedPeer { uid: u32, ours: u32 },
    #[error("cannot read the NRI peer's credentials: {0}")]
    PeerCredentials(nix::Error),
    #[error("RegisterPlugin: {0}")]
    Register(RpcError),
    #[error("serving the runtime: {0}")]
    Serve(RpcError),
    #[error("the plugin service's thread panicked")]
    ServerPanicked,
    #[error(transparent)]
    Mux(#[from] MuxError),
    #[error("NRI connection: {0}")]
    Io(#[from] io::Error),
}

/// Check that the socket's peer is root or our own user.
pub fn check_peer(s: &UnixStream) -> Result<(), SessionError> {
    let cred = nix::sys::socket::getsockopt(s, nix::sys::socket::sockopt::PeerCredentials)
        .map_err(SessionError::PeerCredentials)?;
    let ours = nix::unistd::geteuid().as_raw();
    match cred.uid() {
        0 => Ok(()),
        uid if uid == ours => Ok(()),
        uid => Err(SessionError::UntrustedPeer { uid, ours }),
    }
}

/// Register on `stream` and serve the runtime until the connection ends.
/// Ok: the runtime closed it.
pub fn run_session(
    stream: UnixStream,
    plugin: &Arc<Plugin>,
    id: &Identity,
) -> Result<(), SessionError> {
    check_peer(&stream)?;
    let mux = Mux::new(stream)?;
    let served = serve_and_register(&mux, plugin, id);
    mux.close();
    served
}

fn serve_and_register(mux: &Mux, plugin: &Arc<Plugin>, id: &Identity) -> Result<(), SessionError> {
    let (sr, sw) = mux.open(PLUGIN_SERVICE_CONN)?;
    let (cr, cw) = mux.open(RUNTIME_SERVICE_CONN)?;
    let p = Arc::clone(plugin);
    let handler: Handler = Arc::new(move |service: &str, method: &str, payload: &[u8]| {
        p.handle(service, method, payload)
    });
    // The plugin service first: the runtime configures the plugin as soon
    // as it has answered the registration.
    let server = std::thread::Builder::new()
        .name("nri-serve".into())
        .spawn(move || rpc::serve(sr, sw, handler))?;
    let client = Client::new(cr, cw)?;
    let mut req = api::RegisterPluginRequest::new();
    req.plugin_name = id.name.clone();
    req.plugin_idx = id.idx.clone();
    req.NRI_version = NRI_VERSION.into();
    let registered: Result<api::Empty, RpcError> = client.call(
        RUNTIME_SERVICE,
        "RegisterPlugin",
        &req,
        REGISTRATION_TIMEOUT,
    );
    if let Err(e) = registered {
        mux.close();
        let _ = server.join();
        return Err(SessionError::Register(e));
    }
    say(&format!(
        "registered as {}-{} (NRI {NRI_VERSION})",
        id.idx, id.name
    ));
    match server.join() {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(SessionError::Serve(e)),
        Err(_) => Err(SessionError::ServerPanicked),
    }
}

/// A daemon's life: dial `socket`, serve, dial again after each end (the
/// runtime restarted) until the process is stopped. A refused or missing
/// socket is said once until it changes.
pub fn run_daemon(socket: &Path, plugin: &Arc<Plugin>, id: &Identity) -> ! {
    let mut last: Option<String> = None;
    loop {
        wait_for_agent(plugin, AGENT_WAIT);
        match UnixStream::connect(socket) {
            Ok(s) => {
                say(&format!("connected to {}", socket.display()));
                last = None;
                match run_session(s, plugin, id) {
                    Ok(()) => say("the runtime closed the connection; dialing again"),
                    Err(e) => say(&format!("{e}; dialing again")),
                }
            }
            Err(e) => {
                let now = format!("cannot connect to {}: {e}", socket.display());
                if last.as_deref() != Some(now.as_str()) {
                    say(&format!("{now}; retrying every {REDIAL_INTERVAL:?}"));
                    last = Some(now);
                }
            }
        }
        std::thread::sleep(REDIAL_INTERVAL);
    }
}

/// A daemon whose configuration expects an agent that runs elsewhere
/// (`start_agent = false`: the DaemonSet's other container, the agent's
/// unit) registers only once that agent answers (at most `limit`): a
/// container that starts before then is left to the runtime, and the
/// `Synchronize` of the registration that follows registers it, where a
/// container started while the plugin was registered and the agent not yet
/// up would go unwatched for good. Said once.
pub fn wait_for_agent(plugin: &Plugin, limit: Duration) {
    let cfg = &plugin.settings().cfg;
    if cfg.start_agent {
        return;
    }
    let agent = throttlewatch_lifecycle::AgentClient::of(cfg);
    let status = throttlewatch_core::protocol::Request::Status;
    let t0 = std::time::Instant::now();
    let mut said = false;
    while agent.call(&status).is_err() {
        if t0.elapsed() >= limit {
            say(&format!(
                "no agent answers on {} after {limit:?}; registering anyway (QoS without logs until it does)",
                agent.socket().display()
            ));
            return;
        }
        if !said {
            say(&format!(
                "waiting for the agent on {} before registering (containers started meanwhile are registered at the Synchronize)",
                agent.socket().display()
            ));
            said = true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The connection the runtime handed a plugin it launched, if it did:
/// the descriptor in `NRI_PLUGIN_SOCKET` (checked to be a socket, made
/// close-on-exec, the variable removed so children do not see it).
pub fn inherited_socket() -> Result<Option<UnixStream>, SessionError> {
    let Some(value) = std::env::var_os(SOCKET_ENV) else {
        return Ok(None);
    };
    std::env::remove_var(SOCKET_ENV);
    let value = value.to_string_lossy().into_owned();
    let fd: RawFd = value
        .trim()
        .parse()
        .ok()
        .filter(|fd| *fd >= 3)
        .ok_or_else(|| SessionError::BadDescriptor {
            value: value.clone(),
        })?;
    // SAFETY: fstat only writes the stat buffer it is given.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid buffer; a bad descriptor is an error return.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(SessionError::NotASocket {
            fd,
            what: io::Error::last_os_error().to_string(),
        });
    }
    if st.st_mode & libc::S_IFMT != libc::S_IFSOCK {
        return Err(SessionError::NotASocket {
            fd,
            what: format!("not a socket (mode {:o})", st.st_mode),
        });
    }
    // SAFETY: setting FD_CLOEXEC on an open descriptor has no other effect.
    unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    // SAFETY: the runtime gave this process the descriptor for this
    // connection; nothing else here owns it, and it is taken once (the
    // variable is gone).
    Ok(Some(unsafe { UnixStream::from_raw_fd(fd) }))
}

/// Where a daemon dials by default (NRI's default socket).
pub fn default_socket() -> PathBuf {
    PathBuf::from("/var/run/nri/nri.sock")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::options::WatchMode;
    use crate::plugin::{event_mask, EVENTS, PLUGIN_SERVICE};
    use protobuf::Message;
    use std::sync::mpsc::channel;
    use throttlewatch_core::config::Config;

    /// A runtime played over a socket pair: the plugin registers on the
    /// runtime connection, then is configured and synchronized on its own,
    /// and its session ends when the runtime closes the trunk.
    #[test]
    fn a_session_against_a_fake_runtime() {
        let d = tempfile::tempdir().unwrap();
        let cfg = Config {
            log_dir: d.path().join("logs"),
            socket: d.path().join("none.sock"),
            state_dir: d.path().join("state"),
            start_agent: false,
            ..Config::default()
        };
        let plugin = Arc::new(Plugin::with_mode(cfg, None, WatchMode::Annotated, None));
        let id = Identity {
            name: "tw".into(),
            idx: "42".into(),
        };
        let (ours, theirs) = UnixStream::pair().unwrap();
        // Both of the runtime's connections open before the plugin speaks.
        let rt = Mux::new(theirs).unwrap();
        let (sr, sw) = rt.open(RUNTIME_SERVICE_CONN).unwrap();
        let (cr, cw) = rt.open(PLUGIN_SERVICE_CONN).unwrap();
        let (registered_tx, registered) = channel();
        let handler: Handler = Arc::new(move |service: &str, method: &str, payload: &[u8]| {
            assert_eq!((service, method), (RUNTIME_SERVICE, "RegisterPlugin"));
            let req = api::RegisterPluginRequest::parse_from_bytes(payload).unwrap();
            registered_tx.send(req).unwrap();
            Ok(api::Empty::new().write_to_bytes().unwrap())
        });
        std::thread::spawn(move || rpc::serve(sr, sw, handler));
        let session = std::thread::spawn(move || run_session(ours, &plugin, &id));
        let req = registered.recv_timeout(Duration::from_secs(5)).unwrap();
        assert_eq!(
            (req.plugin_name.as_str(), req.plugin_idx.as_str()),
            ("tw", "42")
        );
        assert_eq!(req.NRI_version, NRI_VERSION);

        let client = Client::new(cr, cw).unwrap();
        let mut q = api::ConfigureRequest::new();
        q.runtime_name = "containerd".into();
        q.request_timeout = 2000;
        let res: api::ConfigureResponse = client
            .call(PLUGIN_SERVICE, "Configure", &q, Duration::from_secs(5))
            .unwrap();
        assert_eq!(res.events, event_mask(&EVENTS));
        let mut q = api::SynchronizeRequest::new();
        q.more = true;
        let res: api::SynchronizeResponse = client
            .call(PLUGIN_SERVICE, "Synchronize", &q, Duration::from_secs(5))
            .unwrap();
        assert!(res.more, "a split sync is answered as asked");
        rt.close();
        session.join().unwrap().unwrap();
    }

    #[test]
    fn no_inherited_socket_without_the_variable() {
        if std::env::var_os(SOCKET_ENV).is_none() {
            assert!(inherited_socket().unwrap().is_none());
        }
    }
}
