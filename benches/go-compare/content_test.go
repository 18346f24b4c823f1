package main

import (
	"testing"
)

// Digests printed by the Rust implementation, `cargo run --release --example speed --
// --digest --streams K --bytes N --chunk C`: the Go content and checksum must give the same.
var rustDigests = []struct {
	streams      int
	bytes, chunk uint64
	digest       uint64
}{
	{1, 1 << 20, 64 << 10, 0x43eba606e3279b6a},
	{4, 64 << 20, 64 << 10, 0x2baf4edc4a4d5ca5},
	{3, 1000003, 1000, 0x853e56f3be92a44f},
	{1000, 256 << 20, 64 << 10, 0xc2cd34aee875f627},
}

func TestDigestsMatchRust(t *testing.T) {
	for _, v := range rustDigests {
		p := generatedPayload(v.bytes, v.chunk)
		digests := make([]digest, v.streams)
		for i := range digests {
			digests[i] = p.streamDigest(i, v.streams)
		}
		if got := combine(digests); got != v.digest {
			t.Errorf("%d streams, %d bytes, chunk %d: digest %016x, Rust gives %016x",
				v.streams, v.bytes, v.chunk, got, v.digest)
		}
	}
}

// A transfer through each multiplexer over loopback delivers what was sent, and the receiver's
// close of every stream lets the sender finish.
func TestTransferPair(t *testing.T) {
	for name := range muxes {
		t.Run(name, func(t *testing.T) {
			client, server, err := sessionPair(name)
			if err != nil {
				t.Fatal(err)
			}
			const streams = 5
			p := generatedPayload(8<<20+11, 64<<10)
			sent := make(chan sendResult, 1)
			go func() {
				r, err := sendAll(client, p, streams)
				if err != nil {
					t.Error(err)
				}
				sent <- r
				client.close()
			}()
			var progress int64
			received, err := receiveAll(server, streams, &progress)
			if err != nil {
				t.Fatal(err)
			}
			s := <-sent
			if combine(received.digests) != combine(s.digests) || received.bytes != p.total {
				t.Errorf("received %d bytes, digest %016x; sent %d bytes, digest %016x",
					received.bytes, combine(received.digests), p.total, combine(s.digests))
			}
			waitEnd(server, endLimit)
		})
	}
}
