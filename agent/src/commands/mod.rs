//! The `throttlewatch` commands other than the daemon: `run`, `watch` (and
//! its live view), `demo` and its workload `burn`, `topology`, `config
//! check`, and the privilege check they share.

pub mod burn;
pub mod configcheck;
pub mod demo;
pub mod live;
pub mod privileges;
pub mod run;
pub mod topology;
pub mod watch;
