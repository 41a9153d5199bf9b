//! Choosing a cpuset: where (list, node, GPU-local, auto), inside the
//! parent's cpuset, shared or exclusive, and how many CPUs.

use throttlewatch_core::CpuList;

use crate::exclusive::ExclusiveAllocator;
use crate::gpu::{container_gpus, VISIBLE_DEVICES_ENV};
use crate::keys::Key;
use crate::planning::{cpus_for_quota, Plan, PlanInput};
use crate::request::{CpusetTarget, QosRequest};
use crate::topology::Topology;

/// Why a target points at no CPUs of this machine.
#[derive(Debug, thiserror::Error)]
enum ChoiceError {
    #[error("CPUs {missing} do not exist or are offline; this machine has CPUs {online}")]
    CpusMissing { missing: CpuList, online: CpuList },
    #[error("NUMA node {node} does not exist; this machine has nodes {nodes}")]
    NoSuchNode { node: u32, nodes: CpuList },
    #[error("NUMA node {0} has no CPUs (a memory-only node)")]
    MemoryOnlyNode(u32),
    #[error(
        "gpu-local needs GPUs and the container has none (see {VISIBLE_DEVICES_ENV} or {gpus})",
        gpus = Key::Gpus.annotation()
    )]
    NoGpus,
}

/// The CPUs a target points at before the parent and exclusivity are applied.
struct Choice {
    cpus: CpuList,
    /// An explicit list or node: never spill outside it.
    strict: bool,
    /// Leave cpuset.mems alone (explicit CPU lists).
    keep_mems: bool,
}

pub(crate) fn plan_cpuset(input: &PlanInput, p: &mut Plan) {
    let PlanInput {
        req,
        topo,
        alloc,
        container_id: id,
        parent_cpus,
        quota_us,
        period_us,
        env,
    } = *input;
    let Some(target) = &req.cpuset else { return };
    let usable = if parent_cpus.is_empty() {
        topo.online.clone()
    } else {
        topo.online.intersect(parent_cpus)
    };
    let held = match alloc.map(|a| a.held_cpus_except(id)).transpose() {
        Ok(h) => h.unwrap_or_default(),
        Err(e) => {
            p.refused.push(req.refusal(
                Key::Cpuset,
                format!("cannot read the exclusive cpuset state: {e}"),
            ));
            return;
        }
    };
    let Some(choice) = choose(req, target, topo, &usable, &held, env, p) else {
        return;
    };
    let Some(inside) = inside_parent(req, &choice, &usable, p) else {
        return;
    };
    let Some(count) = cpu_count(req, topo, quota_us, period_us, p) else {
        return;
    };
    let cpus = if req.exclusive {
        let Some(a) = alloc else {
            let why =
                "exclusive cpusets need the allocator's state directory, which is not available";
            p.refused.push(req.refusal(exclusive_key(req), why));
            return;
        };
        match exclusive(req, topo, a, id, &inside, &usable, choice.strict, count, p) {
            Some(c) => c,
            None => return,
        }
    } else {
        shared(topo, &inside, &held, count, p)
    };
    if !choice.keep_mems {
        set_mems(topo, &cpus, p);
    }
    p.cpus = Some(cpus);
}

/// The chosen CPUs the parent cgroup allows; None (refused) when none.
fn inside_parent(
    req: &QosRequest,
    choice: &Choice,
    usable: &CpuList,
    p: &mut Plan,
) -> Option<CpuList> {
    let inside = choice.cpus.intersect(usable);
    if inside.is_empty() {
        let why = format!(
            "none of CPUs {} lie in the parent cgroup's cpuset {}",
            choice.cpus, usable
        );
        p.refused.push(req.refusal(Key::Cpuset, why));
        return None;
    }
    if inside != choice.cpus {
        p.notes.push(format!(
            "shrunk {} to {inside}: the parent cgroup allows only {usable}",
            choice.cpus
        ));
    }
    Some(inside)
}

/// How many CPUs: `cpuset-cpus`, else (exclusive) what the quota needs,
/// else all that were chosen. None: refused.
fn cpu_count(
    req: &QosRequest,
    topo: &Topology,
    quota_us: Option<u64>,
    period_us: u64,
    p: &mut Plan,
) -> Option<Option<usize>> {
    match req.cpuset_cpus {
        Some(n) if n as usize > topo.online.len() => {
            let why = format!(
                "{n} CPUs requested; this machine has {} online",
                topo.online.len()
            );
            p.refused.push(req.refusal(Key::CpusetCpus, why));
            None
        }
        Some(n) => Some(Some(n as usize)),
        None if req.exclusive => Some(cpus_for_quota(quota_us, period_us)),
        None => Some(None),
    }
}

/// cpuset.mems: the nodes with memory that hold the CPUs.
fn set_mems(topo: &Topology, cpus: &CpuList, p: &mut Plan) {
    let mems = topo.mems_for(cpus);
    if mems.is_empty() {
        p.notes.push(format!(
            "no NUMA node with memory holds CPUs {cpus}: cpuset.mems left as it is"
        ));
    } else {
        p.mems = Some(mems);
    }
}

fn choose(
    req: &QosRequest,
    target: &CpusetTarget,
    topo: &Topology,
    usable: &CpuList,
    held: &CpuList,
    env: &[String],
    p: &mut Plan,
) -> Option<Choice> {
    let chosen = match target {
        CpusetTarget::List(l) => choose_list(l, topo, p),
        CpusetTarget::Numa(n) => choose_node(*n, topo, p),
        CpusetTarget::GpuLocal | CpusetTarget::Auto => {
            choose_near_gpus(req, target, topo, usable, held, env, p)
        }
    };
    chosen
        .map_err(|why| p.refused.push(req.refusal(Key::Cpuset, why)))
        .ok()?
}

/// An explicit CPU list: all of it must exist.
fn choose_list(l: &CpuList, topo: &Topology, p: &mut Plan) -> Result<Option<Choice>, ChoiceError> {
    let missing = l.difference(&topo.online);
    if !missing.is_empty() {
        return Err(ChoiceError::CpusMissing {
            missing,
            online: topo.online.clone(),
        });
    }
    p.notes.push(format!("cpuset {l}: as requested"));
    Ok(Some(Choice {
        cpus: l.clone(),
        strict: true,
        keep_mems: true,
    }))
}

/// `numa:N`: the node's CPUs.
fn choose_node(n: u32, topo: &Topology, p: &mut Plan) -> Result<Option<Choice>, ChoiceError> {
    let Some(node) = topo.node(n) else {
        return Err(ChoiceError::NoSuchNode {
            node: n,
            nodes: topo.node_ids(),
        });
    };
    let cpus = topo.node_cpus(node.id);
    if cpus.is_empty() {
        return Err(ChoiceError::MemoryOnlyNode(n));
    }
    p.notes.push(format!("numa:{n}: CPUs {cpus}"));
    Ok(Some(Choice {
        cpus,
        strict: true,
        keep_mems: false,
    }))
}

/// `gpu-local` and `auto`: the CPUs near the container's GPUs; without
/// GPUs, `auto` takes the node with the most free CPUs.
fn choose_near_gpus(
    req: &QosRequest,
    target: &CpusetTarget,
    topo: &Topology,
    usable: &CpuList,
    held: &CpuList,
    env: &[String],
    p: &mut Plan,
) -> Result<Option<Choice>, ChoiceError> {
    let gpus = container_gpus(topo, req.gpus.as_ref(), env).unwrap_or_else(|r| {
        p.refused.push(r);
        Vec::new()
    });
    p.gpus = gpus.clone();
    if !gpus.is_empty() {
        return Ok(Some(gpu_local(topo, &gpus, p)));
    }
    if *target == CpusetTarget::GpuLocal {
        return Err(ChoiceError::NoGpus);
    }
    let Some(node) = best_node(topo, usable, held) else {
        return Ok(None);
    };
    p.notes.push(format!(
        "auto: no GPUs; NUMA node {node} has the most free CPUs"
    ));
    Ok(Some(Choice {
        cpus: topo.node_cpus(node),
        strict: false,
        keep_mems: false,
    }))
}

fn gpu_local(topo: &Topology, gpus: &[usize], p: &mut Plan) -> Choice {
    let nodes: Vec<Option<u32>> = gpus.iter().map(|i| topo.gpus[*i].numa_node).collect();
    let list = CpuList::from_iter(gpus.iter().map(|i| *i as u32));
    if nodes.iter().any(Option::is_none) {
        p.notes.push(format!(
            "gpu-local: the NUMA node of GPUs {list} is unknown (numa_node -1): all nodes"
        ));
        return Choice {
            cpus: topo.online.clone(),
            strict: false,
            keep_mems: false,
        };
    }
    let ids = CpuList::from_iter(nodes.into_iter().flatten());
    let cpus = ids
        .iter()
        .fold(CpuList::default(), |acc, n| acc.union(&topo.node_cpus(n)));
    let word = if ids.len() == 1 { "node" } else { "nodes" };
    p.notes
        .push(format!("gpu-local: GPUs {list} on NUMA {word} {ids}"));
    Choice {
        cpus,
        strict: false,
        keep_mems: false,
    }
}

/// The node with the most usable CPUs not held exclusively by others (ties: lowest id).
fn best_node(topo: &Topology, usable: &CpuList, held: &CpuList) -> Option<u32> {
    let score = |id: u32| topo.node_cpus(id).intersect(usable).difference(held).len();
    let best = topo
        .nodes
        .iter()
        .filter(|n| score(n.id) > 0)
        .max_by_key(|n| (score(n.id), std::cmp::Reverse(n.id)));
    best.or_else(|| {
        topo.nodes
            .iter()
            .find(|n| !topo.node_cpus(n.id).intersect(usable).is_empty())
    })
    .map(|n| n.id)
}

fn shared(
    topo: &Topology,
    inside: &CpuList,
    held: &CpuList,
    count: Option<usize>,
    p: &mut Plan,
) -> CpuList {
    let mut set = inside.clone();
    let free = set.difference(held);
    if free != set {
        if free.is_empty() {
            p.notes.push(format!(
                "all of {set} is held exclusively by other containers: sharing it anyway"
            ));
        } else {
            p.notes.push(format!(
                "left out {}: held exclusively by other containers",
                set.intersect(held)
            ));
            set = free;
        }
    }
    let Some(n) = count else { return set };
    if n >= set.len() {
        if n > set.len() {
            p.notes.push(format!(
                "{n} CPUs requested, the choice has {}: using all of {set}",
                set.len()
            ));
        }
        return set;
    }
    let mut got = CpuList::default();
    for core in topo.whole_cores_in(&set).iter().chain(topo.cores.iter()) {
        if got.len() >= n {
            break;
        }
        got = got.union(&core.intersect(&set));
    }
    p.notes
        .push(format!("{n} CPUs of {set}, whole cores first: {got}"));
    got
}

#[allow(clippy::too_many_arguments)]
fn exclusive(
    req: &QosRequest,
    topo: &Topology,
    alloc: &ExclusiveAllocator,
    id: &str,
    inside: &CpuList,
    usable: &CpuList,
    strict: bool,
    count: Option<usize>,
    p: &mut Plan,
) -> Option<CpuList> {
    let mut candidates = topo.whole_cores_in(inside);
    let partial = inside.difference(
        &candidates
            .iter()
            .fold(CpuList::default(), |a, c| a.union(c)),
    );
    if !partial.is_empty() {
        p.notes.push(format!(
            "exclusive: CPUs {partial} are not whole cores here and were left out"
        ));
    }
    let preferred = candidates.len();
    if !strict {
        candidates.extend(
            topo.whole_cores_in(usable)
                .into_iter()
                .filter(|c| c.intersect(inside).is_empty()),
        );
    }
    let what = match (req.cpuset_cpus, count) {
        (Some(n), _) => format!("{n} CPUs requested"),
        (None, Some(n)) => format!("{n} CPUs for the quota"),
        (None, None) => "no quota: all free cores of the choice".to_string(),
    };
    // Without a count: the whole choice, i.e. every core of it still free (count 0).
    let result = match count {
        None => alloc.allocate(id, &candidates[..preferred], 0, alloc.holder()),
        Some(n) => alloc.allocate(id, &candidates, n, alloc.holder()),
    };
    match result {
        Ok(cpus) => {
            let outside = cpus.difference(inside);
            if !outside.is_empty() {
                p.notes.push(format!(
                    "exclusive: not enough free cores in {inside}; also took {outside}"
                ));
            }
            p.notes
                .push(format!("exclusive: whole cores {cpus} ({what})"));
            p.exclusive = true;
            Some(cpus)
        }
        Err(e) => {
            let why = format!("cannot hold CPUs exclusively: {e}");
            p.refused.push(req.refusal(exclusive_key(req), why));
            None
        }
    }
}

/// The key that asked for exclusivity: `cpuset-exclusive`, or `cpuset` with its `,exclusive` suffix.
fn exclusive_key(req: &QosRequest) -> Key {
    if req.origins.contains_key(&Key::CpusetExclusive) {
        Key::CpusetExclusive
    } else {
        Key::Cpuset
    }
}
