//! How a session names the end of its connection: at a frame boundary it is a clean close
//! (`ConnectionClosed`); anywhere inside a frame, even right after a whole Data header with no
//! byte of its payload yet, it is `UnexpectedEof`.
//!
//! ```text
//! cargo test --test connection_end
//! ```

mod common;

use common::{raw_session, within};
use gomux::frame::{Frame, Header, Kind};
use gomux::{Config, Error, Role};

/// A server session whose raw peer opens stream 0, sends `bytes`, then ends the connection;
/// returns the error the session ended with.
async fn end_after(bytes: &[u8]) -> Error {
    let (session, _driver, _faults, mut raw) = raw_session(Role::Server, Config::default());
    raw.send(Frame::control(0, Kind::OpenStream)).await;
    let _stream = within("accept", session.accept()).await.expect("accept");
    raw.send_raw(bytes).await;
    drop(raw);
    within("the session ends", session.closed()).await
}

#[tokio::test]
async fn a_connection_that_ends_right_after_a_data_header_ends_unexpectedly() {
    let header = Header {
        id: 0,
        length: 100,
        kind: Kind::Data,
    };
    let error = end_after(&header.to_bytes()).await;
    assert!(matches!(error, Error::UnexpectedEof), "{error:?}");
}

#[tokio::test]
async fn a_connection_that_ends_inside_a_header_ends_unexpectedly() {
    let error = end_after(&[0, 0, 0, 0, 100]).await;
    assert!(matches!(error, Error::UnexpectedEof), "{error:?}");
}

#[tokio::test]
async fn a_connection_that_ends_after_a_whole_data_frame_is_closed_cleanly() {
    let header = Header {
        id: 0,
        length: 3,
        kind: Kind::Data,
    };
    let mut bytes = header.to_bytes().to_vec();
    bytes.extend_from_slice(b"abc");
    let error = end_after(&bytes).await;
    assert!(matches!(error, Error::ConnectionClosed), "{error:?}");
}
