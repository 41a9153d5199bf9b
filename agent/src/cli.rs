//! Command-line structs only (clap). Values that need careful errors are
//! taken as strings and parsed by the commands, so every error names the
//! option, the value and what is accepted.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "throttlewatch",
    version,
    about = "See CFS CPU throttling per thread and per container, at microsecond resolution"
)]
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
    /// The quickstart's demo: busy threads under a limit chosen well below the CPU
    /// this machine gives them now, watched as `run` does; exit 3 if not throttled.
    Demo(DemoArgs),
    /// A CPU-bound workload of N busy threads (`burn-0`..), e.g. to try limits and
    /// annotations in a container; prints {"pid":P,"tids":[..]} once they run.
    Burn(BurnArgs),
    /// The node agent: watches registered containers, one log each, metrics.
    Agent(AgentArgs),
    /// NUMA/SMT/GPU topology, and the cpuset a container's annotations would get.
    Topology(TopologyArgs),
    /// Add the runtime `throttlewatch` to containerd's or docker's configuration (backups
    /// kept), or our OCI hook files to podman's or CRI-O's hooks.d.
    Install(InstallArgs),
    /// Take them out again (files restored byte for byte when unchanged).
    Uninstall(UninstallArgs),
    /// Summary, heatmaps (--svg, --html) and recommendations from container logs.
    Report(throttlewatch_report::ReportArgs),
    /// Across a fleet, from Prometheus: which workloads are throttled, why, and what
    /// each Deployment (StatefulSet, DaemonSet, CronJob) should get (docs/fleet.md).
    Fleet(throttlewatch_fleet::FleetArgs),
    /// The configuration file: `config check [FILE]` validates it and says what it would do.
    #[command(subcommand)]
    Config(ConfigCommand),
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Validate FILE (default: --config, $THROTTLEWATCH_CONFIG, the default path) as the
    /// hook, the runtime wrapper and the shim load it; exit 1 with the reason when invalid.
    Check { file: Option<PathBuf> },
}

#[derive(Debug, Clone, Args)]
pub struct InstallArgs {
    /// containerd, docker, podman or crio
    pub engine: String,
    /// Show the diff, write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Root the configuration lives under: /etc/containerd/config.toml is
    /// read as ETC_ROOT/etc/containerd/config.toml (default /).
    #[arg(long, default_value = "/")]
    pub etc_root: PathBuf,
    /// Where the throttlewatch binaries are installed (docker's runtime path,
    /// the hook files' hook.path; containerd finds containerd-shim-throttlewatch-v2
    /// in its PATH).
    #[arg(long, default_value = "/usr/local/bin")]
    pub bin_dir: PathBuf,
    /// Make the engine load the change: none (default; print what to do),
    /// signal (dockerd: SIGHUP) or systemd (systemctl restart containerd|crio,
    /// reload docker; chrooted into --etc-root when it is not /).
    #[arg(long, default_value = "none")]
    pub restart: String,
    #[command(flatten)]
    pub hooks: HookPathArgs,
}

/// podman and crio: where the hook files go.
#[derive(Debug, Clone, Args)]
pub struct HookPathArgs {
    /// The hooks directory to use (podman: its --hooks-dir; crio: one of its
    /// hooks_dir); default: podman's /etc/containers/oci/hooks.d, CRI-O's
    /// configured hooks_dir (the first that exists).
    #[arg(long, value_name = "DIR")]
    pub hooks_dir: Option<PathBuf>,
    /// crio: the configuration file CRI-O runs with, as `crio --config` names
    /// it (default /etc/crio/crio.conf).
    #[arg(long, value_name = "FILE")]
    pub crio_config: Option<PathBuf>,
    /// crio: its drop-in directory, as `crio --config-dir` names it (default
    /// /etc/crio/crio.conf.d); its *.conf files are read in lexical order.
    #[arg(long, value_name = "DIR")]
    pub crio_config_dir: Option<PathBuf>,
}

#[derive(Debug, Clone, Args)]
pub struct UninstallArgs {
    /// containerd, docker, podman or crio
    pub engine: String,
    /// Show the diff, write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Root the configuration lives under (default /).
    #[arg(long, default_value = "/")]
    pub etc_root: PathBuf,
    /// Make the engine load the change: none, signal or systemd (as for install).
    #[arg(long, default_value = "none")]
    pub restart: String,
    #[command(flatten)]
    pub hooks: HookPathArgs,
}

#[derive(Debug, Clone, Args)]
pub struct TopologyArgs {
    /// sysfs root to read (fixture trees in tests).
    #[arg(long)]
    pub sysfs_root: Option<PathBuf>,
    /// procfs root to read (/proc/driver/nvidia).
    #[arg(long)]
    pub procfs_root: Option<PathBuf>,
    /// An annotation the container would carry, e.g. throttlewatch.io/cpuset=gpu-local (repeatable).
    #[arg(long, value_name = "KEY=VALUE")]
    pub annotation: Vec<String>,
    /// An environment variable of the container, e.g. NVIDIA_VISIBLE_DEVICES=0,1 (repeatable).
    #[arg(long, value_name = "KEY=VALUE")]
    pub env: Vec<String>,
    /// The container's CFS quota (e.g. 400ms) for burst and exclusive-core sizing.
    #[arg(long)]
    #[arg(allow_hyphen_values = true)]
    pub quota: Option<String>,
    /// The container's CFS period (default 100ms).
    #[arg(long)]
    #[arg(allow_hyphen_values = true)]
    pub period: Option<String>,
    #[arg(long)]
    pub json: bool,
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
    #[arg(allow_hyphen_values = true)]
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
    #[arg(allow_hyphen_values = true)]
    pub cpus: Option<String>,
    /// CFS quota per period, e.g. 50ms.
    #[arg(long)]
    #[arg(allow_hyphen_values = true)]
    pub quota: Option<String>,
    /// CFS period (default 100ms; the kernel accepts 1ms..1s).
    #[arg(long)]
    #[arg(allow_hyphen_values = true)]
    pub period: Option<String>,
    /// CFS burst: unused quota that may be spent later, up to the quota, e.g. 20ms.
    #[arg(long)]
    #[arg(allow_hyphen_values = true)]
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
    #[arg(allow_hyphen_values = true)]
    pub pid: Option<String>,
    /// Stop after this long (default: until interrupted or the cgroup goes away).
    #[arg(long)]
    #[arg(allow_hyphen_values = true)]
    pub duration: Option<String>,
    #[command(flatten)]
    pub out: OutputArgs,
}

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Busy threads to run (default 4).
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// How long they run, e.g. 3s (default 3s).
    #[arg(long, default_value = "3s")]
    #[arg(allow_hyphen_values = true)]
    pub duration: String,
    /// The limit as a share of the CPU the threads got, unlimited, just before (default 0.4).
    #[arg(long, default_value = "0.4")]
    #[arg(allow_hyphen_values = true)]
    pub share: String,
    #[command(flatten)]
    pub out: OutputArgs,
}

#[derive(Debug, Clone, Args)]
pub struct BurnArgs {
    /// Busy threads.
    #[arg(long, default_value_t = 2)]
    pub threads: usize,
    /// How long, in milliseconds.
    #[arg(long, default_value_t = 2000)]
    pub ms: u64,
    /// Thread placement: spread (thread i on CPU i), packed (all on CPU 0) or none.
    #[arg(long, default_value = "none")]
    pub pin: String,
    /// Spin this many ms of wall time, then sleep --sleep ms, in a loop.
    #[arg(long, default_value_t = 0)]
    pub spin: u64,
    /// Spin until the thread had this many ms of CPU, then sleep --sleep ms, in a loop.
    #[arg(long, default_value_t = 0)]
    pub spin_cpu: u64,
    /// Sleep between spins (ms), with --spin or --spin-cpu.
    #[arg(long, default_value_t = 0)]
    pub sleep: u64,
}
