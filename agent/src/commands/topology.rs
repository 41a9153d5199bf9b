//! `throttlewatch topology`: what the node looks like, and which cpuset a
//! container with the given annotations or environment would get, and why.

use std::collections::BTreeMap;
use std::path::PathBuf;

use throttlewatch_core::config::Config;
use throttlewatch_core::units::parse_duration;
use throttlewatch_qos::{
    parse_request, plan, render_plan, render_text, ExclusiveAllocator, PlanInput, Policy, Topology,
};

use crate::cli::TopologyArgs;
use crate::CliError;

fn pairs(field: &str, v: &[String]) -> Result<BTreeMap<String, String>, CliError> {
    v.iter()
        .map(|kv| {
            kv.split_once('=')
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .ok_or_else(|| {
                    CliError::usage(format!("{field}: invalid value {kv:?}: expected KEY=VALUE"))
                })
        })
        .collect()
}

pub fn topology(cfg: &Config, a: &TopologyArgs) -> Result<i32, CliError> {
    let sys = a
        .sysfs_root
        .clone()
        .unwrap_or_else(|| PathBuf::from("/sys"));
    let proc_ = a
        .procfs_root
        .clone()
        .unwrap_or_else(|| PathBuf::from("/proc"));
    let topo = Topology::discover(&sys, &proc_).map_err(|e| CliError::fail(e.to_string()))?;
    let annotations = pairs("--annotation", &a.annotation)?;
    pairs("--env", &a.env)?;
    let wants_plan = !annotations.is_empty() || !a.env.is_empty();
    let mut out = serde_json::json!({ "topology": topo });
    let mut text = render_text(&topo);
    if wants_plan {
        let policy = Policy::from(&cfg.qos);
        let (req, mut refused) = parse_request(&annotations, &a.env, &policy);
        let period_us = match &a.period {
            Some(p) => parse_duration("--period", p)
                .map_err(|e| CliError::usage(e.to_string()))?
                .as_micros() as u64,
            None => 100_000,
        };
        let quota_us = match &a.quota {
            Some(q) => Some(
                parse_duration("--quota", q)
                    .map_err(|e| CliError::usage(e.to_string()))?
                    .as_micros() as u64,
            ),
            None => None,
        };
        // A what-if: exclusive cores are planned as if no other container held any.
        let scratch =
            std::env::temp_dir().join(format!("throttlewatch-topology-{}", std::process::id()));
        let alloc = ExclusiveAllocator::open(&scratch).ok();
        let mut p = plan(&PlanInput {
            req: &req,
            topo: &topo,
            alloc: alloc.as_ref(),
            container_id: "what-if",
            parent_cpus: &topo.online,
            quota_us,
            period_us,
            env: &a.env,
        });
        let _ = std::fs::remove_dir_all(&scratch);
        refused.append(&mut p.refused);
        p.refused = refused;
        text.push('\n');
        text.push_str(&render_plan(&p));
        out["plan"] = serde_json::to_value(&p).unwrap_or_default();
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&out).unwrap_or_default());
    } else {
        print!("{text}");
    }
    Ok(0)
}
