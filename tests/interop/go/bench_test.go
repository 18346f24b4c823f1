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
	{7, 10485773, 4097, 0x4b34e7677ee0acf5},
	{1000, 256 << 20, 64 << 10, 0xc2cd34aee875f627},
	{1, 0, 64 << 10, 0x55cb77ee65a5569d},
	{5, 3, 1, 0x709825964b9ac6ec},
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

// The digest must not depend on how the stream is cut into writes and reads.
func TestChecksumIgnoresCuts(t *testing.T) {
	p := generatedPayload(1<<20, 1<<20)
	content := p.bytes[:200000]
	whole := newChecksum()
	whole.update(content)
	want := whole.finish()
	for _, cut := range []int{1, 7, 63, 64, 65, 1000, 65536} {
		c := newChecksum()
		for at := 0; at < len(content); at += cut {
			end := at + cut
			if end > len(content) {
				end = len(content)
			}
			c.update(content[at:end])
		}
		if got := c.finish(); got != want {
			t.Errorf("cut every %d bytes: %+v, whole: %+v", cut, got, want)
		}
	}
}

func TestParseSize(t *testing.T) {
	good := map[string]uint64{
		"4096": 4096, "64K": 64 << 10, "64k": 64 << 10, "512MiB": 512 << 20, "1G": 1 << 30,
		"1GB": 1 << 30, "2T": 2 << 40, "0": 0,
	}
	for text, want := range good {
		if got, err := parseSize(text); err != nil || got != want {
			t.Errorf("parseSize(%q) = %d, %v; want %d", text, got, err, want)
		}
	}
	for _, text := range []string{"", "K", "1X", "64KK", "-1", "99999999999T"} {
		if got, err := parseSize(text); err == nil {
			t.Errorf("parseSize(%q) = %d, want an error", text, got)
		}
	}
}

// A transfer through Go gomux over loopback delivers what was sent.
func TestTransferPair(t *testing.T) {
	client, server, err := muxPair()
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
		client.Close()
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
}
