//! A recommendation as something to apply: a `kubectl patch` of the
//! workload's pod template, and the same as a kustomize strategic-merge
//! patch. A limit goes into the container's `resources.limits`; a
//! throttlewatch annotation into the pod template's annotations (the hook,
//! the shim and the NRI plugin read pod annotations).

use serde_json::json;

use crate::owner::Owner;

/// The workload's API group/version and kind as kubectl names it, and the
/// path to its pod template; None for a kind a name pattern cannot pin down.
fn target(o: &Owner) -> Option<(&'static str, &'static str, bool)> {
    Some(match o.kind.as_str() {
        "Deployment" => ("apps/v1", "deployment", false),
        "StatefulSet" => ("apps/v1", "statefulset", false),
        "DaemonSet" => ("apps/v1", "daemonset", false),
        "ReplicaSet" => ("apps/v1", "replicaset", false),
        "CronJob" => ("batch/v1", "cronjob", true),
        _ => return None,
    })
}

/// The pod template's part of the patch.
fn template(container: &str, key: &str, value: &str) -> serde_json::Value {
    if key == "resources.limits.cpu" {
        json!({"spec": {"containers": [{"name": container, "resources": {"limits": {"cpu": value}}}]}})
    } else {
        json!({"metadata": {"annotations": {key: value}}})
    }
}

fn body(o: &Owner, container: &str, key: &str, value: &str, cron: bool) -> serde_json::Value {
    let t = template(container, key, value);
    if cron {
        json!({"spec": {"jobTemplate": {"spec": {"template": t}}}})
    } else {
        let _ = o;
        json!({"spec": {"template": t}})
    }
}

/// `kubectl -n NS patch KIND NAME --type=strategic -p '…'`.
pub fn kubectl(ns: &str, o: &Owner, container: &str, key: &str, value: &str) -> String {
    let Some((_, kind, cron)) = target(o) else {
        return format!(
            "# {} {:?}: the owner's kind is not known from the pod name (a DaemonSet or a Job?); set {key}={value} in its pod template",
            o.kind, o.name
        );
    };
    let b = body(o, container, key, value, cron)
        .to_string()
        .replace('\'', "'\\''");
    format!(
        "kubectl -n {ns} patch {kind} {} --type=strategic -p '{b}'",
        o.name
    )
}

/// A kustomize patch file (`patches: [{path: …}]`) with the same change.
pub fn kustomize(ns: &str, o: &Owner, container: &str, key: &str, value: &str) -> String {
    let Some((api, _, cron)) = target(o) else {
        return String::new();
    };
    let indent = if cron { "    " } else { "" };
    let head = format!(
        "apiVersion: {api}\nkind: {}\nmetadata:\n  name: {}\n  namespace: {ns}\nspec:\n",
        o.kind, o.name
    );
    let mut t = if cron {
        "  jobTemplate:\n    spec:\n      template:\n".to_string()
    } else {
        "  template:\n".to_string()
    };
    let q = |s: &str| serde_json::to_string(s).unwrap_or_default();
    if key == "resources.limits.cpu" {
        t += &format!(
            "{indent}    spec:\n{indent}      containers:\n{indent}        - name: {}\n{indent}          resources:\n{indent}            limits:\n{indent}              cpu: {}\n",
            q(container),
            q(value)
        );
    } else {
        t += &format!(
            "{indent}    metadata:\n{indent}      annotations:\n{indent}        {}: {}\n",
            q(key),
            q(value)
        );
    }
    head + &t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(kind: &str) -> Owner {
        Owner {
            kind: kind.into(),
            name: "web".into(),
        }
    }

    #[test]
    fn patches_for_each_kind() {
        let k = kubectl(
            "shop",
            &owner("Deployment"),
            "app",
            "resources.limits.cpu",
            "0.7",
        );
        assert_eq!(
            k,
            r#"kubectl -n shop patch deployment web --type=strategic -p '{"spec":{"template":{"spec":{"containers":[{"name":"app","resources":{"limits":{"cpu":"0.7"}}}]}}}}'"#
        );
        let a = kubectl(
            "shop",
            &owner("CronJob"),
            "app",
            "throttlewatch.io/cpu-burst",
            "20ms",
        );
        assert!(a.contains(r#"{"spec":{"jobTemplate":{"spec":{"template":{"metadata":{"annotations":{"throttlewatch.io/cpu-burst":"20ms"}}}}}}}"#), "{a}");
        assert!(kubectl(
            "shop",
            &owner("DaemonSet/Job"),
            "app",
            "resources.limits.cpu",
            "1"
        )
        .starts_with('#'));
        let y = kustomize(
            "shop",
            &owner("Deployment"),
            "app",
            "resources.limits.cpu",
            "0.7",
        );
        assert!(
            y.contains("kind: Deployment\n") && y.contains("cpu: \"0.7\"\n"),
            "{y}"
        );
        let y = kustomize(
            "shop",
            &owner("CronJob"),
            "app",
            "throttlewatch.io/cpu-burst",
            "20ms",
        );
        assert!(
            y.contains(
                "          annotations:\n            \"throttlewatch.io/cpu-burst\": \"20ms\"\n"
            ),
            "{y}"
        );
    }
}
