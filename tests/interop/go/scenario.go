package main

// The Go side of the interop scenarios. Each scenario has two actors, the opener (the side
// that opens the streams: the client unless -opens says otherwise) and the acceptor; -who names
// the side that does the scenario's distinctive act (sends the bulk, half-closes first, stops
// reading, closes, reads slowly). The Rust side of the suite (tests/interop/scenarios.rs)
// plays the other actor, with the same content (pattern.go), so both ends check every byte.
//
// After its part, the program prints "done ..." and then ends the session the same way in
// every scenario but session-close: the client waits for a "close" line on stdin (sent once
// both sides are done) and calls Mux.Close; the server waits for the session to end. It exits
// 0 when everything it checked held.

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Acebond/gomux"
)

// Seeds of the content each way; streams of one scenario add their index.
const (
	seedFromOpener   = 0x1000
	seedFromAcceptor = 0x2000
)

// run is one scenario on one session.
type run struct {
	m       *gomux.Mux
	server  bool
	opens   bool  // this side opens the scenario's streams
	actor   bool  // this side is the one -who names
	streams int   // -streams
	size    int64 // -bytes
	chunk   int   // -chunk: bytes per write, 0 for random sizes from 1 B to 200 KiB
	expect  int   // -expect: streams the peer accepts in the backlog scenario
	stdin   *bufio.Scanner
	accepts chan *gomux.Stream
	ended   chan struct{} // closed when AcceptStream fails: the session is over
	endErr  error
}

func scenarioMain(name string, args []string) error {
	fs := flag.NewFlagSet("scenario "+name, flag.ExitOnError)
	var e endpoint
	e.register(fs)
	streams := fs.Int("streams", 1, "streams the scenario opens")
	size := fs.Int64("bytes", 64*1024, "bytes per stream")
	chunk := fs.Int("chunk", 64*1024, "bytes per write; 0 for random sizes from 1 B to 200 KiB")
	opens := fs.String("opens", "client", "which side opens the streams: client, server, go (this program, whatever its role) or peer")
	who := fs.String("who", "opener", "the side that does the scenario's act: opener or acceptor")
	expect := fs.Int("expect", 0, "backlog: how many of the streams the peer accepts")
	fs.Parse(args)

	m, err := e.mux()
	if err != nil {
		return err
	}
	r := &run{
		m:       m,
		server:  e.isServer(),
		streams: *streams,
		size:    *size,
		chunk:   *chunk,
		expect:  *expect,
		stdin:   bufio.NewScanner(os.Stdin),
		accepts: make(chan *gomux.Stream, 1<<14),
		ended:   make(chan struct{}),
	}
	switch *opens {
	case "client":
		r.opens = !r.server
	case "server":
		r.opens = r.server
	case "go":
		r.opens = true
	case "peer":
		r.opens = false
	default:
		return fmt.Errorf("-opens %q: want client, server or go", *opens)
	}
	switch *who {
	case "opener":
		r.actor = r.opens
	case "acceptor":
		r.actor = !r.opens
	default:
		return fmt.Errorf("-who %q: want opener or acceptor", *who)
	}
	go r.acceptLoop()

	scenarios := map[string]func() (string, error){
		"echo":          r.echo,
		"bulk":          r.bulk,
		"half-close":    r.halfClose,
		"close-read":    r.closeRead,
		"stream-close":  r.streamClose,
		"session-close": r.sessionClose,
		"slow-reader":   r.slowReader,
		"backlog":       r.backlog,
		"idle":          r.idle,
		"audit":         r.audit,
		"close-opening": r.closeWhileOpening,
		"unanswered":    r.unanswered,
	}
	scenario, ok := scenarios[name]
	if !ok {
		return fmt.Errorf("unknown scenario %q", name)
	}
	summary, err := scenario()
	if err != nil {
		return err
	}
	fmt.Println("done", summary)
	if name == "session-close" || name == "close-opening" {
		return nil
	}
	if !r.server {
		if err := r.waitLine("close"); err != nil {
			return err
		}
		// Mux.Close reports an error when the peer, having read the CloseMux, closed the
		// connection before Close returned: that is the peer doing its part, not a failure.
		fmt.Println("closed", m.Close())
	}
	<-r.ended
	fmt.Println("ended", r.endErr)
	return nil
}

// acceptLoop hands accepted streams over in order, so that AcceptStream is always being called
// (a Go session stops reading its connection while its accept queue is full).
func (r *run) acceptLoop() {
	for {
		s, err := r.m.AcceptStream()
		if err != nil {
			r.endErr = err
			close(r.ended)
			return
		}
		r.accepts <- s
	}
}

func (r *run) accept() (*gomux.Stream, error) {
	select {
	case s := <-r.accepts:
		return s, nil
	case <-r.ended:
		return nil, fmt.Errorf("session ended while accepting: %v", r.endErr)
	}
}

// waitLine waits for the harness to send the line want on stdin.
func (r *run) waitLine(want string) error {
	if !r.stdin.Scan() {
		return fmt.Errorf("stdin ended before %q", want)
	}
	if got := r.stdin.Text(); got != want {
		return fmt.Errorf("stdin: got %q, want %q", got, want)
	}
	return nil
}

// sizer returns the size of each write: -chunk, or random sizes from 1 B to 200 KiB.
func (r *run) sizer(seed int64) func() int {
	if r.chunk > 0 {
		return func() int { return r.chunk }
	}
	rng := rand.New(rand.NewSource(seed))
	return func() int { return 1 + rng.Intn(200*1024) }
}

// send writes n bytes of p in writes of the sizes next gives.
func send(s *gomux.Stream, p *pattern, n int64, next func() int) error {
	buf := make([]byte, 200*1024)
	for n > 0 {
		k := next()
		if int64(k) > n {
			k = int(n)
		}
		p.fill(buf[:k])
		if _, err := s.Write(buf[:k]); err != nil {
			return fmt.Errorf("write at byte %d: %w", p.pos-uint64(k), err)
		}
		n -= int64(k)
	}
	return nil
}

// receive reads to end-of-stream, checks every byte against p, and returns how many came.
func receive(s *gomux.Stream, p *pattern) (int64, error) {
	buf := make([]byte, 64*1024)
	var total int64
	for {
		n, err := s.Read(buf)
		if n > 0 {
			if cerr := p.check(buf[:n]); cerr != nil {
				return total, cerr
			}
			total += int64(n)
		}
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// receiveExactly reads to end-of-stream and wants exactly n checked bytes.
func receiveExactly(s *gomux.Stream, p *pattern, n int64) error {
	got, err := receive(s, p)
	if err != nil {
		return fmt.Errorf("read after %d of %d bytes: %v", got, n, err)
	}
	if got != n {
		return fmt.Errorf("end of stream after %d bytes, want %d", got, n)
	}
	return nil
}

// exchange sends out bytes and receives in bytes on one stream at once, then half-closes.
// With holdBack > 0 the last holdBack bytes go out only after the peer's end of stream.
func exchange(s *gomux.Stream, outSeed uint64, out int64, inSeed uint64, in int64, holdBack int64) error {
	readDone := make(chan error, 1)
	go func() { readDone <- receiveExactly(s, &pattern{seed: inSeed}, in) }()
	p := &pattern{seed: outSeed}
	fixed := func() int { return 64 * 1024 }
	if err := send(s, p, out-holdBack, fixed); err != nil {
		return err
	}
	var readErr error
	read := false
	if holdBack > 0 {
		readErr, read = <-readDone, true
		if readErr != nil {
			return readErr
		}
		if err := send(s, p, holdBack, fixed); err != nil {
			return fmt.Errorf("after the peer's half-close: %v", err)
		}
	}
	if err := s.CloseWrite(); err != nil {
		return fmt.Errorf("CloseWrite: %v", err)
	}
	if !read {
		readErr = <-readDone
	}
	return readErr
}

// parallel runs f for 0..n-1 at once and returns the first error.
func parallel(n int, f func(i int) error) error {
	errs := make(chan error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if err := f(i); err != nil {
				errs <- fmt.Errorf("stream %d: %v", i, err)
			}
		}(i)
	}
	wg.Wait()
	close(errs)
	return <-errs
}

// echoBack copies a stream back to its sender until end-of-stream, then half-closes.
func echoBack(s *gomux.Stream) (int64, error) {
	n, err := io.CopyBuffer(s, s, make([]byte, 64*1024))
	if err != nil {
		return n, fmt.Errorf("echo: %v", err)
	}
	return n, s.CloseWrite()
}

// echoOpen opens a stream, sends size bytes of its pattern, and checks they come back.
func (r *run) echoOpen(i int, size int64) error {
	s, err := r.m.OpenStream()
	if err != nil {
		return fmt.Errorf("OpenStream: %v", err)
	}
	seed := uint64(seedFromOpener + i)
	if err := exchange2(s, seed, size, r.sizer(int64(i))); err != nil {
		return err
	}
	return s.Close()
}

// exchange2 sends size bytes in writes of the given sizes, half-closes, and checks the echo.
func exchange2(s *gomux.Stream, seed uint64, size int64, next func() int) error {
	writeDone := make(chan error, 1)
	go func() {
		if err := send(s, &pattern{seed: seed}, size, next); err != nil {
			writeDone <- err
			return
		}
		writeDone <- s.CloseWrite()
	}()
	readErr := receiveExactly(s, &pattern{seed: seed}, size)
	if err := <-writeDone; err != nil {
		return err
	}
	return readErr
}

// echo: the opener sends -bytes on each of -streams streams and checks the echo.
func (r *run) echo() (string, error) {
	if r.opens {
		err := parallel(r.streams, func(i int) error { return r.echoOpen(i, r.size) })
		return fmt.Sprintf("%d streams x %d bytes echoed and checked", r.streams, r.size), err
	}
	var total int64
	var mu sync.Mutex
	err := parallel(r.streams, func(int) error {
		s, err := r.accept()
		if err != nil {
			return err
		}
		n, err := echoBack(s)
		mu.Lock()
		total += n
		mu.Unlock()
		return err
	})
	return fmt.Sprintf("echoed %d streams, %d bytes", r.streams, total), err
}

// stream returns the scenario's one stream: opened or accepted.
func (r *run) stream() (*gomux.Stream, error) {
	if r.opens {
		return r.m.OpenStream()
	}
	return r.accept()
}

// seeds returns the seed of what this side sends and of what it receives.
func (r *run) seeds() (out, in uint64) {
	if r.opens {
		return seedFromOpener, seedFromAcceptor
	}
	return seedFromAcceptor, seedFromOpener
}

// bulk: -who sends -bytes on one stream; the other checks them.
func (r *run) bulk() (string, error) {
	s, err := r.stream()
	if err != nil {
		return "", err
	}
	out, in := r.seeds()
	start := time.Now()
	if r.actor {
		err = exchange(s, out, r.size, in, 0, 0)
	} else {
		err = exchange(s, out, 0, in, r.size, 0)
	}
	if err != nil {
		return "", err
	}
	secs := time.Since(start).Seconds()
	what := "received and checked"
	if r.actor {
		what = "sent"
	}
	return fmt.Sprintf("%d bytes %s in %.2f s (%.0f MiB/s)", r.size, what, secs, float64(r.size)/secs/(1<<20)), s.Close()
}

// halfClose: -who sends -bytes and half-closes at once; the other sends half of its -bytes,
// reads to the end, and only then sends the other half and half-closes.
func (r *run) halfClose() (string, error) {
	s, err := r.stream()
	if err != nil {
		return "", err
	}
	out, in := r.seeds()
	holdBack := int64(0)
	if !r.actor {
		holdBack = r.size / 2
	}
	if err := exchange(s, out, r.size, in, r.size, holdBack); err != nil {
		return "", err
	}
	return fmt.Sprintf("%d bytes each way, %d of them sent after the peer's half-close", r.size, holdBack), s.Close()
}

// closeRead: -who reads 256 KiB, stops reading (CloseRead), then sends -bytes and half-closes;
// the other writes until its write fails, then reads those bytes.
func (r *run) closeRead() (string, error) {
	s, err := r.stream()
	if err != nil {
		return "", err
	}
	out, in := r.seeds()
	const before = 256 * 1024
	if r.actor {
		buf := make([]byte, before)
		if _, err := io.ReadFull(s, buf); err != nil {
			return "", fmt.Errorf("reading the first %d bytes: %v", before, err)
		}
		p := &pattern{seed: in}
		if err := p.check(buf); err != nil {
			return "", err
		}
		if err := s.CloseRead(); err != nil {
			return "", fmt.Errorf("CloseRead: %v", err)
		}
		// Go's streams still hand out what arrived before the peer learnt of the CloseRead:
		// at most the credit this side granted (one 64 KiB window), the continuation of what
		// was read. Reads after CloseRead return at once, so this takes what is here now.
		late := 0
		for {
			n, err := s.Read(buf)
			if err := p.check(buf[:n]); err != nil {
				return "", fmt.Errorf("data in flight at CloseRead: %v", err)
			}
			late += n
			if err != nil || n == 0 {
				break
			}
		}
		if late > 64*1024 {
			return "", fmt.Errorf("%d bytes arrived after CloseRead, more than the credit granted", late)
		}
		if err := send(s, &pattern{seed: out}, r.size, func() int { return 64 * 1024 }); err != nil {
			return "", fmt.Errorf("after CloseRead: %v", err)
		}
		if err := s.CloseWrite(); err != nil {
			return "", fmt.Errorf("CloseWrite: %v", err)
		}
		return fmt.Sprintf("read %d bytes, closed reading (%d more were in flight), sent %d", before, late, r.size), nil
	}
	p := &pattern{seed: out}
	err = send(s, p, 1<<40, func() int { return 64 * 1024 })
	if !errors.Is(err, gomux.ErrWriteClosed) {
		return "", fmt.Errorf("writing after the peer stopped reading: want ErrWriteClosed, got %v", err)
	}
	if p.pos < before {
		return "", fmt.Errorf("the write failed after %d bytes, before the peer read %d", p.pos, before)
	}
	if err := receiveExactly(s, &pattern{seed: in}, r.size); err != nil {
		return "", err
	}
	return fmt.Sprintf("write failed with %q after %d bytes; then read %d bytes", gomux.ErrWriteClosed, p.pos, r.size), s.Close()
}

// flow is what continuous saw: the bytes read and written, and the errors that ended them.
type flow struct {
	read, written     int64
	readErr, writeErr error
}

// continuous writes and reads on s at once until each fails or ends, calling progress with the
// bytes read so far after every read.
func continuous(s *gomux.Stream, out, in uint64, progress func(int64)) flow {
	var f flow
	done := make(chan struct{})
	go func() {
		defer close(done)
		p := &pattern{seed: out}
		buf := make([]byte, 64*1024)
		for {
			p.fill(buf)
			n, err := s.Write(buf)
			f.written += int64(n)
			if err != nil {
				f.writeErr = err
				return
			}
		}
	}()
	p := &pattern{seed: in}
	buf := make([]byte, 64*1024)
	for {
		n, err := s.Read(buf)
		if n > 0 {
			if cerr := p.check(buf[:n]); cerr != nil {
				f.readErr = cerr
				break
			}
			f.read += int64(n)
			if progress != nil {
				progress(f.read)
			}
		}
		if err != nil {
			f.readErr = err
			break
		}
	}
	<-done
	return f
}

// streamClose: both sides send and receive on a stream at once; once -who has read 1 MiB it
// closes the stream. The other's write must fail and its read end; then a new stream echoes.
func (r *run) streamClose() (string, error) {
	s, err := r.stream()
	if err != nil {
		return "", err
	}
	out, in := r.seeds()
	var summary string
	if r.actor {
		closed := false
		f := continuous(s, out, in, func(read int64) {
			if read >= 1<<20 && !closed {
				closed = true
				s.Close()
			}
		})
		if !errors.Is(f.readErr, gomux.ErrClosedStream) || !errors.Is(f.writeErr, gomux.ErrClosedStream) {
			return "", fmt.Errorf("after Close: read error %v, write error %v; want %v", f.readErr, f.writeErr, gomux.ErrClosedStream)
		}
		summary = fmt.Sprintf("closed the stream after reading %d bytes", f.read)
	} else {
		f := continuous(s, out, in, nil)
		if f.readErr != io.EOF || !errors.Is(f.writeErr, gomux.ErrPeerClosedStream) {
			return "", fmt.Errorf("after the peer's close: read error %v (want EOF), write error %v (want %v)", f.readErr, f.writeErr, gomux.ErrPeerClosedStream)
		}
		summary = fmt.Sprintf("peer closed the stream: read %d bytes then EOF, write failed after %d bytes", f.read, f.written)
	}
	// The session still works.
	if r.opens {
		err = r.echoOpen(1, 64*1024)
	} else {
		var next *gomux.Stream
		if next, err = r.accept(); err == nil {
			_, err = echoBack(next)
		}
	}
	if err != nil {
		return "", fmt.Errorf("a new stream after the close: %v", err)
	}
	return summary + "; a new stream then echoed 65536 bytes", nil
}

// sessionClose: -streams streams send and receive at once; once -who has read 1 MiB on every
// stream, it closes the session. Every stream on both sides must then end.
func (r *run) sessionClose() (string, error) {
	out, in := r.seeds()
	var ready sync.WaitGroup
	ready.Add(r.streams)
	flows := make([]flow, r.streams)
	var wg sync.WaitGroup
	for i := 0; i < r.streams; i++ {
		s, err := r.stream()
		if err != nil {
			return "", err
		}
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			counted := false
			flows[i] = continuous(s, out+uint64(i), in+uint64(i), func(read int64) {
				if read >= 1<<20 && !counted {
					counted = true
					ready.Done()
				}
			})
			if !counted {
				ready.Done()
			}
		}(i)
	}
	closeErr := "not called"
	if r.actor {
		ready.Wait()
		closeErr = fmt.Sprint(r.m.Close())
	}
	wg.Wait()
	<-r.ended
	var read, written int64
	for _, f := range flows {
		read += f.read
		written += f.written
		if f.readErr == nil || f.writeErr == nil {
			return "", fmt.Errorf("a stream did not end with the session: %+v", f)
		}
	}
	return fmt.Sprintf("Mux.Close: %s; session ended with %q; %d streams ended after %d bytes read, %d written",
		closeErr, fmt.Sprint(r.endErr), r.streams, read, written), nil
}

// slowReader: stream A carries -bytes towards -who, which reads nothing of it until stream B
// has echoed 1 MiB, then reads it 16 KiB at a time with a pause after each read.
func (r *run) slowReader() (string, error) {
	const echoBytes = 1 << 20
	out, in := r.seeds()
	bDone := make(chan error, 1)
	var a *gomux.Stream
	if r.opens {
		var err error
		if a, err = r.m.OpenStream(); err != nil {
			return "", err
		}
		if _, err := a.Write([]byte{'A'}); err != nil {
			return "", err
		}
		go func() {
			b, err := r.m.OpenStream()
			if err == nil {
				if _, err = b.Write([]byte{'B'}); err == nil {
					err = exchange2(b, seedFromOpener+7, echoBytes, func() int { return 64 * 1024 })
				}
			}
			bDone <- err
		}()
	} else {
		for i := 0; i < 2; i++ {
			s, err := r.accept()
			if err != nil {
				return "", err
			}
			tag := make([]byte, 1)
			if _, err := io.ReadFull(s, tag); err != nil {
				return "", fmt.Errorf("reading the tag: %v", err)
			}
			if tag[0] == 'A' {
				a = s
			} else {
				go func() {
					_, err := echoBack(s)
					bDone <- err
				}()
			}
		}
	}
	if a == nil {
		return "", errors.New("no stream tagged A")
	}
	if !r.actor {
		if err := exchange(a, out, r.size, in, 0, 0); err != nil {
			return "", err
		}
		if err := <-bDone; err != nil {
			return "", fmt.Errorf("stream B: %v", err)
		}
		return fmt.Sprintf("sent %d bytes to a slow reader; stream B echoed %d bytes meanwhile", r.size, echoBytes), nil
	}
	if err := <-bDone; err != nil {
		return "", fmt.Errorf("stream B, while stream A was not read: %v", err)
	}
	p := &pattern{seed: in}
	buf := make([]byte, 16*1024)
	var got int64
	for {
		n, err := a.Read(buf)
		if cerr := p.check(buf[:n]); cerr != nil {
			return "", cerr
		}
		got += int64(n)
		if err == io.EOF {
			break
		}
		if err != nil {
			return "", fmt.Errorf("slow read after %d bytes: %v", got, err)
		}
		time.Sleep(time.Millisecond)
	}
	if got != r.size {
		return "", fmt.Errorf("slow reader got %d bytes, want %d", got, r.size)
	}
	if err := a.CloseWrite(); err != nil {
		return "", err
	}
	return fmt.Sprintf("stream B echoed %d bytes while A was unread; then read %d bytes slowly", echoBytes, got), nil
}

// backlog: this side opens -streams streams at once, sends 1 KiB on each and half-closes it;
// the peer accepts -expect of them (its backlog) and refuses the rest with CloseStream.
func (r *run) backlog() (string, error) {
	const size = 1024
	streams := make([]*gomux.Stream, r.streams)
	for i := range streams {
		var err error
		if streams[i], err = r.m.OpenStream(); err != nil {
			return "", err
		}
	}
	var echoed, refused atomic.Int64
	err := parallel(r.streams, func(i int) error {
		s := streams[i]
		seed := uint64(seedFromOpener + i)
		writeErr := send(s, &pattern{seed: seed}, size, func() int { return size })
		if writeErr == nil {
			writeErr = s.CloseWrite()
		}
		got, readErr := receive(s, &pattern{seed: seed})
		switch {
		case readErr == nil && got == size && writeErr == nil:
			echoed.Add(1)
		case readErr == nil && got == 0 && (writeErr == nil || errors.Is(writeErr, gomux.ErrPeerClosedStream)):
			refused.Add(1)
		default:
			return fmt.Errorf("neither echoed nor refused: read %d bytes (%v), write error %v", got, readErr, writeErr)
		}
		return s.Close()
	})
	if err != nil {
		return "", err
	}
	if int(echoed.Load()) != r.expect || int(refused.Load()) != r.streams-r.expect {
		return "", fmt.Errorf("%d streams echoed and %d refused, want %d and %d", echoed.Load(), refused.Load(), r.expect, r.streams-r.expect)
	}
	return fmt.Sprintf("opened %d streams: %d echoed, %d refused with CloseStream", r.streams, echoed.Load(), refused.Load()), nil
}

// idle: a stream echoes 1 KiB, the session idles until the harness says "continue" (the Rust
// side has sent keepalives meanwhile), then a second stream echoes 1 KiB.
func (r *run) idle() (string, error) {
	for i := 0; i < 2; i++ {
		if i == 1 && r.opens {
			if err := r.waitLine("continue"); err != nil {
				return "", err
			}
		}
		if r.opens {
			if err := r.echoOpen(i, 1024); err != nil {
				return "", err
			}
			continue
		}
		s, err := r.accept()
		if err != nil {
			return "", err
		}
		if _, err := echoBack(s); err != nil {
			return "", err
		}
	}
	return "a stream echoed before and after the idle time", nil
}

// audit: stream 0 carries -bytes each way at once, beside -streams echo streams of 1 MiB; the
// suite's relay checks the credit on the wire.
func (r *run) audit() (string, error) {
	s, err := r.stream()
	if err != nil {
		return "", err
	}
	out, in := r.seeds()
	bulk := make(chan error, 1)
	go func() { bulk <- exchange(s, out, r.size, in, r.size, 0) }()
	const echoBytes = 1 << 20
	if r.opens {
		err = parallel(r.streams, func(i int) error { return r.echoOpen(i+1, echoBytes) })
	} else {
		err = parallel(r.streams, func(int) error {
			s, err := r.accept()
			if err == nil {
				_, err = echoBack(s)
			}
			return err
		})
	}
	if err != nil {
		return "", err
	}
	if err := <-bulk; err != nil {
		return "", fmt.Errorf("bulk stream: %v", err)
	}
	return fmt.Sprintf("%d bytes each way on one stream beside %d streams echoing %d bytes", r.size, r.streams, echoBytes), nil
}

// closeWhileOpening: the peer opens streams without pause, sending 1 KiB on each; this side
// accepts -streams of them, then closes the session.
func (r *run) closeWhileOpening() (string, error) {
	for i := 0; i < r.streams; i++ {
		if _, err := r.accept(); err != nil {
			return "", err
		}
	}
	closeErr := r.m.Close()
	<-r.ended
	return fmt.Sprintf("accepted %d streams, then Mux.Close: %v", r.streams, closeErr), nil
}

// unanswered: the peer opens -streams streams and writes a request on each; this side accepts
// each and closes it at once, reading and writing nothing. That is an ordinary close, which
// may follow a handled request: the peer must read it as an end of stream, never as a
// refusal that would invite a retry. A last stream is echoed.
func (r *run) unanswered() (string, error) {
	for i := 0; i < r.streams; i++ {
		s, err := r.accept()
		if err != nil {
			return "", err
		}
		if err := s.Close(); err != nil {
			return "", err
		}
	}
	// The session still works.
	next, err := r.accept()
	if err == nil {
		_, err = echoBack(next)
	}
	if err != nil {
		return "", fmt.Errorf("a new stream after the closes: %v", err)
	}
	return fmt.Sprintf("accepted %d streams and closed each unanswered; then echoed one", r.streams), nil
}
