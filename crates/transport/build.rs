//! Generates the gRPC `DataPlane` service with tonic; the message types come from
//! `downpour_core::proto`, so both crates share one definition of every wire message.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=../../proto/downpour.proto");
    let fds = protox::compile(["downpour.proto"], ["../../proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .bytes(".")
        // prost's messages with buffers sized for whole chunks (grpc.rs)
        .codec_path("crate::grpc::FrameCodec")
        .extern_path(".downpour.v1", "::downpour_core::proto")
        .compile_fds(fds)?;
    Ok(())
}
