//! `gomux::tcp`: the settings land on the socket (feature `tcp`).

use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};

async fn connected() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let addr = listener.local_addr().expect("address");
    let (dialed, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
    (dialed.expect("connect"), accepted.expect("accept").0)
}

#[tokio::test]
async fn configure_sets_nodelay_and_notsent_lowat() {
    let (stream, _peer) = connected().await;
    assert!(!stream.nodelay().expect("nodelay"));
    gomux::tcp::configure(&stream).expect("configure");
    assert!(stream.nodelay().expect("nodelay"));
    #[cfg(any(target_os = "linux", target_os = "android"))]
    assert_eq!(
        socket2::SockRef::from(&stream)
            .tcp_notsent_lowat()
            .expect("read back"),
        gomux::tcp::NOTSENT_LOWAT
    );
}

/// What the setting is for: with it, a sender whose peer does not read is told to wait with
/// few bytes unsent, instead of filling a send buffer of megabytes.
#[cfg(any(target_os = "linux", target_os = "android"))]
#[tokio::test]
async fn notsent_lowat_bounds_what_the_kernel_takes() {
    async fn accepted_before_blocking(lowat: Option<u32>) -> usize {
        let (stream, _peer) = connected().await;
        if let Some(bytes) = lowat {
            gomux::tcp::set_notsent_lowat(&stream, bytes).expect("set");
        }
        let chunk = vec![0; 64 * 1024];
        let mut total = 0;
        // The peer never reads: writes go on until the socket stops taking bytes.
        while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(200), stream.writable())
            .await
            .map(|_| stream.try_write(&chunk))
        {
            total += n;
            assert!(total < 1 << 30, "the socket never stopped taking bytes");
        }
        total
    }
    let without = accepted_before_blocking(None).await;
    let with = accepted_before_blocking(Some(16 * 1024)).await;
    assert!(
        with < without,
        "with TCP_NOTSENT_LOWAT the socket took {with} bytes, without it {without}"
    );
}
