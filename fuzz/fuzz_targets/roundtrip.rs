//! Frames made from arbitrary bytes: encoding then decoding, in arbitrary pieces, gives them
//! back, and the encoding is the documented layout.
//!
//! The input is read as frames, 8 bytes of header each (id, 24-bit length, kind modulo 8), a
//! Data frame taking up to its length of the following bytes as payload (its length is then
//! what it got). So bytes captured from a real connection make a corpus that means something.

#![no_main]

use bytes::{Bytes, BytesMut};
use gomux::codec::FrameCodec;
use gomux::frame::{Frame, Header, Kind, HEADER_LEN};
use libfuzzer_sys::fuzz_target;
use tokio_util::codec::{Decoder, Encoder};

/// The largest payload this target makes; the codec's limit is the protocol's 65536.
const MAX_PAYLOAD: usize = 65_536;

fn frames_from(mut input: &[u8]) -> Vec<Frame> {
    let mut frames = Vec::new();
    while input.len() >= HEADER_LEN {
        let (head, rest) = input.split_at(HEADER_LEN);
        let id = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
        let length = u32::from_le_bytes([head[4], head[5], head[6], 0]);
        let kind = Kind::from_u8(head[7] % 8).unwrap_or(Kind::Keepalive);
        input = rest;
        let frame = if kind == Kind::Data {
            let take = (length as usize).min(input.len()).min(MAX_PAYLOAD);
            let (payload, rest) = input.split_at(take);
            input = rest;
            Frame::data(id, Bytes::copy_from_slice(payload))
        } else {
            Frame {
                header: Header { id, length, kind },
                payload: Bytes::new(),
            }
        };
        frames.push(frame);
    }
    frames
}

fuzz_target!(|input: &[u8]| {
    let frames = frames_from(input);
    let mut codec = FrameCodec::new();
    let mut wire = BytesMut::new();
    for frame in &frames {
        let start = wire.len();
        if codec.encode(frame.clone(), &mut wire).is_err() {
            panic!("a valid frame was refused: {:?}", frame.header);
        }
        // The documented layout: id and length little-endian, then the kind, then the payload.
        let h = frame.header;
        assert_eq!(wire[start..start + 4], h.id.to_le_bytes());
        assert_eq!(wire[start + 4..start + 7], h.length.to_le_bytes()[..3]);
        assert_eq!(wire[start + 7], h.kind as u8);
        assert_eq!(wire[start + HEADER_LEN..], frame.payload[..]);
    }
    // Decode in pieces whose sizes come from the input's length.
    let mut decoded = Vec::new();
    let mut buf = BytesMut::new();
    let mut rest = &wire[..];
    let mut piece = 1 + input.len() % 13;
    while !rest.is_empty() {
        let (now, later) = rest.split_at(piece.min(rest.len()));
        buf.extend_from_slice(now);
        rest = later;
        piece = 1 + (piece * 7 + 3) % 61;
        loop {
            match codec.decode(&mut buf) {
                Ok(Some(frame)) => decoded.push(frame),
                Ok(None) => break,
                Err(error) => panic!("encoded frames failed to decode: {error}"),
            }
        }
    }
    assert!(buf.is_empty(), "bytes left over");
    assert!(decoded == frames, "the frames did not come back");
});
