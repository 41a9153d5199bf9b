//! Requests in flight, so the daemon leaves only once they are answered.
//!
//! The last container's Delete and the Shutdown after it can overtake the
//! reply to another request: CRI's StopPodSandbox sends Kill for the pause
//! container, the pause dies, and containerd's exit handler deletes the task
//! and shuts the shim down while `runc kill` is still returning. Exiting at
//! once dropped the Kill's reply and containerd failed StopPodSandbox with
//! "ttrpc: closed" (seen in `integration/tests/cri.rs` on a loaded machine).
//! Go's ttrpc server shuts down gracefully for the same reason.

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
    inner: Box<dyn MethodHandler + Send + Sync>,
    n: InFlight,
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
        let _g = self.n.enter();
        self.inner.handler(ctx, req)
    }
}

impl InFlight {
    /// Every method counted.
    pub fn wrap(&self, methods: Methods) -> Methods {
        methods
            .into_iter()
            .map(|(name, inner)| {
                let m: Box<dyn MethodHandler + Send + Sync> = Box::new(Counted {
                    inner,
                    n: self.clone(),
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
