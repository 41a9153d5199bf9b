//! Command-line structs only (clap). Values that need careful errors are
//! taken as strings and parsed by the commands, so every error names the
//! option, the value and what is accepted.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(name = "throttlewatch", version, about = "See CFS CPU throttling per thread and per container, at microsecond resolution")]
pub struct Cli {
    /// Configuration file (default: $THROTTLEWATCH_CONFIG, then /etc/throttlewatch/throttlewatch.toml).
    #[arg(long, global = true)]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a command in a transient cgroup with CPU limits and watch it.
    Run(RunArgs),
    /// Watch an existing cgroup (a running container or pod) until interrupted.
    Watch(WatchArgs),
    /// The node agent: watches registered containers, one log each, metrics.
    Agent(AgentArgs),
}

#[derive(Debug, Clone, Args)]
pub struct AgentArgs {
    /// Start in the background (one per node) and return once it answers.
    #[arg(long)]
    pub detach: bool,
}

#[derive(Debug, Clone, Args)]
pub struct OutputArgs {
    /// Write the JSONL log here (default: the configured log directory).
    #[arg(long)]
    pub log: Option<PathBuf>,
    /// Only freezes at least this long become `throttle` records (e.g. 1ms; default: all).
    #[arg(long)]
    pub threshold: Option<String>,
    /// Live events and the summary as JSON lines on stderr.
    #[arg(long)]
    pub json: bool,
    /// No live events, only the summary.
    #[arg(long, short)]
    pub quiet: bool,
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// CPUs worth of quota, e.g. 0.5 (quota = cpus x period).
    #[arg(long, conflicts_with = "quota")]
    pub cpus: Option<String>,
    /// CFS quota per period, e.g. 50ms.
    #[arg(long)]
    pub quota: Option<String>,
    /// CFS period (default 100ms; the kernel accepts 1ms..1s).
    #[arg(long)]
    pub period: Option<String>,
    /// CFS burst: unused quota that may be spent later, up to the quota, e.g. 20ms.
    #[arg(long)]
    pub burst: Option<String>,
    /// CPUs the command may run on, e.g. 0-3,8.
    #[arg(long)]
    pub cpuset: Option<String>,
    /// Create the transient cgroup below this existing cgroup (relative to the cpu hierarchy).
    #[arg(long)]
    pub cgroup_parent: Option<String>,
    #[command(flatten)]
    pub out: OutputArgs,
    /// The command and its arguments.
    #[arg(last = true, required = true, num_args = 1..)]
    pub cmd: Vec<String>,
}

#[derive(Debug, Clone, Args)]
pub struct WatchArgs {
    /// The cgroup to watch: a path in the cpu hierarchy (/docker/ID) or its full path under the mount.
    #[arg(long, conflicts_with = "pid", required_unless_present = "pid")]
    pub cgroup: Option<String>,
    /// Watch the cpu cgroup of this process.
    #[arg(long)]
    pub pid: Option<String>,
    /// Stop after this long (default: until interrupted or the cgroup goes away).
    #[arg(long)]
    pub duration: Option<String>,
    #[command(flatten)]
    pub out: OutputArgs,
}
