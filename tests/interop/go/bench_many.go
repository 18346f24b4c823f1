package main

// examples/many_streams.rs in Go: the same three steps on one session.
//
//  1. Idle: the client opens N streams and the server accepts them; both keep every stream and
//     nobody writes. The growth of the heap in use (after a collection) divided by the stream
//     ends measured is what one idle stream end costs. The resident set's growth is printed
//     beside it; it is the figure the Rust example measures, but Go takes its 64 KiB receive
//     buffers from memory the kernel has not yet handed out, so they do not count there until
//     data is written into them.
//  2. Bulk: one stream carries -bulk bytes beside the idle streams.
//  3. Echo: N more streams each send -bytes bytes to the server, which echoes them; every
//     stream checks its echo.
//
// The server accepts the streams in the order the client opened them (gomux delivers them in
// order), so it knows which step each belongs to.

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/Acebond/gomux"
)

type manyFlags struct {
	streams int
	bytes   int
	bulk    sizeFlag
}

// memory is a reading of the heap in use, after a collection, and of the resident set.
type memory struct {
	heap, resident uint64
}

func readMemory() memory {
	runtime.GC()
	var stats runtime.MemStats
	runtime.ReadMemStats(&stats)
	return memory{heap: stats.HeapAlloc, resident: residentBytes()}
}

// residentBytes is the process's resident set in bytes (Linux), or 0 where it cannot be read.
func residentBytes() uint64 {
	statm, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	fields := strings.Fields(string(statm))
	if len(fields) < 2 {
		return 0
	}
	pages, err := strconv.ParseUint(fields[1], 10, 64)
	if err != nil {
		return 0
	}
	return pages * uint64(os.Getpagesize())
}

// printIdle prints what holding the idle streams cost between before and after, over ends
// stream ends.
func printIdle(streams int, before, after memory, ends int) {
	grew := func(a, b uint64) float64 {
		if b < a {
			return 0
		}
		return float64(b-a) / float64(ends)
	}
	fmt.Printf("idle: %d streams, %.0f bytes per stream end (heap in use; resident set %.0f)\n",
		streams, grew(before.heap, after.heap), grew(before.resident, after.resident))
}

// manyClient is the opening end. ends is how many ends of each stream its memory readings
// cover: 1 when the server is another process, 2 when it runs in this one (-pair).
func manyClient(m *gomux.Mux, f manyFlags, ends int) error {
	n := f.streams
	before := readMemory()
	idle := make([]*gomux.Stream, 0, n)
	for i := 0; i < n; i++ {
		s, err := m.OpenStream()
		if err != nil {
			return fmt.Errorf("opening idle stream %d of %d: %w", i+1, n, err)
		}
		idle = append(idle, s)
	}
	// The server answers this stream after it has accepted all the idle ones (and read its
	// memory), so both ends hold every stream when this returns.
	if err := ping(m); err != nil {
		return fmt.Errorf("settling: %w", err)
	}
	printIdle(n, before, readMemory(), ends*n)

	seconds, err := bulkSend(m, uint64(f.bulk))
	if err != nil {
		return fmt.Errorf("bulk stream: %w", err)
	}
	fmt.Printf("bulk: 1 stream, %d MiB beside %d idle streams in %.0f ms (%.0f MiB/s)\n",
		f.bulk>>20, n, seconds*1e3, float64(f.bulk)/(1<<20)/seconds)

	started := time.Now()
	if err := echoAll(m, n, f.bytes); err != nil {
		return err
	}
	elapsed := time.Since(started)

	for _, s := range idle {
		s.Close()
	}
	fmt.Printf("echo: %d streams x %d bytes in %d ms\n", n, f.bytes, elapsed.Milliseconds())
	closeMux(m)
	return nil
}

// ping opens a stream, half-closes it at once and waits for the server's close.
func ping(m *gomux.Mux) error {
	s, err := m.OpenStream()
	if err != nil {
		return err
	}
	defer s.Close()
	if err := s.CloseWrite(); err != nil {
		return err
	}
	_, err = readToEnd(s, make([]byte, 16))
	return err
}

// bulkSend sends bytes on one new stream in 64 KiB writes, and waits for the server's count of
// what arrived. Returns the seconds taken.
func bulkSend(m *gomux.Mux, total uint64) (float64, error) {
	started := time.Now()
	s, err := m.OpenStream()
	if err != nil {
		return 0, err
	}
	defer s.Close()
	chunk := bytes.Repeat([]byte{0x5a}, 64*1024)
	for left := total; left > 0; {
		n := uint64(len(chunk))
		if left < n {
			n = left
		}
		if _, err := s.Write(chunk[:n]); err != nil {
			return 0, err
		}
		left -= n
	}
	if err := s.CloseWrite(); err != nil {
		return 0, err
	}
	var count [8]byte
	if _, err := readFull(s, count[:]); err != nil {
		return 0, fmt.Errorf("reading the server's count: %w", err)
	}
	if got := binary.LittleEndian.Uint64(count[:]); got != total {
		return 0, fmt.Errorf("delivered %d of %d bytes", got, total)
	}
	return time.Since(started).Seconds(), nil
}

// echoAll opens n streams at once, each sending its own pattern of size bytes, half-closing
// and checking that the same bytes come back.
func echoAll(m *gomux.Mux, n, size int) error {
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func(i int) {
			errs <- echoOne(m, i, size)
		}(i)
	}
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil {
			return err
		}
	}
	return nil
}

func echoOne(m *gomux.Mux, i, size int) error {
	// Each stream sends a different pattern, so a mix-up between streams shows.
	message := make([]byte, size)
	for j := range message {
		message[j] = byte(i + j*7)
	}
	s, err := m.OpenStream()
	if err != nil {
		return fmt.Errorf("echo stream %d: opening: %w", i, err)
	}
	defer s.Close()
	if _, err := s.Write(message); err != nil {
		return fmt.Errorf("echo stream %d: writing: %w", i, err)
	}
	if err := s.CloseWrite(); err != nil {
		return fmt.Errorf("echo stream %d: half-closing: %w", i, err)
	}
	// One byte more than expected, so that an echo that is too long shows.
	back := make([]byte, size+1)
	got, err := readFull(s, back)
	if err != nil {
		return fmt.Errorf("echo stream %d: reading: %w", i, err)
	}
	if !bytes.Equal(back[:got], message) {
		return fmt.Errorf("echo stream %d echoed %d wrong bytes", i, got)
	}
	return nil
}

// readFull reads into buf until buf is full or the stream ends, and returns how much came.
func readFull(s *gomux.Stream, buf []byte) (int, error) {
	total := 0
	for total < len(buf) {
		n, err := s.Read(buf[total:])
		total += n
		if err == io.EOF {
			break
		}
		if err != nil {
			return total, err
		}
	}
	return total, nil
}

// manyServer is the accepting end. measure says whether it reads its own memory (when the
// client is another process).
func manyServer(m *gomux.Mux, f manyFlags, measure bool) error {
	n := f.streams
	var before memory
	if measure {
		before = readMemory()
	}
	held := make([]*gomux.Stream, 0, n)
	for i := 0; i < n; i++ {
		s, err := m.AcceptStream()
		if err != nil {
			return fmt.Errorf("accepting idle stream %d of %d: %w", i+1, n, err)
		}
		held = append(held, s)
	}
	s, err := m.AcceptStream()
	if err != nil {
		return fmt.Errorf("accepting the settling stream: %w", err)
	}
	if _, err := readToEnd(s, make([]byte, 16)); err != nil {
		return fmt.Errorf("settling: %w", err)
	}
	if measure {
		printIdle(n, before, readMemory(), n)
	}
	s.Close()

	s, err = m.AcceptStream()
	if err != nil {
		return fmt.Errorf("accepting the bulk stream: %w", err)
	}
	total, err := readToEnd(s, make([]byte, 256*1024))
	if err != nil {
		return fmt.Errorf("bulk stream: %w", err)
	}
	var count [8]byte
	binary.LittleEndian.PutUint64(count[:], total)
	if _, err := s.Write(count[:]); err != nil {
		return fmt.Errorf("bulk stream: answering: %w", err)
	}
	s.Close()

	var echoes sync.WaitGroup
	for i := 0; i < n; i++ {
		s, err := m.AcceptStream()
		if err != nil {
			return fmt.Errorf("accepting echo stream %d of %d: %w", i+1, n, err)
		}
		echoes.Add(1)
		go func(s *gomux.Stream) {
			defer echoes.Done()
			if echoStream(s, make([]byte, echoBuffer)) == nil {
				s.CloseWrite()
			}
			s.Close()
		}(s)
	}
	echoes.Wait()
	runtime.KeepAlive(held)
	return nil
}

func benchMany(args []string) error {
	fs := newFlagSet("many")
	var end benchEnd
	f := manyFlags{bulk: 64 << 20}
	end.register(fs, true)
	fs.IntVar(&f.streams, "streams", 8192, "idle streams, and echoing streams")
	fs.IntVar(&f.bytes, "bytes", 1024, "bytes each echoing stream sends")
	fs.Var(&f.bulk, "bulk", "bytes the bulk stream carries")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := end.check(); err != nil {
		return err
	}
	if f.streams < 1 || f.bytes < 0 {
		return fmt.Errorf("-streams must be at least 1 and -bytes at least 0")
	}
	if end.pair {
		client, server, err := muxPair()
		if err != nil {
			return err
		}
		served := make(chan error, 1)
		go func() { served <- manyServer(server, f, false) }()
		if err := manyClient(client, f, 2); err != nil {
			return err
		}
		if err := <-served; err != nil {
			return err
		}
		waitEnd(server, endLimit)
		return nil
	}
	m, err := end.mux()
	if err != nil {
		return err
	}
	if end.isServer() {
		if err := manyServer(m, f, true); err != nil {
			return err
		}
		waitEnd(m, endLimit)
		return nil
	}
	return manyClient(m, f, 1)
}
