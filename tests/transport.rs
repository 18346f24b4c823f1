//! The transport after the session: `Connection::into_inner` gives it back.

mod common;

use common::within;
use gomux::frame::{Header, Kind, HEADER_LEN};
use gomux::{Config, Error, Role, Session};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test]
async fn after_a_graceful_close_the_transport_comes_back_shut_down() {
    let (io, mut peer) = tokio::io::duplex(1024);
    let (session, mut connection) = Session::new(io, Role::Client, Config::default());
    // The peer answers the CloseMux with its own (the session reads until the peer's CloseMux
    // or end of file, so that the peer is not reset), and reads to the end.
    let answer = async {
        let mut seen = Vec::new();
        peer.read_to_end(&mut seen).await.expect("read");
        peer.write_all(&Header::new(0, Kind::CloseMux).to_bytes())
            .await
            .expect("write");
        seen
    };
    let (closed, driven, seen) = within("close", async {
        tokio::join!(session.close(), &mut connection, answer)
    })
    .await;
    closed.expect("graceful close");
    driven.expect("the driver's outcome");
    let io = connection.into_inner();

    // The peer saw the greeting, CloseMux, then end of file: the transport was shut down for
    // writing...
    let header = Header::from_bytes(seen[..HEADER_LEN].try_into().expect("8 bytes"));
    assert_eq!(header.expect("a frame").id, gomux::frame::GREETING_ID);
    let header = Header::from_bytes(
        seen[HEADER_LEN..][..HEADER_LEN]
            .try_into()
            .expect("8 bytes"),
    );
    assert_eq!(header.expect("a frame").kind, Kind::CloseMux);
    assert_eq!(seen.len(), 2 * HEADER_LEN);
    // ...and it is the same transport: what the peer writes arrives on it.
    peer.write_all(b"after").await.expect("write");
    let mut io = io;
    let mut after = [0; 5];
    io.read_exact(&mut after).await.expect("read");
    assert_eq!(&after, b"after");
}

#[tokio::test]
async fn taking_the_transport_from_a_running_session_ends_it() {
    let (io, _peer) = tokio::io::duplex(1024);
    let (session, connection) = Session::new(io, Role::Client, Config::default());
    let _io = connection.into_inner();
    let error = session.open().await.expect_err("no driver any more");
    assert!(
        matches!(&error, Error::SessionUnavailable(reason) if matches!(**reason, Error::ClosedLocally)),
        "{error:?}"
    );
    assert!(matches!(session.closed().await, Error::ClosedLocally));
}
