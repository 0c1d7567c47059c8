//! The gRPC codec of every service here: prost's, except that a message that does not decode
//! (a string field that is not UTF-8, a truncated or malformed field) is `INVALID_ARGUMENT`, not
//! `INTERNAL`: it is the sender's error, and saying so lets a client tell it from a server fault.

use std::marker::PhantomData;

use tonic::codec::{BufferSettings, DecodeBuf, Decoder};
use tonic::Status;
use tonic_prost::{ProstDecoder, ProstEncoder};

/// prost encoding; decode errors as `INVALID_ARGUMENT`.
#[derive(Debug, Clone)]
pub struct Codec<T, U> {
    _pd: PhantomData<(T, U)>,
}

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Self { _pd: PhantomData }
    }
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = CheckedDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstEncoder::new(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        CheckedDecoder(ProstDecoder::new(BufferSettings::default()))
    }
}

/// prost's decoder with its errors mapped to `INVALID_ARGUMENT`.
#[derive(Debug, Clone, Default)]
pub struct CheckedDecoder<U>(ProstDecoder<U>);

impl<U: prost::Message + Default> Decoder for CheckedDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        self.0.decode(buf).map_err(|s| {
            if s.code() == tonic::Code::Internal {
                Status::invalid_argument(format!("malformed message: {}", s.message()))
            } else {
                s
            }
        })
    }

    fn buffer_settings(&self) -> BufferSettings {
        self.0.buffer_settings()
    }
}
