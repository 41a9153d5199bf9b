use super::*;

#[test]
fn grouping_follows_the_sandbox_annotation() {
    let spec = r#"{"annotations":{"io.kubernetes.cri.sandbox-id":"sb1","io.kubernetes.cri.container-type":"container"}}"#;
    assert_eq!(group_of(spec).as_deref(), Some("sb1"));
    let spec = r#"{"annotations":{"io.containerd.runc.v2.group":"g","io.kubernetes.cri.sandbox-id":"sb1"}}"#;
    assert_eq!(group_of(spec).as_deref(), Some("g"));
    assert_eq!(group_of(r#"{"annotations":{}}"#), None);
    assert_eq!(group_of(""), None);
}
