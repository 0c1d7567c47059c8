//! Compiles the etcd API subset with protox (pure Rust): no system `protoc` is needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/etcd/api/mvccpb/kv.proto",
        "proto/etcd/api/etcdserverpb/rpc.proto",
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .compile_fds(fds)?;
    Ok(())
}
