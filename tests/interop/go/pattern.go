package main

import (
	"encoding/binary"
	"fmt"
)

// pattern is the content every scenario sends: byte p of the stream with seed s is byte p%8
// (little-endian) of the word wordAt(s, p/8). The Rust side of the suite generates and checks
// the same bytes (tests/interop/pattern.rs), so either end can verify what the other sent
// without any exchange of checksums, and a mismatch names its offset.
type pattern struct {
	seed uint64
	pos  uint64
}

// wordAt is SplitMix64's output for the state seed + (w+1) * golden ratio.
func wordAt(seed, w uint64) uint64 {
	z := seed + (w+1)*0x9E3779B97F4A7C15
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
	z = (z ^ (z >> 27)) * 0x94D049BB133111EB
	return z ^ (z >> 31)
}

// fill writes the next len(b) bytes of the pattern into b.
func (p *pattern) fill(b []byte) {
	i := 0
	for i < len(b) {
		if p.pos%8 == 0 && len(b)-i >= 8 {
			binary.LittleEndian.PutUint64(b[i:], wordAt(p.seed, p.pos/8))
			i += 8
			p.pos += 8
			continue
		}
		word := wordAt(p.seed, p.pos/8)
		for shift := p.pos % 8; shift < 8 && i < len(b); shift++ {
			b[i] = byte(word >> (8 * shift))
			i++
			p.pos++
		}
	}
}

// check compares b with the next len(b) bytes of the pattern.
func (p *pattern) check(b []byte) error {
	i := 0
	for i < len(b) {
		if p.pos%8 == 0 && len(b)-i >= 8 && binary.LittleEndian.Uint64(b[i:]) == wordAt(p.seed, p.pos/8) {
			i += 8
			p.pos += 8
			continue
		}
		word := wordAt(p.seed, p.pos/8)
		for shift := p.pos % 8; shift < 8 && i < len(b); shift++ {
			if b[i] != byte(word>>(8*shift)) {
				return fmt.Errorf("byte %d differs from what was sent", p.pos)
			}
			i++
			p.pos++
		}
	}
	return nil
}
