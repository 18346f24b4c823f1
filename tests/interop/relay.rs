//! The credit audit: a relay between the Go peer and this crate that parses every frame going
//! each way, forwards it unchanged, and checks that no Data frame spends more credit than the
//! receiver had granted on its stream (65536 at the open, plus its WindowUpdates so far).
//!
//! The relay takes a frame into account before forwarding it, so a WindowUpdate is counted
//! before the sender can have seen it, and a correct sender can never show a violation here.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const HEADER: usize = 8;
const INITIAL_CREDIT: u64 = 65536;
const DATA: u8 = 0;
const WINDOW_UPDATE: u8 = 6;

/// What one direction's sender did with the credit its receiver granted.
#[derive(Debug, Default, Clone)]
pub struct Direction {
    /// Data frames and payload bytes that went this way.
    pub data_frames: u64,
    pub data_bytes: u64,
    /// Data frames that spent more than the credit granted, described.
    pub violations: Vec<String>,
    /// The most unspent credit the sender held on one stream when it sent a Data frame.
    pub peak_credit: u64,
    spent: HashMap<u32, u64>,
    /// Credit granted to this direction's sender by WindowUpdates of the other side.
    granted: HashMap<u32, u64>,
}

impl Direction {
    fn data(&mut self, id: u32, len: u64) {
        let granted = INITIAL_CREDIT + self.granted.get(&id).copied().unwrap_or(0);
        let spent = self.spent.entry(id).or_insert(0);
        self.peak_credit = self.peak_credit.max(granted.saturating_sub(*spent));
        *spent += len;
        if *spent > granted && self.violations.len() < 10 {
            self.violations.push(format!(
                "stream {id}: {spent} bytes sent against {granted} of credit"
            ));
        }
        self.data_frames += 1;
        self.data_bytes += len;
    }
}

/// Both directions: `[0]` is what the Go peer sent, `[1]` what this crate sent.
pub type Audit = Arc<Mutex<[Direction; 2]>>;

/// Relays between `go` and `rust` until both directions end, auditing every frame.
pub async fn relay(go: TcpStream, rust: TcpStream) -> [Direction; 2] {
    let audit: Audit = Arc::default();
    let (go_read, go_write) = go.into_split();
    let (rust_read, rust_write) = rust.into_split();
    let from_go = tokio::spawn(forward(go_read, rust_write, Arc::clone(&audit), 0));
    let from_rust = tokio::spawn(forward(rust_read, go_write, Arc::clone(&audit), 1));
    let _ = from_go.await;
    let _ = from_rust.await;
    let directions = audit.lock().unwrap_or_else(|e| e.into_inner());
    directions.clone()
}

async fn forward(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    audit: Audit,
    direction: usize,
) {
    let mut buf = BytesMut::with_capacity(256 * 1024);
    loop {
        match from.read_buf(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        // Account for every complete frame, then forward them.
        let mut complete = 0;
        {
            let mut directions = audit.lock().unwrap_or_else(|e| e.into_inner());
            while buf.len() - complete >= HEADER {
                let header = &buf[complete..complete + HEADER];
                let id = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
                let length = u32::from_le_bytes([header[4], header[5], header[6], 0]) as u64;
                let kind = header[7];
                let size = HEADER + if kind == DATA { length as usize } else { 0 };
                if buf.len() - complete < size {
                    break;
                }
                match kind {
                    DATA => directions[direction].data(id, length),
                    WINDOW_UPDATE => {
                        *directions[1 - direction].granted.entry(id).or_insert(0) += length;
                    }
                    _ => {}
                }
                complete += size;
            }
        }
        if complete > 0 {
            if to.write_all(&buf[..complete]).await.is_err() {
                break;
            }
            buf.advance(complete);
        }
    }
    let _ = to.shutdown().await;
}
