//! The `throttlewatch` commands other than the daemon: `run`, `watch` (and
//! its live view), `demo` and its workload `burn`, `topology`, `config
//! check`, and the privilege check they share.

pub(crate) mod burn;
pub(crate) mod configcheck;
pub(crate) mod demo;
pub(crate) mod live;
pub(crate) mod privileges;
pub(crate) mod run;
pub(crate) mod topology;
pub(crate) mod watch;
