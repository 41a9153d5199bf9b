//! Cpuset QoS into `linux.resources.cpu.cpus/mems`, which runc and crun
//! honour, so the container is created on its CPUs from the start.
//!
//! Only deterministic, shared choices are translated here (an explicit CPU
//! list, `numa:N`). Exclusive cores, `auto` and `gpu-local` depend on what
//! other containers hold at start time and need the container's pid: the
//! hook plans and writes them. Refusals are left to the hook, which reports
//! them with the container's other QoS.

use std::path::Path;

use serde_json::{json, Value};
use throttlewatch_core::CpuList;
use throttlewatch_qos::{plan, CpusetTarget, PlanInput, Topology};

use super::context::ModifyContext;
use super::json::{object_path, FieldError};
use crate::bundle_spec::BundleSpec;
use crate::qos::DEFAULT_PERIOD_US;

pub fn cpuset_resources(
    spec: &mut Value,
    ctx: &ModifyContext,
) -> Result<Option<String>, FieldError> {
    // An unreadable shape (e.g. a number for `annotations`) is the runtime's
    // to report; QoS then does nothing here.
    let Ok(bundle) = BundleSpec::from_value(spec) else {
        return Ok(None);
    };
    let (req, _) = crate::qos::request(&ctx.cfg, &bundle);
    if req.exclusive
        || !matches!(
            req.cpuset,
            Some(CpusetTarget::List(_)) | Some(CpusetTarget::Numa(_))
        )
    {
        return Ok(None);
    }
    let Ok(topo) = Topology::discover(Path::new("/sys"), Path::new("/proc")) else {
        return Ok(None);
    };
    let (quota, period) = bundle.cpu_quota();
    let p = plan(&PlanInput {
        req: &req,
        topo: &topo,
        alloc: None,
        container_id: "",
        parent_cpus: &CpuList::default(),
        quota_us: quota,
        period_us: period.unwrap_or(DEFAULT_PERIOD_US),
        env: bundle.env(),
    });
    if !p.refused.is_empty() {
        return Ok(None);
    }
    // Never widen or replace the orchestrator's cpuset (kubelet's CPU
    // manager, `docker --cpuset-cpus`): only a subset of it is written; the
    // hook refuses the rest with the reason.
    match (bundle.orchestrator_cpus(), &p.cpus) {
        (Ok(None), _) => {}
        (Ok(Some(set)), Some(want)) if want.is_subset(&set) => {}
        _ => return Ok(None),
    }
    let cpu = object_path(spec, &["linux", "resources", "cpu"])?;
    let mut changed = vec![];
    for (key, val) in [("cpus", p.cpus.as_ref()), ("mems", p.mems.as_ref())] {
        let Some(val) = val.map(|v| v.to_string()) else {
            continue;
        };
        if cpu.get(key).and_then(Value::as_str) != Some(val.as_str()) {
            cpu.insert(key.to_string(), json!(val));
            changed.push(format!("linux.resources.cpu.{key} = {val}"));
        }
    }
    Ok((!changed.is_empty()).then(|| changed.join(", ")))
}
