//! prost's encoding of [`Frame`]s into a buffer reserved for the whole message, and its
//! decoding (the payload fields come out as slices of the receive buffer, no copy), with
//! buffers sized for whole chunks.

use super::CHUNK;
use downpour_core::proto::Frame;
use prost::Message;
use tonic::codec::BufferSettings;
use tonic::Status;

/// Room for one chunk's message (payload, header, protobuf tags).
const CHUNK_BUF: usize = CHUNK + (64 << 10);

/// The codec of the `DataPlane` service. Named by the generated code (`build.rs`).
#[derive(Default)]
pub(crate) struct FrameCodec;

impl tonic::codec::Codec for FrameCodec {
    type Encode = Frame;
    type Decode = Frame;
    type Encoder = FrameEncoder;
    type Decoder = tonic_prost::ProstDecoder<Frame>;

    fn encoder(&mut self) -> FrameEncoder {
        FrameEncoder
    }

    fn decoder(&mut self) -> Self::Decoder {
        tonic_prost::ProstDecoder::new(BufferSettings::new(CHUNK_BUF, 32 << 10))
    }
}

/// [`FrameCodec`]'s encoder.
pub(crate) struct FrameEncoder;

impl tonic::codec::Encoder for FrameEncoder {
    type Item = Frame;
    type Error = Status;

    fn encode(&mut self, item: Frame, dst: &mut tonic::codec::EncodeBuf<'_>) -> std::result::Result<(), Status> {
        dst.reserve(item.encoded_len());
        item.encode(dst).map_err(|e| Status::internal(format!("encoding a frame: {e}")))
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::new(CHUNK_BUF, 32 << 10)
    }
}
