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
        "proto/storage/storage.proto",
        "proto/talosrs/audit.proto",
        "proto/talosrs/state.proto",
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
        // Written by hand (src/encoded.rs): a server sends what it encoded once (events for all
        // watchers; a resource for the log, the reply and the watchers).
        // A batch's results carry the resources stated encoded once (shared, not copied).
        .bytes(".talosrs.state.WriteResult.resource")
        .extern_path(
            ".cosi.resource.WatchResponse",
            "crate::encoded::WatchResponse",
        )
        .extern_path(
            ".cosi.resource.GetResponse",
            "crate::encoded::ResourceResponse",
        )
        .extern_path(
            ".cosi.resource.ListResponse",
            "crate::encoded::ResourceResponse",
        )
        .extern_path(
            ".cosi.resource.CreateResponse",
            "crate::encoded::ResourceResponse",
        )
        .extern_path(
            ".cosi.resource.UpdateResponse",
            "crate::encoded::ResourceResponse",
        )
        .compile_fds(fds)?;
    Ok(())
}
