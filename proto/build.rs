//! Compiles the .proto files with protox (pure Rust): no system `protoc` is needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/v1alpha1/resource.proto",
        "proto/v1alpha1/state.proto",
        "proto/v1alpha1/meta.proto",
        "proto/v1alpha1/init.proto",
        "proto/security/security.proto",
        "proto/google/rpc/status.proto",
        "proto/common/common.proto",
        "proto/machine/machine.proto",
        "proto/talosrs/audit.proto",
    ];
    for f in &files {
        println!("cargo:rerun-if-changed={f}");
    }
    let fds = protox::compile(files, ["proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        // prost's codec answers an undecodable request (a string that is not UTF-8, a
        // truncated field) with INTERNAL; ours says what it is: INVALID_ARGUMENT.
        .codec_path("crate::codec::Codec")
        .compile_fds(fds)?;
    Ok(())
}
