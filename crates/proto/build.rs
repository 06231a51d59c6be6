//! Compiles `proto/agentloop/v1` with protox (pure Rust), so no system `protoc` is needed.
use prost::Message;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let root = std::path::Path::new("../../proto");
    let files = ["agentloop/v1/messages.proto", "agentloop/v1/session.proto"];
    let fds = protox::compile(files, [root])?;
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptor = out.join("descriptor.bin");
    std::fs::write(&descriptor, fds.encode_to_vec())?;
    tonic_prost_build::configure()
        .compile_well_known_types(true)
        .extern_path(".google.protobuf", "::pbjson_types")
        .compile_fds(fds)?;
    pbjson_build::Builder::new()
        .register_descriptors(&std::fs::read(&descriptor)?)?
        .ignore_unknown_fields()
        .build(&[".agentloop"])?;
    println!("cargo:rerun-if-changed=../../proto");
    Ok(())
}
