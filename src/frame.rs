//! Wire types of the gomux protocol: the 8-byte header, the frame kinds and their limits.
//!
//! Pure data, no I/O. The header layout (all integers little-endian):
//!
//! | bytes | field  | type |
//! |-------|--------|------|
//! | 0..4  | id     | u32  |
//! | 4..7  | length | u24  |
//! | 7     | kind   | u8   |
//!
//! Only [`Kind::Data`] frames carry a payload, exactly `length` bytes long. For
//! [`Kind::WindowUpdate`] the length is the credit granted; for every other kind it is
//! meaningless (the Go peer sends 0 and ignores it).

use std::fmt;

use bytes::Bytes;

/// Size of a frame header on the wire.
pub const HEADER_LEN: usize = 8;

/// The largest value the 24-bit length field can hold.
pub const MAX_LENGTH_FIELD: u32 = 0x00ff_ffff;

/// The largest Data payload the Go implementation accepts (`1 << 16`). Sending more makes a Go
/// peer fail the session.
pub const MAX_PAYLOAD: usize = 0x1_0000;

/// The credit every stream direction starts with, fixed by the protocol.
pub const INITIAL_WINDOW: u32 = 0x1_0000;

/// The stream id of the greeting: a [`Kind::Keepalive`] frame that every session of this crate
/// sends first, whose length field is the sender's keepalive interval in milliseconds (0: it
/// sends none; intervals beyond the field's 4.6 hours are announced as 0). A Go peer does nothing
/// with a keepalive, whatever its id and length; a peer of this crate learns from it that the
/// other end acknowledges the streams it accepts (so a stream closed before any frame came back
/// was refused) and how often it hears from it at the least (so a silent peer is a dead one).
/// The bytes spell `gmux` on the wire.
pub const GREETING_ID: u32 = u32::from_le_bytes(*b"gmux");

/// What a frame is. The Go implementation calls this field "flags".
///
/// The half-close kinds are named for what the **receiver** must do: a side that stops
/// writing sends [`Kind::CloseRead`].
///
/// ```
/// use gomux::frame::Kind;
///
/// assert_eq!(Kind::CloseRead as u8, 3);
/// assert_eq!(Kind::from_u8(6), Some(Kind::WindowUpdate));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Kind {
    /// Payload for the stream (`0x00`).
    Data = 0x00,
    /// Keeps the connection busy; the receiver does nothing (`0x01`).
    Keepalive = 0x01,
    /// Opens a stream with the frame's id (`0x02`).
    OpenStream = 0x02,
    /// The sender writes no more on the stream: the receiver's reads end after its buffer (`0x03`).
    CloseRead = 0x03,
    /// The sender reads no more on the stream: the receiver's writes now fail (`0x04`).
    CloseWrite = 0x04,
    /// The sender closed the stream for good (`0x05`).
    CloseStream = 0x05,
    /// Adds `length` bytes of send credit on the stream (`0x06`).
    WindowUpdate = 0x06,
    /// The sender is shutting the whole session down (`0x07`).
    CloseMux = 0x07,
}

impl Kind {
    /// The kind for a wire byte, or `None` for the undefined values `0x08..=0xff`.
    ///
    /// ```
    /// use gomux::frame::Kind;
    ///
    /// assert_eq!(Kind::from_u8(0x02), Some(Kind::OpenStream));
    /// assert_eq!(Kind::from_u8(0x08), None); // undefined: a protocol error on the wire
    /// ```
    pub const fn from_u8(byte: u8) -> Option<Kind> {
        Some(match byte {
            0x00 => Kind::Data,
            0x01 => Kind::Keepalive,
            0x02 => Kind::OpenStream,
            0x03 => Kind::CloseRead,
            0x04 => Kind::CloseWrite,
            0x05 => Kind::CloseStream,
            0x06 => Kind::WindowUpdate,
            0x07 => Kind::CloseMux,
            _ => return None,
        })
    }
}

/// A decoded frame header.
///
/// ```
/// use gomux::frame::{Header, Kind};
///
/// let header = Header { id: 3, length: 512, kind: Kind::Data };
/// assert_eq!(Header::from_bytes(header.to_bytes()), Ok(header));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Header {
    /// The stream the frame belongs to (0 for Keepalive and CloseMux).
    pub id: u32,
    /// Payload length for Data, credit for WindowUpdate, otherwise normally 0. At most
    /// [`MAX_LENGTH_FIELD`].
    pub length: u32,
    /// What the frame is.
    pub kind: Kind,
}

impl Header {
    /// A header with a zero length field.
    ///
    /// ```
    /// use gomux::frame::{Header, Kind};
    ///
    /// let close = Header::new(5, Kind::CloseStream);
    /// assert_eq!((close.id, close.length), (5, 0));
    /// ```
    pub const fn new(id: u32, kind: Kind) -> Header {
        Header {
            id,
            length: 0,
            kind,
        }
    }

    /// The 8 wire bytes of this header. The length is truncated to 24 bits; callers that accept
    /// lengths from outside check [`MAX_LENGTH_FIELD`] first (the encoder does).
    ///
    /// ```
    /// use gomux::frame::{Header, Kind};
    ///
    /// let header = Header { id: 1, length: 0x0102_03, kind: Kind::Data };
    /// assert_eq!(header.to_bytes(), [1, 0, 0, 0, 0x03, 0x02, 0x01, 0]);
    /// ```
    pub const fn to_bytes(self) -> [u8; HEADER_LEN] {
        let id = self.id.to_le_bytes();
        let len = self.length.to_le_bytes();
        [
            id[0],
            id[1],
            id[2],
            id[3],
            len[0],
            len[1],
            len[2],
            self.kind as u8,
        ]
    }

    /// Parses 8 wire bytes. Fails only on an undefined kind, which it returns.
    ///
    /// ```
    /// use gomux::frame::{Header, Kind};
    ///
    /// let header = Header::from_bytes([2, 0, 0, 0, 0, 0, 0, 5])?;
    /// assert_eq!(header, Header::new(2, Kind::CloseStream));
    /// assert_eq!(Header::from_bytes([0, 0, 0, 0, 0, 0, 0, 0x2a]), Err(0x2a));
    /// # Ok::<(), u8>(())
    /// ```
    pub const fn from_bytes(bytes: [u8; HEADER_LEN]) -> Result<Header, u8> {
        let id = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        let length = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], 0]);
        match Kind::from_u8(bytes[7]) {
            Some(kind) => Ok(Header { id, length, kind }),
            None => Err(bytes[7]),
        }
    }
}

/// One frame: a header and, for Data frames only, its payload.
///
/// For a Data frame built with [`Frame::data`], `header.length == payload.len()`. The encoder
/// rejects frames that break that rule or carry a payload on another kind.
///
/// ```
/// use gomux::frame::{Frame, Kind};
///
/// let frame = Frame::data(2, &b"payload"[..]);
/// assert_eq!(frame.header.kind, Kind::Data);
/// assert_eq!(frame.header.length as usize, frame.payload.len());
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct Frame {
    /// The frame header.
    pub header: Header,
    /// The payload; empty unless `header.kind` is [`Kind::Data`].
    pub payload: Bytes,
}

impl Frame {
    /// A Data frame carrying `payload` on stream `id`.
    ///
    /// # Panics
    ///
    /// When `payload` is longer than [`MAX_LENGTH_FIELD`] bytes, which no header can describe.
    ///
    /// ```
    /// let frame = gomux::frame::Frame::data(4, vec![0u8; 1000]);
    /// assert_eq!(frame.header.length, 1000);
    /// ```
    pub fn data(id: u32, payload: impl Into<Bytes>) -> Frame {
        let payload = payload.into();
        let length = u32::try_from(payload.len())
            .ok()
            .filter(|len| *len <= MAX_LENGTH_FIELD)
            .expect("Data payload longer than the 24-bit length field");
        Frame {
            header: Header {
                id,
                length,
                kind: Kind::Data,
            },
            payload,
        }
    }

    /// A WindowUpdate frame granting `credit` bytes on stream `id`.
    ///
    /// # Panics
    ///
    /// When `credit` exceeds [`MAX_LENGTH_FIELD`].
    ///
    /// ```
    /// let frame = gomux::frame::Frame::window_update(4, 65536);
    /// assert_eq!(frame.header.length, 65536);
    /// assert!(frame.payload.is_empty());
    /// ```
    pub fn window_update(id: u32, credit: u32) -> Frame {
        assert!(credit <= MAX_LENGTH_FIELD, "credit above the 24-bit field");
        Frame {
            header: Header {
                id,
                length: credit,
                kind: Kind::WindowUpdate,
            },
            payload: Bytes::new(),
        }
    }

    /// A frame of any payload-less kind with a zero length field (OpenStream, CloseStream, …).
    ///
    /// ```
    /// use gomux::frame::{Frame, Kind};
    ///
    /// let open = Frame::control(6, Kind::OpenStream);
    /// assert_eq!(open.header.to_bytes(), [6, 0, 0, 0, 0, 0, 0, 2]);
    /// ```
    pub fn control(id: u32, kind: Kind) -> Frame {
        Frame {
            header: Header::new(id, kind),
            payload: Bytes::new(),
        }
    }
}

impl fmt::Debug for Frame {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Frame")
            .field("id", &self.header.id)
            .field("kind", &self.header.kind)
            .field("length", &self.header.length)
            .field("payload_len", &self.payload.len())
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Known answers written from the protocol description, so the wire format is tested from
    // the description as well as against the recorded Go vectors (tests/vectors.rs).
    #[test]
    fn header_known_answers() {
        let cases: [(Header, [u8; 8]); 4] = [
            (
                Header {
                    id: 0x1234,
                    length: 0,
                    kind: Kind::OpenStream,
                },
                [0x34, 0x12, 0, 0, 0, 0, 0, 0x02],
            ),
            (
                Header {
                    id: 3,
                    length: 0x01_0000,
                    kind: Kind::WindowUpdate,
                },
                [0x03, 0, 0, 0, 0, 0, 0x01, 0x06],
            ),
            (
                Header {
                    id: 0xffff_ffff,
                    length: 1,
                    kind: Kind::Data,
                },
                [0xff, 0xff, 0xff, 0xff, 0x01, 0, 0, 0x00],
            ),
            (
                Header {
                    id: 0,
                    length: 0,
                    kind: Kind::CloseMux,
                },
                [0, 0, 0, 0, 0, 0, 0, 0x07],
            ),
        ];
        for (header, wire) in cases {
            assert_eq!(header.to_bytes(), wire);
            assert_eq!(Header::from_bytes(wire), Ok(header));
        }
    }

    #[test]
    fn every_defined_kind_round_trips_and_the_rest_are_rejected() {
        for byte in 0..=255u8 {
            match Kind::from_u8(byte) {
                Some(kind) => {
                    assert!(byte <= 7);
                    assert_eq!(kind as u8, byte);
                }
                None => assert!(byte >= 8),
            }
        }
        assert_eq!(Header::from_bytes([0, 0, 0, 0, 0, 0, 0, 8]), Err(8));
    }

    #[test]
    fn a_data_frame_takes_a_payload_up_to_what_the_length_field_holds() {
        let frame = Frame::data(1, vec![0; MAX_LENGTH_FIELD as usize]);
        assert_eq!(frame.header.length, MAX_LENGTH_FIELD);
        let longer = std::panic::catch_unwind(|| Frame::data(1, vec![0; 1 << 24]));
        assert!(longer.is_err(), "one byte more than the field holds");
        let credit = Frame::window_update(1, MAX_LENGTH_FIELD);
        assert_eq!(credit.header.length, MAX_LENGTH_FIELD);
        assert!(std::panic::catch_unwind(|| Frame::window_update(1, 1 << 24)).is_err());
    }

    #[test]
    fn a_frame_shows_its_payload_length_not_its_payload() {
        let shown = format!("{:?}", Frame::data(7, &b"secret"[..]));
        assert_eq!(
            shown,
            "Frame { id: 7, kind: Data, length: 6, payload_len: 6 }"
        );
    }

    #[test]
    fn length_is_24_bits() {
        let header = Header {
            id: 0,
            length: MAX_LENGTH_FIELD,
            kind: Kind::WindowUpdate,
        };
        let wire = header.to_bytes();
        assert_eq!(&wire[4..7], &[0xff, 0xff, 0xff]);
        assert_eq!(
            Header::from_bytes(wire).map(|h| h.length),
            Ok(MAX_LENGTH_FIELD)
        );
    }
}
