//! The frame codec on its own: encoding and decoding Data frames of 64 B, 1 KiB and 64 KiB and
//! the two commonest control frames, WindowUpdate and OpenStream.
//!
//! The `copy` rows of `codec/encode` are the floor the encoder is compared with: appending the
//! same 8 header bytes and payload to the buffer by hand. Data rows count the bytes of the whole
//! frame (header included); control rows count frames.
//!
//! ```text
//! cargo bench --bench codec
//! ```

use std::hint::black_box;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use criterion::{
    criterion_group, criterion_main, measurement::WallTime, BatchSize, BenchmarkGroup, BenchmarkId,
    Criterion, Throughput,
};
use gomux::codec::FrameCodec;
use gomux::frame::{Frame, Kind, HEADER_LEN};
use tokio_util::codec::{Decoder, Encoder};

/// Data payload sizes measured.
const SIZES: [usize; 3] = [64, 1024, 64 * 1024];

/// Every frame measured: its row name and parameter (payload size or control kind), what its
/// throughput counts, and the frame.
fn frames() -> Vec<(&'static str, String, Throughput, Frame)> {
    let mut frames: Vec<_> = SIZES
        .iter()
        .map(|&size| {
            let frame = Frame::data(7, Bytes::from(vec![0xa5; size]));
            let wire = Throughput::Bytes((HEADER_LEN + size) as u64);
            ("data", size.to_string(), wire, frame)
        })
        .collect();
    let control = [
        ("window-update", Frame::window_update(7, 64 * 1024)),
        ("open-stream", Frame::control(7, Kind::OpenStream)),
    ];
    for (kind, frame) in control {
        frames.push(("control", kind.to_string(), Throughput::Elements(1), frame));
    }
    frames
}

fn configure<'a>(c: &'a mut Criterion, name: &str) -> BenchmarkGroup<'a, WallTime> {
    let mut group = c.benchmark_group(name);
    group
        .sample_size(20)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    group
}

fn encode(c: &mut Criterion) {
    let mut group = configure(c, "codec/encode");
    for (name, parameter, throughput, frame) in frames() {
        group.throughput(throughput);
        let mut codec = FrameCodec::new();
        let mut dst = BytesMut::with_capacity(HEADER_LEN + frame.payload.len());
        group.bench_function(BenchmarkId::new(name, &parameter), |b| {
            b.iter(|| {
                dst.clear();
                codec.encode(frame.clone(), &mut dst).expect("encodable");
                black_box(&dst);
            })
        });
        if frame.header.kind == Kind::Data {
            let header = frame.header.to_bytes();
            group.bench_function(BenchmarkId::new("copy", &parameter), |b| {
                b.iter(|| {
                    dst.clear();
                    dst.extend_from_slice(black_box(&header));
                    dst.extend_from_slice(black_box(&frame.payload));
                    black_box(&dst);
                })
            });
        }
    }
    group.finish();
}

fn decode(c: &mut Criterion) {
    let mut group = configure(c, "codec/decode");
    for (name, parameter, throughput, frame) in frames() {
        group.throughput(throughput);
        let mut wire = BytesMut::new();
        FrameCodec::new()
            .encode(frame, &mut wire)
            .expect("encodable");
        let mut codec = FrameCodec::new();
        group.bench_function(BenchmarkId::new(name, &parameter), |b| {
            // Each input is a fresh copy of the wire bytes, made outside the timed part.
            b.iter_batched_ref(
                || wire.clone(),
                |src| black_box(codec.decode(src).expect("valid").expect("a whole frame")),
                BatchSize::SmallInput,
            )
        });
    }
    group.finish();
}

criterion_group!(benches, encode, decode);
criterion_main!(benches);
