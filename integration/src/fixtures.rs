//! Small fixtures that several test files share: a cgroup with a sleeping
//! process in it (enough for the agent to watch), the removal of a container
//! runc left behind, and a plain HTTP GET on loopback.

use std::io::{Read, Write};
use std::process::Command;

use throttlewatch_cgroup::{Hierarchies, TransientCgroup};

use crate::bundle::OciCli;
use crate::unique;

/// Kill the container runc left behind (it is not in OciCli's own list).
pub fn force_delete(rt: &OciCli, id: &str) {
    let _ = Command::new("runc")
        .arg("--root")
        .arg(&rt.root.0)
        .args(["delete", "-f", id])
        .output();
}

/// A cgroup with a sleeping process in it: enough for the agent to watch.
pub struct Sleeper {
    pub cg: TransientCgroup,
    pub child: std::process::Child,
}

impl Sleeper {
    pub fn new(h: &Hierarchies, tag: &str) -> Sleeper {
        let cg = TransientCgroup::create(
            h,
            &format!("/tw-test-hard-{tag}-{}-{}", std::process::id(), unique()),
        )
        .unwrap();
        let child = Command::new("sleep").arg("600").spawn().unwrap();
        cg.group.add_pid(child.id()).unwrap();
        Sleeper { cg, child }
    }
}

impl Drop for Sleeper {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `GET path` on 127.0.0.1:`port` (HTTP/1.1, read to the end): the status
/// line, headers and body as the server sent them.
pub fn http_get(port: u16, path: &str) -> String {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}
