//! Compiles the gRPC API (`proto/marshal/v1/*.proto`) when the `service` feature is on.
//! The protos are parsed by `protox` (pure Rust), so no system `protoc` is needed; the
//! encoded descriptor set is written beside the generated code for the reflection
//! service.

fn main() {
    println!("cargo:rerun-if-changed=proto");
    // Without the `service` feature there is nothing to generate.
    #[cfg(feature = "service")]
    if let Err(e) = service::compile() {
        panic!("compiling the marshal.v1 protos: {e}");
    }
}

#[cfg(feature = "service")]
mod service {
    use prost::Message as _;

    const PROTOS: &[&str] = &[
        "marshal/v1/types.proto",
        "marshal/v1/jobs.proto",
        "marshal/v1/nodes.proto",
        "marshal/v1/advisor.proto",
        "marshal/v1/admin.proto",
    ];

    pub fn compile() -> Result<(), Box<dyn std::error::Error>> {
        let fds = protox::compile(PROTOS, ["proto"])?;
        let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
        std::fs::write(out.join("marshal_v1_descriptor.bin"), fds.encode_to_vec())?;
        tonic_prost_build::configure()
            .build_client(true)
            .build_server(true)
            .compile_fds(fds)?;
        Ok(())
    }
}
