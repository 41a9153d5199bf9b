use super::*;

fn flags() -> Flags {
    Flags {
        id: "c1".into(),
        namespace: "k8s.io".into(),
        address: "/run/containerd/containerd.sock".into(),
        ..Default::default()
    }
}

#[test]
fn bootstrap_params_are_read_and_checked() {
    let p = BootstrapParams {
        instance_id: "c1".into(),
        namespace: "k8s.io".into(),
        containerd_ttrpc_address: "/x/containerd.sock.ttrpc".into(),
        containerd_version: "v2.3.4".into(),
        socket_dir: Some("/x/s".into()),
        ..Default::default()
    };
    let (o, b) = start_opts(&flags(), &p.write_to_bytes().unwrap()).unwrap();
    assert!(b);
    assert_eq!(o.ttrpc_address, "/x/containerd.sock.ttrpc");
    assert_eq!(
        o.address, "/run/containerd/containerd.sock",
        "from the flag"
    );
    assert!(
        o.socket_address("c1").contains("/x/s/"),
        "{}",
        o.socket_address("c1")
    );
    let other = BootstrapParams {
        instance_id: "c2".into(),
        ..p.clone()
    };
    let e = start_opts(&flags(), &other.write_to_bytes().unwrap()).unwrap_err();
    assert_eq!(
        e.to_string(),
        "bootstrap params for k8s.io/c2 do not match command line arguments k8s.io/c1"
    );
    let none = BootstrapParams {
        containerd_ttrpc_address: String::new(),
        ..p.clone()
    };
    if std::env::var_os("TTRPC_ADDRESS").is_none() {
        let e = start_opts(&flags(), &none.write_to_bytes().unwrap()).unwrap_err();
        assert!(matches!(e, BootstrapError::NoTtrpcAddress), "{e:?}");
    }
}

#[test]
fn runtime_options_on_stdin_are_the_older_protocol() {
    let mut any = containerd_shim::protos::protobuf::well_known_types::any::Any::new();
    any.type_url = "containerd.runc.v1.Options".into();
    any.value = b"x".to_vec();
    for stdin in [Vec::new(), any.write_to_bytes().unwrap()] {
        let (o, b) = start_opts(&flags(), &stdin).unwrap();
        assert!(!b);
        assert_eq!(o.id, "c1");
    }
}
