//! Turning away a SOCKS5 client that the entry cannot carry (no connection to the exit could
//! be had within `--exit-wait`, or the entry is shutting down): with `entry --socks`, the
//! client gets a SOCKS5 failure reply, which it can report, rather than a connection closed
//! without a word.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// How long the exchange that ends in the failure reply may take.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(5);

/// SOCKS5 (RFC 1928).
const VERSION: u8 = 5;
const NO_AUTHENTICATION: u8 = 0;
const PASSWORD: u8 = 2;
const NO_ACCEPTABLE_METHOD: u8 = 0xff;
/// The reply "network unreachable": the tunnel to the network the client asked for is down.
const NETWORK_UNREACHABLE: u8 = 3;

/// Answers the client's SOCKS5 greeting and request with "network unreachable", within
/// [`EXCHANGE_TIMEOUT`]; gives up quietly on anything that is not SOCKS5. Reads every
/// field by its length byte, so at most 2 + 255 bytes a field.
///
/// Only the exit can check a user name and password: here they are read and dropped
/// (neither kept nor logged), the status says "accepted", and the request's reply then says
/// why nothing is reached.
pub(crate) async fn refuse_socks<T: AsyncRead + AsyncWrite + Unpin>(client: &mut T) {
    let exchange = async {
        let [version, count] = read_array(client).await?;
        if version != VERSION {
            return Ok(());
        }
        let methods = read_vec(client, count).await?;
        if methods.contains(&NO_AUTHENTICATION) {
            client.write_all(&[VERSION, NO_AUTHENTICATION]).await?;
        } else if methods.contains(&PASSWORD) {
            client.write_all(&[VERSION, PASSWORD]).await?;
            let [_, user_len] = read_array(client).await?;
            read_vec(client, user_len).await?;
            let [password_len] = read_array(client).await?;
            read_vec(client, password_len).await?;
            client.write_all(&[1, 0]).await?;
        } else {
            client.write_all(&[VERSION, NO_ACCEPTABLE_METHOD]).await?;
            return client.shutdown().await;
        }
        // VER CMD RSV ATYP DST.ADDR DST.PORT: read whole, so that closing sends no reset
        // that could overtake the reply.
        let [_, _, _, kind] = read_array(client).await?;
        let address = match kind {
            1 => 4,
            4 => 16,
            3 => {
                let [len] = read_array(client).await?;
                usize::from(len)
            }
            _ => 0,
        };
        let mut rest = vec![0; address + 2];
        client.read_exact(&mut rest).await?;
        client
            .write_all(&[VERSION, NETWORK_UNREACHABLE, 0, 1, 0, 0, 0, 0, 0, 0])
            .await?;
        client.shutdown().await
    };
    let _ = tokio::time::timeout(EXCHANGE_TIMEOUT, exchange).await;
}

async fn read_array<const N: usize, T: AsyncRead + Unpin>(
    client: &mut T,
) -> std::io::Result<[u8; N]> {
    let mut bytes = [0; N];
    client.read_exact(&mut bytes).await?;
    Ok(bytes)
}

async fn read_vec<T: AsyncRead + Unpin>(client: &mut T, len: u8) -> std::io::Result<Vec<u8>> {
    let mut bytes = vec![0; usize::from(len)];
    client.read_exact(&mut bytes).await?;
    Ok(bytes)
}
