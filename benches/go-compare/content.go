package main

// The speed tool's content and checksum (examples/speed.rs, benches/support/mod.rs), the same
// bit for bit as tests/interop/go/bench_content.go, of which this is a copy: this module builds
// apart from the interop peer (which builds against the Go gomux source with nothing
// downloaded), so the two cannot share a package. content_test.go checks the digests the Rust
// implementation prints, and the speed tool compares the Go sender's digest with its own on
// every run, so a copy that drifts fails at once.

import (
	"encoding/binary"
	"flag"
	"fmt"
	"math/bits"
	"os"
	"sort"
	"strconv"
	"strings"
)

const (
	// period is the length of the generated block that every write is cut from.
	period = 1 << 20
	// streamSkew is the offset between the generated content of consecutive streams. Odd, so
	// streams are not even word-aligned with each other.
	streamSkew = 40961

	fnvOffset uint64 = 0xcbf29ce484222325
	fnvPrime  uint64 = 0x00000100000001b3

	// The checksum takes 8-byte words into eight independent lanes, so the multiplications
	// overlap; a block is one word per lane.
	lanes = 8
	block = 8 * lanes
)

// digest is what a stream carried: its length and the hash of its bytes in order.
type digest struct {
	len, hash uint64
}

// checksum is a stream's digest in the making. The bytes of a block that straddles two writes
// or reads wait in tail, so the result does not depend on how the stream was cut.
type checksum struct {
	len     uint64
	lanes   [lanes]uint64
	tail    [block]byte
	tailLen int
}

func newChecksum() checksum {
	var c checksum
	for i := range c.lanes {
		c.lanes[i] = fnvOffset ^ uint64(i)
	}
	return c
}

// mix takes in whole blocks; len(p) is a multiple of block. The lanes live in locals during
// the loop so they stay in registers.
func (c *checksum) mix(p []byte) {
	l0, l1, l2, l3 := c.lanes[0], c.lanes[1], c.lanes[2], c.lanes[3]
	l4, l5, l6, l7 := c.lanes[4], c.lanes[5], c.lanes[6], c.lanes[7]
	for len(p) >= block {
		b := p[:block:block]
		l0 = (l0 ^ binary.LittleEndian.Uint64(b[0:])) * fnvPrime
		l1 = (l1 ^ binary.LittleEndian.Uint64(b[8:])) * fnvPrime
		l2 = (l2 ^ binary.LittleEndian.Uint64(b[16:])) * fnvPrime
		l3 = (l3 ^ binary.LittleEndian.Uint64(b[24:])) * fnvPrime
		l4 = (l4 ^ binary.LittleEndian.Uint64(b[32:])) * fnvPrime
		l5 = (l5 ^ binary.LittleEndian.Uint64(b[40:])) * fnvPrime
		l6 = (l6 ^ binary.LittleEndian.Uint64(b[48:])) * fnvPrime
		l7 = (l7 ^ binary.LittleEndian.Uint64(b[56:])) * fnvPrime
		p = p[block:]
	}
	c.lanes = [lanes]uint64{l0, l1, l2, l3, l4, l5, l6, l7}
}

func (c *checksum) update(p []byte) {
	c.len += uint64(len(p))
	if c.tailLen > 0 {
		n := copy(c.tail[c.tailLen:], p)
		c.tailLen += n
		p = p[n:]
		if c.tailLen < block {
			return
		}
		c.mix(c.tail[:])
		c.tailLen = 0
	}
	whole := len(p) - len(p)%block
	c.mix(p[:whole])
	c.tailLen = copy(c.tail[:], p[whole:])
}

func (c *checksum) finish() digest {
	if c.tailLen > 0 {
		// The last partial block is padded with zeros; the length tells it from real zeros.
		var last [block]byte
		copy(last[:], c.tail[:c.tailLen])
		c.mix(last[:])
	}
	hash := c.len
	for _, lane := range c.lanes {
		hash = (hash ^ lane) * fnvPrime
	}
	return digest{c.len, hash}
}

// combine folds the digests of a transfer's streams into one, in sorted order, since streams
// may be accepted in another order than they were opened. The Rust side does the same.
func combine(digests []digest) uint64 {
	sorted := append([]digest(nil), digests...)
	sort.Slice(sorted, func(i, j int) bool {
		if sorted[i].len != sorted[j].len {
			return sorted[i].len < sorted[j].len
		}
		return sorted[i].hash < sorted[j].hash
	})
	hash := fnvOffset
	for _, d := range sorted {
		hash = (hash ^ d.len) * fnvPrime
		hash = (hash ^ d.hash) * fnvPrime
	}
	return hash
}

// payload is what a transfer sends: total bytes split evenly over the streams, cut into writes
// of at most chunk bytes.
type payload struct {
	bytes  []byte
	total  uint64
	chunk  uint64
	cyclic bool
}

// generatedPayload is total bytes of deterministic pseudo-random content (xorshift64*),
// different on every stream: one block of period bytes (and a chunk more, so that a write
// never wraps) made once.
func generatedPayload(total, chunk uint64) *payload {
	words := (period + chunk + 7) / 8
	b := make([]byte, words*8)
	state := uint64(0x9e3779b97f4a7c15)
	for i := uint64(0); i < words; i++ {
		state ^= state >> 12
		state ^= state << 25
		state ^= state >> 27
		binary.LittleEndian.PutUint64(b[i*8:], state*0x2545f4914f6cdd1d)
	}
	return &payload{bytes: b, total: total, chunk: chunk, cyclic: true}
}

// filePayload is the content of a file, as it is.
func filePayload(path string, chunk uint64) (*payload, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return &payload{bytes: b, total: uint64(len(b)), chunk: chunk}, nil
}

// span is where the content of stream (of streams) starts, and its length.
func (p *payload) span(stream, streams int) (origin, length uint64) {
	share := func(k int) uint64 {
		// total × k / streams without overflow, as the Rust side does in 128 bits; the quotient
		// is at most total, so Div64 cannot overflow.
		hi, lo := bits.Mul64(p.total, uint64(k))
		q, _ := bits.Div64(hi, lo, uint64(streams))
		return q
	}
	start, end := share(stream), share(stream+1)
	origin = start
	if p.cyclic {
		origin = (start + uint64(stream)*streamSkew) % period
	}
	return origin, end - start
}

// piece is the next write of a stream whose content starts at origin and is length long, sent
// bytes into it.
func (p *payload) piece(origin, length, sent uint64) []byte {
	at := origin + sent
	if p.cyclic {
		at %= period
	}
	n := length - sent
	if n > p.chunk {
		n = p.chunk
	}
	return p.bytes[at : at+n]
}

// streamDigest is the digest of what stream (of streams) sends, computed without sending it.
func (p *payload) streamDigest(stream, streams int) digest {
	origin, length := p.span(stream, streams)
	c := newChecksum()
	for sent := uint64(0); sent < length; {
		piece := p.piece(origin, length, sent)
		c.update(piece)
		sent += uint64(len(piece))
	}
	return c.finish()
}

// contentFlags are the flags that say what a transfer sends.
type contentFlags struct {
	streams int
	bytes   sizeFlag
	file    string
	chunk   sizeFlag
}

func (f *contentFlags) register(fs *flag.FlagSet) {
	f.bytes = 1 << 30
	f.chunk = 64 << 10
	fs.IntVar(&f.streams, "streams", 1, "streams sent at once")
	fs.Var(&f.bytes, "bytes", "bytes to send over all streams together (sizes like 64K, 512M, 1G)")
	fs.StringVar(&f.file, "file", "", "send this file's content instead of generated content")
	fs.Var(&f.chunk, "chunk", "size of every write")
}

// payload builds what the flags ask for.
func (f *contentFlags) payload() (*payload, error) {
	if f.streams < 1 {
		return nil, fmt.Errorf("-streams must be at least 1, not %d", f.streams)
	}
	if f.chunk < 1 {
		return nil, fmt.Errorf("-chunk must be at least one byte")
	}
	if f.file != "" {
		return filePayload(f.file, uint64(f.chunk))
	}
	return generatedPayload(uint64(f.bytes), uint64(f.chunk)), nil
}

// sizeFlag is a byte count written like the speed tool's: digits, then optionally K, M, G or T
// (powers of 1024), optionally followed by B or iB, in any case.
type sizeFlag uint64

func (s *sizeFlag) String() string { return strconv.FormatUint(uint64(*s), 10) }

func (s *sizeFlag) Set(value string) error {
	n, err := parseSize(value)
	if err != nil {
		return err
	}
	*s = sizeFlag(n)
	return nil
}

func parseSize(value string) (uint64, error) {
	bad := fmt.Errorf("not a size: %s (try 4096, 64K, 512M, 1G)", value)
	text := strings.ToUpper(value)
	if strings.HasSuffix(text, "IB") {
		text = text[:len(text)-2]
	} else if strings.HasSuffix(text, "B") {
		text = text[:len(text)-1]
	}
	digits := strings.TrimRight(text, "KMGT")
	shift := uint(0)
	switch text[len(digits):] {
	case "":
	case "K":
		shift = 10
	case "M":
		shift = 20
	case "G":
		shift = 30
	case "T":
		shift = 40
	default:
		return 0, bad
	}
	n, err := strconv.ParseUint(digits, 10, 64)
	if err != nil || n > (^uint64(0))>>shift {
		return 0, bad
	}
	return n << shift, nil
}
