//! [`FrameCodec`]: the gomux wire format as a `tokio_util` [`Decoder`] and [`Encoder`].
//!
//! Usable on its own with [`tokio_util::codec::Framed`] for tools, tests and fuzzing; the
//! session uses the same decoder on its read buffer.
//!
//! The decoder faces untrusted input: it checks a Data frame's length against the configured
//! maximum **before** reserving room for it, rejects unknown kinds, and never reads a payload for
//! a kind other than Data, whatever its length field says (the Go reader reads none either).
//!
//! ```
//! use bytes::BytesMut;
//! use gomux::codec::FrameCodec;
//! use gomux::frame::{Frame, Kind};
//! use tokio_util::codec::{Decoder, Encoder};
//!
//! let mut codec = FrameCodec::new();
//! let mut wire = BytesMut::new();
//! codec.encode(Frame::data(2, &b"hello"[..]), &mut wire)?;
//! assert_eq!(&wire[..8], &[2, 0, 0, 0, 5, 0, 0, 0]);
//! let frame = codec.decode(&mut wire)?.expect("a whole frame");
//! assert_eq!(frame.header.kind, Kind::Data);
//! assert_eq!(&frame.payload[..], b"hello");
//! # Ok::<(), gomux::CodecError>(())
//! ```

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio_util::codec::{Decoder, Encoder};

use crate::error::{CodecError, InvalidFrame, ProtocolError};
use crate::frame::{Frame, Header, Kind, HEADER_LEN, MAX_LENGTH_FIELD, MAX_PAYLOAD};

/// Encoder and decoder of gomux frames.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")]
/// # async fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use gomux::codec::FrameCodec;
/// use gomux::frame::{Frame, Kind};
/// use tokio_util::codec::{FramedRead, FramedWrite};
/// use futures::{SinkExt, StreamExt};
///
/// // Frames over any byte pipe: here an in-memory one.
/// let (a, b) = tokio::io::duplex(1024);
/// let mut sink = FramedWrite::new(a, FrameCodec::new());
/// let mut frames = FramedRead::new(b, FrameCodec::new());
/// sink.send(Frame::control(2, Kind::OpenStream)).await?;
/// sink.send(Frame::data(2, &b"hi"[..])).await?;
/// assert_eq!(frames.next().await.expect("a frame")?.header.kind, Kind::OpenStream);
/// assert_eq!(&frames.next().await.expect("a frame")?.payload[..], b"hi");
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct FrameCodec {
    /// At most the length field's 2^24 - 1, so 32 bits hold it (the codec lives in every
    /// session's driver task, where every byte counts for an idle session).
    max_payload: u32,
    state: DecodeState,
    /// Whether `decode` reserves room for the rest of a partial payload. The session turns it
    /// off: it manages its own read buffers, and a reserve there would allocate behind its back.
    reserve_payload: bool,
}

/// Where the decoder is: waiting for a header, or for the payload of a Data frame whose header
/// it already consumed.
#[derive(Debug, Clone, Copy)]
enum DecodeState {
    Head,
    Data(Header),
}

impl FrameCodec {
    /// A codec accepting Data payloads up to [`MAX_PAYLOAD`] (65536) bytes, the Go limit.
    ///
    /// ```
    /// use tokio_util::codec::Decoder;
    ///
    /// let mut codec = gomux::codec::FrameCodec::new();
    /// let mut wire = bytes::BytesMut::from(&[2, 0, 0, 0, 0, 0, 0][..]); // 7 of 8 header bytes
    /// assert!(codec.decode(&mut wire)?.is_none()); // waits for the rest
    /// # Ok::<(), gomux::CodecError>(())
    /// ```
    pub fn new() -> FrameCodec {
        FrameCodec::with_max_payload(MAX_PAYLOAD)
    }

    /// A codec accepting Data payloads up to `max_payload` bytes (capped at the 24-bit field's
    /// 16,777,215). Setting a limit is what keeps a hostile peer from making the decoder reserve
    /// large buffers; do not raise it for input you do not trust.
    ///
    /// ```
    /// use tokio_util::codec::Decoder;
    ///
    /// let mut codec = gomux::codec::FrameCodec::with_max_payload(1024);
    /// // A Data header claiming 4096 bytes is refused before anything is reserved for it.
    /// let mut wire = bytes::BytesMut::from(&[2, 0, 0, 0, 0x00, 0x10, 0, 0][..]);
    /// assert!(matches!(codec.decode(&mut wire), Err(gomux::CodecError::Protocol(_))));
    /// ```
    pub fn with_max_payload(max_payload: usize) -> FrameCodec {
        FrameCodec {
            max_payload: max_payload.min(MAX_LENGTH_FIELD as usize) as u32,
            state: DecodeState::Head,
            reserve_payload: true,
        }
    }

    /// The same codec, leaving buffer capacity to the caller.
    pub(crate) fn without_reserve(mut self) -> FrameCodec {
        self.reserve_payload = false;
        self
    }

    /// Bytes still missing from the partial Data payload at the front of `src`, 0 when none.
    pub(crate) fn payload_missing(&self, src: &BytesMut) -> usize {
        match self.state {
            DecodeState::Data(header) => (header.length as usize).saturating_sub(src.len()),
            DecodeState::Head => 0,
        }
    }

    /// The largest Data payload this codec accepts.
    ///
    /// ```
    /// assert_eq!(gomux::codec::FrameCodec::new().max_payload(), 65536);
    /// assert_eq!(gomux::codec::FrameCodec::with_max_payload(usize::MAX).max_payload(), 0xff_ffff);
    /// ```
    pub fn max_payload(&self) -> usize {
        self.max_payload as usize
    }

    /// Whether a Data frame's header has been consumed and its payload is still awaited.
    pub(crate) fn in_frame(&self) -> bool {
        matches!(self.state, DecodeState::Data(_))
    }

    /// Decodes the header at the front of `src`, or returns `None` when fewer than 8 bytes are
    /// there.
    fn decode_head(&self, src: &[u8]) -> Result<Option<Header>, ProtocolError> {
        let Some(bytes) = src.get(..HEADER_LEN) else {
            return Ok(None);
        };
        let mut raw = [0u8; HEADER_LEN];
        raw.copy_from_slice(bytes);
        let header = Header::from_bytes(raw).map_err(|kind| ProtocolError::UnknownKind {
            id: u32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]),
            kind,
        })?;
        if header.kind == Kind::Data && header.length > self.max_payload {
            return Err(ProtocolError::PayloadTooLarge {
                id: header.id,
                length: header.length,
                max: self.max_payload as usize,
            });
        }
        Ok(Some(header))
    }

    /// Decodes the next whole frame at the front of `src` and returns its header, leaving a Data
    /// frame's payload at the front of `src` for the caller to take (all `header.length` bytes of
    /// it are there). The session copies short payloads out of the read buffer from there, which
    /// costs less than making them `Bytes` of their own first.
    pub(crate) fn decode_complete(
        &mut self,
        src: &mut BytesMut,
    ) -> Result<Option<Header>, CodecError> {
        let (header, used) = self.step(src)?;
        src.advance(used);
        if let DecodeState::Data(partial) = self.state {
            if self.reserve_payload {
                // The length was checked against the limit, so this reserve is bounded.
                src.reserve((partial.length as usize).saturating_sub(src.len()));
            }
        }
        Ok(header)
    }

    /// As [`decode_complete`](FrameCodec::decode_complete), from bytes the caller holds
    /// elsewhere (a read made on the stack): advances `src` past the header it takes.
    pub(crate) fn decode_complete_slice(
        &mut self,
        src: &mut &[u8],
    ) -> Result<Option<Header>, CodecError> {
        let (header, used) = self.step(src)?;
        *src = &src[used..];
        Ok(header)
    }

    /// The next whole frame's header, if all of it is in `src`, and how many bytes of `src`
    /// its header took (none when it was taken before, with the payload still missing).
    fn step(&mut self, src: &[u8]) -> Result<(Option<Header>, usize), CodecError> {
        // States: `Head` needs 8 bytes; a Data header moves to `Data(header)`, which needs
        // `header.length` more bytes. Other kinds are complete with their header.
        let (header, used) = match self.state {
            DecodeState::Head => match self.decode_head(src)? {
                None => return Ok((None, 0)),
                Some(header) if header.kind != Kind::Data => return Ok((Some(header), HEADER_LEN)),
                Some(header) => (header, HEADER_LEN),
            },
            DecodeState::Data(header) => (header, 0),
        };
        if src.len() - used < header.length as usize {
            self.state = DecodeState::Data(header);
            return Ok((None, used));
        }
        self.state = DecodeState::Head;
        Ok((Some(header), used))
    }
}

impl Default for FrameCodec {
    fn default() -> FrameCodec {
        FrameCodec::new()
    }
}

impl Decoder for FrameCodec {
    type Item = Frame;
    type Error = CodecError;

    fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, CodecError> {
        let Some(header) = self.decode_complete(src)? else {
            return Ok(None);
        };
        let payload = match header.kind {
            Kind::Data => src.split_to(header.length as usize).freeze(),
            _ => Bytes::new(),
        };
        Ok(Some(Frame { header, payload }))
    }

    fn decode_eof(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, CodecError> {
        match self.decode(buf)? {
            Some(frame) => Ok(Some(frame)),
            None if buf.is_empty() && matches!(self.state, DecodeState::Head) => Ok(None),
            None => Err(CodecError::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection ended in the middle of a frame",
            ))),
        }
    }
}

impl Encoder<Frame> for FrameCodec {
    type Error = CodecError;

    fn encode(&mut self, frame: Frame, dst: &mut BytesMut) -> Result<(), CodecError> {
        let Frame { header, payload } = frame;
        let invalid = |why| Err(CodecError::InvalidFrame(why));
        if header.length > MAX_LENGTH_FIELD {
            return invalid(InvalidFrame::LengthTooLarge {
                length: header.length,
            });
        }
        if header.kind == Kind::Data {
            if payload.len() != header.length as usize {
                return invalid(InvalidFrame::LengthMismatch {
                    length: header.length,
                    payload: payload.len(),
                });
            }
            if payload.len() > self.max_payload as usize {
                return invalid(InvalidFrame::PayloadTooLarge {
                    length: payload.len(),
                    max: self.max_payload as usize,
                });
            }
        } else if !payload.is_empty() {
            return invalid(InvalidFrame::UnexpectedPayload {
                kind: header.kind,
                length: payload.len(),
            });
        }
        dst.reserve(HEADER_LEN + payload.len());
        dst.put_slice(&header.to_bytes());
        dst.put_slice(&payload);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(codec: &mut FrameCodec, wire: &[u8]) -> Vec<Frame> {
        let mut buf = BytesMut::from(wire);
        let mut frames = Vec::new();
        while let Some(frame) = codec.decode(&mut buf).expect("valid input") {
            frames.push(frame);
        }
        assert!(buf.is_empty(), "trailing bytes");
        frames
    }

    #[test]
    fn control_frames_never_read_a_payload() {
        // A CloseStream whose length field says 5, followed by a Keepalive: the 5 is ignored.
        let wire = [8, 0, 0, 0, 5, 0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 1];
        let frames = decode_all(&mut FrameCodec::new(), &wire);
        assert_eq!(frames.len(), 2);
        assert_eq!(frames[0].header.kind, Kind::CloseStream);
        assert_eq!(frames[0].header.length, 5);
        assert!(frames[0].payload.is_empty());
        assert_eq!(frames[1].header.kind, Kind::Keepalive);
    }

    #[test]
    fn oversized_data_is_rejected_before_reserving() {
        let mut codec = FrameCodec::with_max_payload(16);
        let mut buf = BytesMut::from(&[1, 0, 0, 0, 17, 0, 0, 0][..]);
        let err = codec.decode(&mut buf).expect_err("too large");
        assert!(matches!(
            err,
            CodecError::Protocol(ProtocolError::PayloadTooLarge {
                id: 1,
                length: 17,
                max: 16
            })
        ));
        assert!(buf.capacity() < 17, "nothing reserved for the claimed size");
        // Window updates use the full 24-bit range whatever the payload limit.
        let mut buf = BytesMut::from(&[1, 0, 0, 0, 0xff, 0xff, 0xff, 6][..]);
        let frame = codec.decode(&mut buf).expect("valid").expect("whole");
        assert_eq!(frame.header.length, MAX_LENGTH_FIELD);
    }

    #[test]
    fn unknown_kind_is_an_error() {
        let mut buf = BytesMut::from(&[9, 0, 0, 0, 0, 0, 0, 0x2a][..]);
        let err = FrameCodec::new().decode(&mut buf).expect_err("unknown");
        assert!(matches!(
            err,
            CodecError::Protocol(ProtocolError::UnknownKind { id: 9, kind: 0x2a })
        ));
    }

    #[test]
    fn data_split_across_reads() {
        let mut codec = FrameCodec::new();
        let mut buf = BytesMut::from(&[4, 0, 0, 0, 3, 0, 0, 0, b'a'][..]);
        assert!(codec.decode(&mut buf).expect("valid").is_none());
        buf.extend_from_slice(b"bc");
        let frame = codec.decode(&mut buf).expect("valid").expect("whole");
        assert_eq!(frame, Frame::data(4, &b"abc"[..]));
    }

    #[test]
    fn eof_mid_frame_is_an_error() {
        let mut codec = FrameCodec::new();
        let mut buf = BytesMut::from(&[4, 0, 0, 0, 3, 0, 0][..]);
        assert!(codec.decode_eof(&mut buf).is_err());
        let mut buf = BytesMut::new();
        assert!(codec.decode_eof(&mut buf).expect("clean").is_none());
    }

    #[test]
    fn eof_right_after_a_data_header_is_an_error() {
        // The header is consumed and the buffer is empty: only the decoder's state tells that a
        // payload was still due. The session reads the same state through `in_frame`.
        let mut codec = FrameCodec::new();
        assert!(!codec.in_frame());
        let mut buf = BytesMut::from(&[4, 0, 0, 0, 3, 0, 0, 0][..]);
        assert!(codec.decode(&mut buf).expect("valid").is_none());
        assert!(buf.is_empty(), "the header was consumed");
        assert!(codec.in_frame());
        match codec.decode_eof(&mut buf) {
            Err(CodecError::Io(error)) => {
                assert_eq!(error.kind(), std::io::ErrorKind::UnexpectedEof);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_missing_part_of_a_payload_is_tracked_until_the_frame_is_whole() {
        let mut codec = FrameCodec::new();
        let mut buf = BytesMut::from(&[4, 0, 0, 0, 3, 0, 0, 0][..]);
        assert_eq!(codec.payload_missing(&buf), 0, "no header decoded yet");
        assert!(codec.decode(&mut buf).expect("valid").is_none());
        assert_eq!(codec.payload_missing(&buf), 3);
        buf.extend_from_slice(b"ab");
        assert!(codec.decode(&mut buf).expect("valid").is_none());
        assert_eq!(codec.payload_missing(&buf), 1);
        assert!(codec.in_frame());
        buf.extend_from_slice(b"c");
        let frame = codec.decode(&mut buf).expect("valid").expect("whole");
        assert_eq!(frame, Frame::data(4, &b"abc"[..]));
        assert!(!codec.in_frame(), "back at a frame boundary");
        assert_eq!(codec.payload_missing(&buf), 0);
    }

    #[test]
    fn a_partial_payload_is_reserved_for_unless_the_caller_manages_capacity() {
        let header = [4, 0, 0, 0, 0x60, 0xea, 0, 0]; // Data, 60,000 bytes
        let mut buf = BytesMut::from(&header[..]);
        assert!(FrameCodec::new().decode(&mut buf).expect("valid").is_none());
        assert!(buf.capacity() >= 60_000, "room for the payload");
        let mut buf = BytesMut::from(&header[..]);
        let mut codec = FrameCodec::new().without_reserve();
        assert!(codec.decode(&mut buf).expect("valid").is_none());
        assert!(buf.capacity() < 60_000, "nothing reserved");
        assert_eq!(codec.payload_missing(&buf), 60_000);
    }

    #[test]
    fn the_reserve_covers_what_is_missing_not_the_whole_payload_again() {
        // 59,000 of a 60,000-byte payload are there: a reserve of the missing 1,000 leaves the
        // buffer well under twice the frame whatever the allocator's rounding; one of the
        // payload's length on top of what is there would take it past that.
        let mut buf = BytesMut::from(&[4, 0, 0, 0, 0x60, 0xea, 0, 0][..]);
        buf.extend_from_slice(&[0; 59_000]);
        let mut buf = BytesMut::from(&buf[..]);
        assert!(FrameCodec::new().decode(&mut buf).expect("valid").is_none());
        assert!(buf.capacity() >= 60_000, "room for the payload");
        assert!(
            buf.capacity() < 150_000,
            "{} bytes of room for a 60,000-byte payload",
            buf.capacity()
        );
    }

    #[test]
    fn the_encoder_reserves_room_for_one_frame() {
        let mut dst = BytesMut::new();
        FrameCodec::new()
            .encode(Frame::data(1, vec![3; 1000]), &mut dst)
            .expect("valid");
        assert_eq!(dst.len(), HEADER_LEN + 1000);
        assert!(
            dst.capacity() < 2 * (HEADER_LEN + 1000),
            "{} bytes of room for a frame of {}",
            dst.capacity(),
            HEADER_LEN + 1000
        );
    }

    #[test]
    fn a_data_payload_of_exactly_the_limit_is_accepted() {
        let mut codec = FrameCodec::with_max_payload(16);
        assert_eq!(codec.max_payload(), 16);
        let mut wire = BytesMut::new();
        codec
            .encode(Frame::data(1, vec![9; 16]), &mut wire)
            .expect("at the limit");
        let frame = codec.decode(&mut wire).expect("valid").expect("whole");
        assert_eq!(frame.payload.len(), 16);
        assert_eq!(
            FrameCodec::with_max_payload(usize::MAX).max_payload(),
            MAX_LENGTH_FIELD as usize,
            "capped at what the length field holds"
        );
        assert_eq!(FrameCodec::default().max_payload(), MAX_PAYLOAD);
    }

    #[test]
    fn encoder_refuses_frames_it_cannot_send() {
        let mut codec = FrameCodec::with_max_payload(4);
        let mut dst = BytesMut::new();
        assert!(matches!(
            codec.encode(Frame::data(0, vec![0; 5]), &mut dst),
            Err(CodecError::InvalidFrame(InvalidFrame::PayloadTooLarge {
                length: 5,
                max: 4
            }))
        ));
        let mut bad = Frame::control(0, Kind::CloseStream);
        bad.payload = Bytes::from_static(b"x");
        assert!(matches!(
            codec.encode(bad, &mut dst),
            Err(CodecError::InvalidFrame(InvalidFrame::UnexpectedPayload {
                kind: Kind::CloseStream,
                length: 1
            }))
        ));
        let mut lying = Frame::data(0, &b"abc"[..]);
        lying.header.length = 2;
        assert!(matches!(
            codec.encode(lying, &mut dst),
            Err(CodecError::InvalidFrame(InvalidFrame::LengthMismatch {
                length: 2,
                payload: 3
            }))
        ));
        // The length field holds 24 bits: a credit of exactly that much goes out, one more
        // does not (it would be truncated on the wire).
        let mut too_long = Frame::control(0, Kind::WindowUpdate);
        too_long.header.length = MAX_LENGTH_FIELD + 1;
        assert!(matches!(
            codec.encode(too_long, &mut dst),
            Err(CodecError::InvalidFrame(InvalidFrame::LengthTooLarge {
                length: 0x0100_0000
            }))
        ));
        assert!(dst.is_empty());
        codec
            .encode(Frame::window_update(0, MAX_LENGTH_FIELD), &mut dst)
            .expect("the largest credit the field holds");
        assert_eq!(&dst[..], &[0, 0, 0, 0, 0xff, 0xff, 0xff, 6]);
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        fn any_frame() -> impl Strategy<Value = Frame> {
            prop_oneof![
                (
                    any::<u32>(),
                    proptest::collection::vec(any::<u8>(), 0..2048)
                )
                    .prop_map(|(id, payload)| Frame::data(id, payload)),
                (any::<u32>(), 0..=MAX_LENGTH_FIELD)
                    .prop_map(|(id, credit)| Frame::window_update(id, credit)),
                (any::<u32>(), 1u8..=7, any::<u32>()).prop_map(|(id, kind, length)| {
                    let kind = Kind::from_u8(kind).unwrap_or(Kind::Keepalive);
                    let mut frame = Frame::control(id, kind);
                    if kind != Kind::Data {
                        frame.header.length = length & MAX_LENGTH_FIELD;
                    }
                    frame
                }),
            ]
        }

        proptest! {
            #[test]
            fn encode_then_decode_in_any_split_gives_the_frames_back(
                frames in proptest::collection::vec(any_frame(), 0..16),
                cuts in proptest::collection::vec(1usize..64, 0..64),
            ) {
                let mut codec = FrameCodec::new();
                let mut wire = BytesMut::new();
                for frame in &frames {
                    codec.encode(frame.clone(), &mut wire).expect("encodable");
                }
                let mut decoded = Vec::new();
                let mut pending = BytesMut::new();
                let mut rest = &wire[..];
                let mut cuts = cuts.into_iter();
                while !rest.is_empty() {
                    let n = cuts.next().unwrap_or(rest.len()).min(rest.len());
                    pending.extend_from_slice(&rest[..n]);
                    rest = &rest[n..];
                    while let Some(frame) = codec.decode(&mut pending).expect("valid") {
                        decoded.push(frame);
                    }
                }
                prop_assert!(pending.is_empty());
                prop_assert_eq!(decoded, frames);
            }

            /// As the session reads: whole frames from a slice (a read on the stack), up to
            /// where a frame is cut, then the rest from a buffer.
            #[test]
            fn whole_frames_from_a_slice_then_the_rest_from_a_buffer_give_the_frames_back(
                frames in proptest::collection::vec(any_frame(), 0..16),
                cut in 0usize..8192,
            ) {
                let mut codec = FrameCodec::new().without_reserve();
                let mut wire = BytesMut::new();
                for frame in &frames {
                    codec.encode(frame.clone(), &mut wire).expect("encodable");
                }
                let frame = |header: Header, payload: &[u8]| Frame {
                    header,
                    payload: Bytes::copy_from_slice(payload),
                };
                let payload_len = |header: &Header| match header.kind {
                    Kind::Data => header.length as usize,
                    _ => 0,
                };
                let cut = cut.min(wire.len());
                let mut decoded = Vec::new();
                let mut slice = &wire[..cut];
                while let Some(header) = codec.decode_complete_slice(&mut slice).expect("valid") {
                    let len = payload_len(&header);
                    decoded.push(frame(header, &slice[..len]));
                    slice = &slice[len..];
                }
                // Every frame whole before the cut came from the slice.
                let mut end = 0;
                let whole = frames
                    .iter()
                    .take_while(|frame| {
                        end += HEADER_LEN + frame.payload.len();
                        end <= cut
                    })
                    .count();
                prop_assert_eq!(decoded.len(), whole);
                let mut rest = BytesMut::from(slice);
                rest.extend_from_slice(&wire[cut..]);
                while let Some(header) = codec.decode_complete(&mut rest).expect("valid") {
                    let len = payload_len(&header);
                    decoded.push(frame(header, &rest.split_to(len)));
                }
                prop_assert!(rest.is_empty());
                prop_assert_eq!(decoded, frames);
            }
        }
    }
}
