//! The fuzz target `stated_requests` in the normal suite: its whole corpus replays through
//! `stated::testing::fuzz_requests` without a panic, and the seed inputs (real request
//! sequences of every call, peer and failure kind) come to the outcomes they should, so the
//! entry is known to reach the service's checks rather than stop at decoding.
//!
//! `FUZZ_WRITE_SEEDS=1 cargo test -p stated --test fuzz_corpus` (re)writes the seeds into
//! `fuzz/corpus/stated_requests/seed-*`.

use cosi::{ResourceDefinition, ResourceSpec};
use prost::Message;
use stated::testing::{fuzz_requests, FuzzOutcome};
use tonic::Code;

const GET: u8 = 0;
const LIST: u8 = 1;
const CREATE: u8 = 2;
const UPDATE: u8 = 3;
const DESTROY: u8 = 4;
const WATCH: u8 = 5;
const TEARDOWN: u8 = 6;
const TEARDOWN_AND_DESTROY: u8 = 7;
/// `talosrs.state.Batch` (bit 3 of the op).
const BATCH: u8 = 8;

const ADMIN: u8 = 0;
const NETWORKD: u8 = 1;
const OTHER: u8 = 2;
const STRANGER: u8 = 3;

/// A fuzz input under construction, with the outcome each request should have.
struct Input {
    bytes: Vec<u8>,
    expected: Vec<FuzzOutcome>,
}

impl Input {
    fn new(node: bool) -> Self {
        Self {
            bytes: vec![u8::from(node)],
            expected: Vec::new(),
        }
    }

    fn raw(mut self, call: u8, peer: u8, msg: &[u8], expected: FuzzOutcome) -> Self {
        self.bytes.push(call | (peer << 4));
        let len = u16::try_from(msg.len()).expect("a seed message fits a frame");
        self.bytes.extend_from_slice(&len.to_le_bytes());
        self.bytes.extend_from_slice(msg);
        self.expected.push(expected);
        self
    }

    fn req(self, call: u8, peer: u8, msg: &impl Message, expected: FuzzOutcome) -> Self {
        self.raw(call, peer, &msg.encode_to_vec(), expected)
    }
}

const OK: FuzzOutcome = FuzzOutcome::Ok;

fn refused(code: Code) -> FuzzOutcome {
    FuzzOutcome::Refused(code)
}

fn resource(
    ns: &str,
    ty: &str,
    id: &str,
    version: &str,
    labels: &[(&str, &str)],
) -> proto::Resource {
    proto::Resource {
        metadata: Some(proto::Metadata {
            namespace: ns.into(),
            r#type: ty.into(),
            id: id.into(),
            version: version.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        }),
        spec: Some(proto::Spec {
            proto_spec: vec![0xa1, 0x61, b'a', 0x01],
            yaml_spec: "a: 1\n".into(),
        }),
    }
}

fn create(r: proto::Resource, owner: &str) -> proto::CreateRequest {
    proto::CreateRequest {
        resource: Some(r),
        options: Some(proto::CreateOptions {
            owner: owner.into(),
        }),
    }
}

fn update(r: proto::Resource, owner: &str, phase: Option<&str>) -> proto::UpdateRequest {
    proto::UpdateRequest {
        new_resource: Some(r),
        options: Some(proto::UpdateOptions {
            owner: owner.into(),
            expected_phase: phase.map(str::to_string),
        }),
    }
}

fn get(ns: &str, ty: &str, id: &str) -> proto::GetRequest {
    proto::GetRequest {
        namespace: ns.into(),
        r#type: ty.into(),
        id: id.into(),
        options: None,
    }
}

fn term(key: &str, op: proto::label_term::Operation, value: &[&str]) -> proto::LabelTerm {
    proto::LabelTerm {
        key: key.into(),
        op: op as i32,
        value: value.iter().map(|s| s.to_string()).collect(),
        invert: false,
    }
}

fn list(ns: &str, ty: &str, terms: Vec<proto::LabelTerm>, regexp: &str) -> proto::ListRequest {
    proto::ListRequest {
        namespace: ns.into(),
        r#type: ty.into(),
        options: Some(proto::ListOptions {
            label_query: vec![proto::LabelQuery { terms }],
            id_query: Some(proto::IdQuery {
                regexp: regexp.into(),
            }),
        }),
    }
}

fn watch(ns: &str, ty: &str, id: Option<&str>, opts: proto::WatchOptions) -> proto::WatchRequest {
    proto::WatchRequest {
        namespace: ns.into(),
        r#type: ty.into(),
        id: id.map(str::to_string),
        options: Some(opts),
        api_version: 1,
    }
}

fn destroy(ns: &str, ty: &str, id: &str, owner: &str) -> proto::DestroyRequest {
    proto::DestroyRequest {
        namespace: ns.into(),
        r#type: ty.into(),
        id: id.into(),
        options: Some(proto::DestroyOptions {
            owner: owner.into(),
        }),
    }
}

fn teardown(ns: &str, ty: &str, id: &str, owner: &str) -> proto::TeardownRequest {
    proto::TeardownRequest {
        namespace: ns.into(),
        r#type: ty.into(),
        id: id.into(),
        options: Some(proto::TeardownOptions {
            owner: owner.into(),
        }),
    }
}

fn definition(def: &ResourceDefinition) -> proto::Resource {
    let mut r = resource(
        cosi::META_NAMESPACE,
        ResourceDefinition::TYPE,
        &def.id(),
        "",
        &[],
    );
    if let Some(s) = r.spec.as_mut() {
        s.proto_spec = cosi::resource::encode_spec(def).expect("a definition encodes");
        s.yaml_spec.clear();
    }
    r
}

/// The seed inputs: every call, as each kind of peer, accepted and refused.
fn seeds() -> Vec<(&'static str, Input)> {
    use proto::label_term::Operation;
    const TY: &str = "Foos.test.dev";
    let labels = [("tier", "web"), ("size", "2Ki")];
    let lifecycle = Input::new(false)
        .req(
            CREATE,
            ADMIN,
            &create(resource("runtime", TY, "a", "", &labels), "me"),
            OK,
        )
        .req(
            CREATE,
            ADMIN,
            &create(resource("runtime", TY, "b", "", &[]), "me"),
            OK,
        )
        .req(
            CREATE,
            ADMIN,
            &create(resource("runtime", TY, "a", "", &[]), "me"),
            refused(Code::AlreadyExists),
        )
        .req(
            WATCH,
            ADMIN,
            &watch(
                "runtime",
                TY,
                None,
                proto::WatchOptions {
                    bootstrap_contents: true,
                    aggregated: true,
                    label_query: vec![proto::LabelQuery {
                        terms: vec![term("tier", Operation::Equal, &["web"])],
                    }],
                    ..Default::default()
                },
            ),
            OK,
        )
        .req(GET, ADMIN, &get("runtime", TY, "a"), OK)
        .req(
            GET,
            ADMIN,
            &get("runtime", TY, "zz"),
            refused(Code::NotFound),
        )
        .req(
            LIST,
            ADMIN,
            &list(
                "runtime",
                TY,
                vec![term("size", Operation::LtNumeric, &["3000"])],
                "^a$",
            ),
            OK,
        )
        .req(
            UPDATE,
            ADMIN,
            &update(
                resource("runtime", TY, "a", "1", &[("tier", "db")]),
                "me",
                Some("running"),
            ),
            OK,
        )
        .req(
            UPDATE,
            ADMIN,
            &update(resource("runtime", TY, "a", "1", &[]), "me", None),
            refused(Code::FailedPrecondition),
        )
        .req(
            UPDATE,
            ADMIN,
            &update(resource("runtime", TY, "a", "2", &[]), "you", None),
            refused(Code::PermissionDenied),
        )
        .req(TEARDOWN, ADMIN, &teardown("runtime", TY, "a", "me"), OK)
        .req(DESTROY, ADMIN, &destroy("runtime", TY, "a", "me"), OK)
        .req(
            DESTROY,
            ADMIN,
            &destroy("runtime", TY, "a", "me"),
            refused(Code::NotFound),
        )
        .req(
            TEARDOWN_AND_DESTROY,
            ADMIN,
            &proto::TeardownAndDestroyRequest {
                namespace: "runtime".into(),
                r#type: TY.into(),
                id: "b".into(),
                options: Some(proto::TeardownAndDestroyOptions { owner: "me".into() }),
            },
            OK,
        );

    let mut fin = resource("runtime", TY, "f", "", &[]);
    if let Some(md) = fin.metadata.as_mut() {
        md.finalizers = vec!["someone".into()];
    }
    let finalizers = Input::new(false)
        .req(CREATE, ADMIN, &create(fin, ""), OK)
        .req(
            DESTROY,
            ADMIN,
            &destroy("runtime", TY, "f", ""),
            refused(Code::FailedPrecondition),
        )
        .req(
            TEARDOWN_AND_DESTROY,
            ADMIN,
            &proto::TeardownAndDestroyRequest {
                namespace: "runtime".into(),
                r#type: TY.into(),
                id: "f".into(),
                options: None,
            },
            FuzzOutcome::Pending,
        );

    let node = Input::new(true)
        .req(
            CREATE,
            NETWORKD,
            &create(
                resource("network", "Links.net.talos.dev", "eth0", "", &[]),
                "networkd",
            ),
            OK,
        )
        .req(
            CREATE,
            OTHER,
            &create(
                resource("network", "Links.net.talos.dev", "eth1", "", &[]),
                "",
            ),
            refused(Code::PermissionDenied),
        )
        .req(
            GET,
            STRANGER,
            &get("network", "Links.net.talos.dev", "eth0"),
            refused(Code::PermissionDenied),
        )
        .req(
            GET,
            OTHER,
            &get("runtime", "X.y.z", "a"),
            refused(Code::NotFound),
        )
        .req(
            CREATE,
            ADMIN,
            &create(resource("undeclared", TY, "a", "", &[]), ""),
            refused(Code::InvalidArgument),
        )
        .req(
            WATCH,
            NETWORKD,
            &watch(
                "network",
                "Links.net.talos.dev",
                Some("eth0"),
                proto::WatchOptions::default(),
            ),
            OK,
        )
        .req(
            WATCH,
            NETWORKD,
            &watch(
                "network",
                "Links.net.talos.dev",
                None,
                proto::WatchOptions {
                    tail_events: 4,
                    ..Default::default()
                },
            ),
            OK,
        )
        .req(
            WATCH,
            NETWORKD,
            &watch(
                "network",
                "Links.net.talos.dev",
                None,
                proto::WatchOptions {
                    start_from_bookmark: Some(vec![0; 16]),
                    ..Default::default()
                },
            ),
            refused(Code::FailedPrecondition),
        )
        .req(
            UPDATE,
            NETWORKD,
            &update(
                resource(
                    "network",
                    "Links.net.talos.dev",
                    "eth0",
                    "1",
                    &[("up", "1")],
                ),
                "networkd",
                None,
            ),
            OK,
        );

    let definitions = Input::new(true)
        .req(
            CREATE,
            NETWORKD,
            &create(
                definition(&ResourceDefinition::new("Bridges.net.talos.dev", "network")),
                "",
            ),
            OK,
        )
        .req(
            CREATE,
            NETWORKD,
            &create(
                definition(&ResourceDefinition::new("Bridges.other.dev", "network")),
                "",
            ),
            refused(Code::PermissionDenied),
        )
        .req(
            CREATE,
            ADMIN,
            &create(
                definition(&ResourceDefinition::new("Bridges.admin.dev", "runtime")),
                "admin",
            ),
            refused(Code::PermissionDenied),
        )
        .req(
            CREATE,
            ADMIN,
            &create(
                definition(&ResourceDefinition::new("NoGroup", "runtime")),
                "",
            ),
            refused(Code::InvalidArgument),
        )
        .req(
            CREATE,
            OTHER,
            &create(
                definition(&ResourceDefinition::new("Pods.net.talos.dev", "runtime")),
                "",
            ),
            refused(Code::PermissionDenied),
        )
        .req(
            LIST,
            NETWORKD,
            &list(
                cosi::META_NAMESPACE,
                ResourceDefinition::TYPE,
                vec![],
                "bridges",
            ),
            OK,
        );

    let long = "x".repeat(300);
    let invalid = Input::new(false)
        .req(
            CREATE,
            ADMIN,
            &create(resource("runtime", TY, "", "", &[]), ""),
            refused(Code::InvalidArgument),
        )
        .req(
            CREATE,
            ADMIN,
            &create(resource("run/time", TY, "a", "", &[]), ""),
            refused(Code::InvalidArgument),
        )
        .req(
            CREATE,
            ADMIN,
            &create(resource("runtime", TY, "a\n", "", &[]), ""),
            refused(Code::InvalidArgument),
        )
        .req(
            CREATE,
            ADMIN,
            &create(resource("runtime", TY, "a", "", &[("", "v")]), ""),
            refused(Code::InvalidArgument),
        )
        .req(
            CREATE,
            ADMIN,
            &create(resource("runtime", TY, "a", "", &[]), "own\0er"),
            refused(Code::InvalidArgument),
        )
        .req(
            CREATE,
            ADMIN,
            &create(resource("runtime", TY, "a", "seven", &[]), ""),
            refused(Code::InvalidArgument),
        )
        .req(
            GET,
            ADMIN,
            &get("runtime", &long, "a"),
            refused(Code::InvalidArgument),
        )
        .req(
            LIST,
            ADMIN,
            &list("runtime", TY, vec![], "("),
            refused(Code::InvalidArgument),
        )
        .req(
            LIST,
            ADMIN,
            &proto::ListRequest {
                namespace: "runtime".into(),
                r#type: TY.into(),
                options: Some(proto::ListOptions {
                    label_query: vec![proto::LabelQuery {
                        terms: vec![proto::LabelTerm {
                            key: "a".into(),
                            op: 99,
                            value: vec![],
                            invert: true,
                        }],
                    }],
                    id_query: None,
                }),
            },
            refused(Code::Unimplemented),
        )
        .req(
            WATCH,
            ADMIN,
            &watch("runtime", "", None, proto::WatchOptions::default()),
            refused(Code::InvalidArgument),
        )
        .req(
            WATCH,
            ADMIN,
            &watch(
                "runtime",
                TY,
                None,
                proto::WatchOptions {
                    start_from_bookmark: Some(vec![1, 2, 3]),
                    ..Default::default()
                },
            ),
            refused(Code::FailedPrecondition),
        )
        .raw(GET, ADMIN, &[0xff, 0xff, 0xff], FuzzOutcome::Undecodable);

    use proto::talosrs::state::{write::Op, Write, WriteRequest};
    let batch = |ops: Vec<Op>| WriteRequest {
        writes: ops.into_iter().map(|op| Write { op: Some(op) }).collect(),
    };
    let batches = Input::new(true)
        .req(
            BATCH,
            NETWORKD,
            &batch(vec![
                Op::Create(create(
                    resource("network", "Links.net.talos.dev", "eth0", "", &[]),
                    "networkd",
                )),
                // Not networkd's namespace: refused in its result, the call itself is fine.
                Op::Create(create(resource("runtime", TY, "x", "", &[]), "")),
                Op::Update(update(
                    resource("network", "Links.net.talos.dev", "eth0", "1", &[]),
                    "networkd",
                    None,
                )),
                Op::Destroy(destroy("network", "Links.net.talos.dev", "nope", "")),
            ]),
            OK,
        )
        .req(
            BATCH,
            STRANGER,
            &batch(vec![Op::Create(create(
                resource("network", "Links.net.talos.dev", "evil", "", &[]),
                "",
            ))]),
            OK,
        )
        .req(
            BATCH,
            ADMIN,
            &WriteRequest {
                writes: vec![Write { op: None }; 257],
            },
            refused(Code::InvalidArgument),
        )
        .req(
            GET,
            ADMIN,
            &get("network", "Links.net.talos.dev", "eth0"),
            OK,
        )
        .req(
            GET,
            ADMIN,
            &get("network", "Links.net.talos.dev", "evil"),
            refused(Code::NotFound),
        );

    vec![
        ("lifecycle", lifecycle),
        ("batches", batches),
        ("finalizers", finalizers),
        ("node", node),
        ("definitions", definitions),
        ("invalid", invalid),
    ]
}

#[test]
fn seeds_reach_the_service_checks() {
    let write = std::env::var_os("FUZZ_WRITE_SEEDS").is_some();
    let dir = testkit::fuzz::fuzz_dir().join("corpus/stated_requests");
    for (name, input) in seeds() {
        assert_eq!(fuzz_requests(&input.bytes), input.expected, "seed {name}");
        if write {
            std::fs::create_dir_all(&dir).expect("corpus directory");
            std::fs::write(dir.join(format!("seed-{name}")), &input.bytes).expect("seed written");
        }
    }
}

#[test]
fn empty_and_truncated_inputs_are_no_requests() {
    assert!(fuzz_requests(&[]).is_empty());
    assert!(fuzz_requests(&[1]).is_empty());
    assert!(fuzz_requests(&[1, CREATE, 5]).is_empty());
    // A frame longer than the input is cut at its end: still one (undecodable) request.
    assert_eq!(
        fuzz_requests(&[0, CREATE, 0xff, 0xff, 0x0a]),
        [FuzzOutcome::Undecodable]
    );
}

#[test]
fn at_most_the_request_limit_runs() {
    let mut input = vec![0];
    for _ in 0..stated::testing::FUZZ_MAX_REQUESTS + 10 {
        input.extend_from_slice(&[GET, 0, 0]);
    }
    // An empty GetRequest names no namespace: refused, not panicking.
    let out = fuzz_requests(&input);
    assert_eq!(out.len(), stated::testing::FUZZ_MAX_REQUESTS);
    assert!(out.iter().all(|o| *o == refused(Code::InvalidArgument)));
}

#[test]
fn corpus_replays_without_panic() {
    testkit::fuzz::replay_crate(
        "stated",
        &[("stated_requests", &|data| {
            let _ = fuzz_requests(data);
        })],
    );
}
