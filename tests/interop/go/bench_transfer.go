package main

// The speed tool's transfer: K streams at once, each carrying its share of the content one way.

import (
	"fmt"
	"io"
	"sync/atomic"
	"time"

	"github.com/Acebond/gomux"
)

// How long a role waits, once its figures are printed, for the peer to end the session.
const endLimit = 10 * time.Second

// streamOutcome is one stream's digest, or why it failed.
type streamOutcome struct {
	digest digest
	err    error
}

// sendResult is what the sending end saw.
type sendResult struct {
	digests []digest
	elapsed time.Duration
}

// sendAll opens streams one after the other on m, each writing its share of p as soon as it is
// open and half-closing, and waits until the receiver has closed every stream, which it does
// once it has read it to its end.
func sendAll(m *gomux.Mux, p *payload, streams int) (sendResult, error) {
	outcomes := make(chan streamOutcome, streams)
	start := time.Now()
	for i := 0; i < streams; i++ {
		s, err := m.OpenStream()
		if err != nil {
			return sendResult{}, fmt.Errorf("opening stream %d of %d: %w", i+1, streams, err)
		}
		go func(i int, s *gomux.Stream) {
			d, err := sendStream(s, p, i, streams)
			outcomes <- streamOutcome{d, err}
		}(i, s)
	}
	digests := make([]digest, 0, streams)
	for i := 0; i < streams; i++ {
		o := <-outcomes
		if o.err != nil {
			return sendResult{}, o.err
		}
		digests = append(digests, o.digest)
	}
	return sendResult{digests, time.Since(start)}, nil
}

func sendStream(s *gomux.Stream, p *payload, stream, streams int) (digest, error) {
	origin, length := p.span(stream, streams)
	c := newChecksum()
	for sent := uint64(0); sent < length; {
		piece := p.piece(origin, length, sent)
		c.update(piece)
		if _, err := s.Write(piece); err != nil {
			return digest{}, fmt.Errorf("stream %d: writing: %w", stream, err)
		}
		sent += uint64(len(piece))
	}
	if err := s.CloseWrite(); err != nil {
		return digest{}, fmt.Errorf("stream %d: half-closing: %w", stream, err)
	}
	// The receiver answers nothing and closes the stream once it has read all of it: only then
	// is the content delivered, and may the session be closed.
	var one [1]byte
	if n, err := s.Read(one[:]); n > 0 || err != io.EOF {
		return digest{}, fmt.Errorf("stream %d: waiting for the receiver's close: got %d bytes, %v", stream, n, err)
	}
	return c.finish(), nil
}

// receiveResult is what the receiving end saw.
type receiveResult struct {
	digests []digest
	bytes   uint64
	elapsed time.Duration
}

// receiveAll accepts streams on m and reads each to its end into a 64 KiB buffer, adding what it
// reads to progress. The time runs from the first accept to the last byte read.
func receiveAll(m *gomux.Mux, streams int, progress *int64) (receiveResult, error) {
	// Every reader's buffer is allocated up front: a thousand readers do not zero 64 MiB
	// while they are being timed.
	bufs := make([]byte, streams*readSize)
	outcomes := make(chan streamOutcome, streams)
	var start time.Time
	for i := 0; i < streams; i++ {
		s, err := m.AcceptStream()
		if err != nil {
			return receiveResult{}, fmt.Errorf("accepting stream %d of %d: %w", i+1, streams, err)
		}
		if i == 0 {
			start = time.Now()
		}
		buf := bufs[i*readSize : (i+1)*readSize : (i+1)*readSize]
		go func(s *gomux.Stream) {
			d, err := receiveStream(s, buf, progress)
			outcomes <- streamOutcome{d, err}
			if err == nil {
				// Tells the sender that all of it arrived.
				s.Close()
			}
		}(s)
	}
	result := receiveResult{digests: make([]digest, 0, streams)}
	for i := 0; i < streams; i++ {
		o := <-outcomes
		if o.err != nil {
			return receiveResult{}, o.err
		}
		result.digests = append(result.digests, o.digest)
		result.bytes += o.digest.len
	}
	result.elapsed = time.Since(start)
	return result, nil
}

func receiveStream(s *gomux.Stream, buf []byte, progress *int64) (digest, error) {
	c := newChecksum()
	for {
		n, err := s.Read(buf)
		if n > 0 {
			c.update(buf[:n])
			atomic.AddInt64(progress, int64(n))
		}
		if err == io.EOF {
			return c.finish(), nil
		}
		if err != nil {
			return digest{}, fmt.Errorf("reading after %d bytes: %w", c.len, err)
		}
	}
}

// showProgress prints the bytes received so far every interval, until stop is closed.
func showProgress(progress *int64, interval time.Duration, stop <-chan struct{}) {
	if interval <= 0 {
		return
	}
	tick := time.NewTicker(interval)
	defer tick.Stop()
	for {
		select {
		case <-stop:
			return
		case <-tick.C:
			fmt.Println("progress", atomic.LoadInt64(progress))
		}
	}
}

func printSent(r sendResult) {
	var total uint64
	for _, d := range r.digests {
		total += d.len
	}
	fmt.Printf("sent streams=%d bytes=%d seconds=%.6f digest=%016x\n",
		len(r.digests), total, r.elapsed.Seconds(), combine(r.digests))
}

func printReceived(r receiveResult) {
	fmt.Printf("received streams=%d bytes=%d seconds=%.6f digest=%016x\n",
		len(r.digests), r.bytes, r.elapsed.Seconds(), combine(r.digests))
}

func benchSend(args []string) error {
	fs := newFlagSet("send")
	var end benchEnd
	var content contentFlags
	end.register(fs, false)
	content.register(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	p, err := content.payload()
	if err != nil {
		return err
	}
	m, err := end.mux()
	if err != nil {
		return err
	}
	r, err := sendAll(m, p, content.streams)
	if err != nil {
		return err
	}
	printSent(r)
	closeMux(m)
	return nil
}

func benchReceive(args []string) error {
	fs := newFlagSet("receive")
	var end benchEnd
	var content contentFlags
	var interval time.Duration
	end.register(fs, true)
	content.register(fs)
	fs.DurationVar(&interval, "progress", 250*time.Millisecond, "print the bytes received so far this often (0: never)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := end.check(); err != nil {
		return err
	}
	if content.streams < 1 {
		return fmt.Errorf("-streams must be at least 1, not %d", content.streams)
	}
	var progress int64
	stop := make(chan struct{})
	defer close(stop)
	go showProgress(&progress, interval, stop)

	if !end.pair {
		m, err := end.mux()
		if err != nil {
			return err
		}
		r, err := receiveAll(m, content.streams, &progress)
		if err != nil {
			return err
		}
		printReceived(r)
		waitEnd(m, endLimit)
		return nil
	}

	p, err := content.payload()
	if err != nil {
		return err
	}
	client, server, err := muxPair()
	if err != nil {
		return err
	}
	sent := make(chan error, 1)
	go func() {
		r, err := sendAll(client, p, content.streams)
		if err == nil {
			printSent(r)
			closeMux(client)
		}
		sent <- err
	}()
	r, err := receiveAll(server, content.streams, &progress)
	if err != nil {
		return err
	}
	printReceived(r)
	if err := <-sent; err != nil {
		return err
	}
	waitEnd(server, endLimit)
	return nil
}
