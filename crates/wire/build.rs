//! Compiles `proto/downpour.proto` with protox (pure Rust): no `protoc` binary is needed.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=../../proto/downpour.proto");
    let fds = protox::compile(["downpour.proto"], ["../../proto"])?;
    let mut config = prost_build::Config::new();
    config.bytes(["."]);
    config.compile_fds(fds)?;
    Ok(())
}
