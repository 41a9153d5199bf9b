//! Requests in flight, so the daemon leaves only once they are answered.
//!
//! The last container's Delete and the Shutdown after it can overtake the
//! reply to another request: CRI's StopPodSandbox sends Kill for the pause
//! container, the pause dies, and containerd's exit handler deletes the task
//! and shuts the shim down while `runc kill` is still returning. Exiting at
//! once dropped the Kill's reply and containerd failed StopPodSandbox with
//! "ttrpc: closed" (seen in `integration/tests/cri.rs` on a loaded machine).
//! Go's ttrpc server shuts down gracefully for the same reason.
//!
//! `Wait` (answered only when the process exits: minutes, days) runs on a
//! thread of its own, not on the connection's ttrpc worker. The worker pool
//! (one idle worker: service.rs) starts a worker when the idle one takes a
//! request, but a worker that finishes while another is just taking one can
//! leave none idle and none coming (ttrpc 0.10's sync server: the leaving
//! worker's decrement is not checked against the minimum). With every other
//! worker blocked in a `Wait` for a running container, the request queued
//! then waited until some container exited: on containerd 1.6, where the
//! CRI keeps a `Wait` open per task, critest's multi-container and
//! ExecSync specs hung for minutes (one in two loaded runs). A short request
//! always returns, so with `Wait` off the pool nothing waits for long.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use containerd_shim::protos::ttrpc::{self, MethodHandler, TtrpcContext};

pub type Methods = HashMap<String, Box<dyn MethodHandler + Send + Sync>>;

/// After the handlers return, their replies still pass through the
/// connection's writer thread.
const REPLY_FLUSH: Duration = Duration::from_millis(20);

/// How many requests are being handled.
#[derive(Clone, Default)]
pub struct InFlight(Arc<AtomicUsize>);

struct Counted {
    inner: Arc<dyn MethodHandler + Send + Sync>,
    n: InFlight,
    /// Answered on a thread of its own (`Wait`).
    own_thread: bool,
}

/// One request being handled: counted until dropped (a panicking handler
/// included).
pub struct Guard(InFlight);

impl Drop for Guard {
    fn drop(&mut self) {
        self.0 .0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl MethodHandler for Counted {
    fn handler(&self, ctx: TtrpcContext, req: ttrpc::Request) -> ttrpc::Result<()> {
        let g = self.n.enter();
        if !self.own_thread {
            return self.inner.handler(ctx, req);
        }
        let inner = self.inner.clone();
        let spawned = std::thread::Builder::new()
            .name("wait".into())
            .spawn(move || {
                let _g = g;
                // An error here is the reply not sent: the connection is gone.
                if let Err(e) = inner.handler(ctx, req) {
                    log::debug!("Wait: {e:?}");
                }
            });
        spawned
            .map(drop)
            .map_err(|e| ttrpc::Error::Others(e.to_string()))
    }
}

impl InFlight {
    /// Every method counted.
    pub fn wrap(&self, methods: Methods) -> Methods {
        methods
            .into_iter()
            .map(|(name, inner)| {
                let m: Box<dyn MethodHandler + Send + Sync> = Box::new(Counted {
                    inner: Arc::from(inner),
                    n: self.clone(),
                    own_thread: name.ends_with("/Wait"),
                });
                (name, m)
            })
            .collect()
    }

    pub fn enter(&self) -> Guard {
        self.0.fetch_add(1, Ordering::SeqCst);
        Guard(self.clone())
    }

    pub fn count(&self) -> usize {
        self.0.load(Ordering::SeqCst)
    }

    /// Wait until no request is being handled (the Shutdown that signalled
    /// the exit included), at most `limit`, then let the replies be written.
    pub fn drain(&self, limit: Duration) {
        let t0 = Instant::now();
        while self.count() > 0 && t0.elapsed() < limit {
            std::thread::sleep(Duration::from_millis(2));
        }
        std::thread::sleep(REPLY_FLUSH);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drain_waits_for_requests_in_flight() {
        let n = InFlight::default();
        let g = n.enter();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            drop(g);
        });
        assert_eq!(n.count(), 1);
        let t0 = Instant::now();
        n.drain(Duration::from_secs(5));
        assert!(
            t0.elapsed() >= Duration::from_millis(250),
            "{:?}",
            t0.elapsed()
        );
        assert_eq!(n.count(), 0);
        t.join().unwrap();
    }

    #[test]
    fn drain_gives_up_at_its_limit() {
        let n = InFlight::default();
        let _stuck = n.enter();
        let t0 = Instant::now();
        n.drain(Duration::from_millis(100));
        assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
        assert_eq!(n.count(), 1);
    }
}
