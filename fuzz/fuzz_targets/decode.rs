//! Arbitrary bytes through `FrameCodec`'s decoder, fed in arbitrary pieces.
//!
//! Input: one byte choosing the payload limit and the cut points, then the bytes on the wire.
//! Checks: no panic; the buffer never grows by more than one frame (the limit is checked before
//! anything is reserved); every frame is well formed for the limit; an error is final (decoding
//! again without new input gives the same error); and cutting the input differently changes
//! nothing (the frames and the error match a decode of the whole input at once).

#![no_main]

use bytes::BytesMut;
use gomux::codec::FrameCodec;
use gomux::frame::{Frame, Kind, HEADER_LEN, MAX_LENGTH_FIELD};
use libfuzzer_sys::fuzz_target;
use tokio_util::codec::Decoder;

/// Payload limits to run with: the protocol's, and small ones that make the limit reachable.
const LIMITS: [usize; 4] = [65_536, 16, 1, 4096];

/// Decodes `wire` fed in pieces whose sizes come from `seed`: the frames, then the error that
/// ended decoding (as text, for comparison) if any.
fn decode(limit: usize, wire: &[u8], seed: u8) -> (Vec<Frame>, Option<String>) {
    let mut codec = FrameCodec::with_max_payload(limit);
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    let mut rest = wire;
    let mut rng = u32::from(seed).wrapping_mul(2_654_435_761) | 1;
    loop {
        // Piece sizes from 1 to 64, or everything at once when the seed is 0.
        let piece = if seed == 0 {
            rest.len()
        } else {
            rng ^= rng << 13;
            rng ^= rng >> 17;
            rng ^= rng << 5;
            1 + (rng % 64) as usize
        };
        let (now, later) = rest.split_at(piece.min(rest.len()));
        buf.extend_from_slice(now);
        rest = later;
        loop {
            match codec.decode(&mut buf) {
                Ok(Some(frame)) => {
                    check_frame(&frame, limit);
                    frames.push(frame);
                }
                Ok(None) => break,
                Err(error) => {
                    let text = format!("{error:?}");
                    // Final: the same input gives the same error again.
                    let again = codec.decode(&mut buf);
                    assert_eq!(
                        again.map_err(|e| format!("{e:?}")).err().as_ref(),
                        Some(&text),
                        "the decoder moved on after an error"
                    );
                    return (frames, Some(text));
                }
            }
            // The limit bounds what the decoder reserves: one frame beyond what is buffered,
            // plus what `Vec` growth allows (it at most doubles).
            let bound = 2 * (buf.len() + limit + HEADER_LEN + 64);
            assert!(
                buf.capacity() <= bound,
                "capacity {} with {} buffered and a limit of {limit}",
                buf.capacity(),
                buf.len()
            );
        }
        if rest.is_empty() {
            return (frames, None);
        }
    }
}

fn check_frame(frame: &Frame, limit: usize) {
    let header = frame.header;
    assert!(header.length <= MAX_LENGTH_FIELD);
    if header.kind == Kind::Data {
        assert_eq!(frame.payload.len(), header.length as usize);
        assert!(frame.payload.len() <= limit, "a payload above the limit");
    } else {
        assert!(frame.payload.is_empty(), "a payload on a {:?}", header.kind);
    }
}

fuzz_target!(|input: &[u8]| {
    let Some((&choice, wire)) = input.split_first() else {
        return;
    };
    let limit = LIMITS[usize::from(choice & 3)];
    let whole = decode(limit, wire, 0);
    let pieces = decode(limit, wire, choice | 1);
    assert!(whole == pieces, "the cut points changed the outcome");
});
