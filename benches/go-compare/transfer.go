package main

// The speed tool's transfer: K streams at once, each carrying its share of the content one way.

import (
	"flag"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"time"
)

// readSize is the receiver's buffer, as in the Rust modes and the Go peer's.
const readSize = 64 * 1024

// How long a role waits, once its figures are printed, for the peer to end the session.
const endLimit = 10 * time.Second

// outcome is one stream's digest, or why it failed.
type outcome struct {
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
func sendAll(m session, p *payload, streams int) (sendResult, error) {
	outcomes := make(chan outcome, streams)
	start := time.Now()
	for i := 0; i < streams; i++ {
		s, err := m.open()
		if err != nil {
			return sendResult{}, fmt.Errorf("opening stream %d of %d: %w", i+1, streams, err)
		}
		go func(i int, s stream) {
			d, err := sendStream(s, p, i, streams)
			outcomes <- outcome{d, err}
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

func sendStream(s stream, p *payload, index, streams int) (digest, error) {
	origin, length := p.span(index, streams)
	c := newChecksum()
	for sent := uint64(0); sent < length; {
		piece := p.piece(origin, length, sent)
		c.update(piece)
		if _, err := s.Write(piece); err != nil {
			return digest{}, fmt.Errorf("stream %d: writing: %w", index, err)
		}
		sent += uint64(len(piece))
	}
	if err := s.closeWrite(); err != nil {
		return digest{}, fmt.Errorf("stream %d: half-closing: %w", index, err)
	}
	// The receiver answers nothing and closes the stream once it has read all of it: only then
	// is the content delivered, and may the session be closed.
	var one [1]byte
	if n, err := s.Read(one[:]); n > 0 || err != io.EOF {
		return digest{}, fmt.Errorf("stream %d: waiting for the receiver's close: got %d bytes, %v", index, n, err)
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
func receiveAll(m session, streams int, progress *int64) (receiveResult, error) {
	// Every reader's buffer is allocated up front, so that it is not zeroed while timed.
	bufs := make([]byte, streams*readSize)
	outcomes := make(chan outcome, streams)
	var start time.Time
	for i := 0; i < streams; i++ {
		s, err := m.accept()
		if err != nil {
			return receiveResult{}, fmt.Errorf("accepting stream %d of %d: %w", i+1, streams, err)
		}
		if i == 0 {
			start = time.Now()
		}
		buf := bufs[i*readSize : (i+1)*readSize : (i+1)*readSize]
		go func(s stream) {
			d, err := receiveStream(s, buf, progress)
			outcomes <- outcome{d, err}
			if err == nil {
				// Tells the sender that all of it arrived.
				s.close()
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

func receiveStream(s stream, buf []byte, progress *int64) (digest, error) {
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

// waitEnd waits until the peer has closed the session (or the connection has gone), so that
// a role does not close the connection under frames it still owes the peer. Gives up after
// limit: the run's figures are printed by then. Accepting is the wait: both multiplexers fail
// an accept once the connection ends, where smux's CloseChan waits for a Close of this end.
func waitEnd(m session, limit time.Duration) {
	done := make(chan struct{})
	go func() {
		for {
			s, err := m.accept()
			if err != nil {
				break
			}
			s.close()
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(limit):
	}
	m.close()
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

// parseFlags parses args into a flag set made by define, rejects positional leftovers and an
// unknown multiplexer.
func parseFlags(mux, mode string, args []string, define func(fs *flag.FlagSet)) error {
	if _, ok := muxes[mux]; !ok {
		return fmt.Errorf("unknown multiplexer %q (%s)", mux, muxNames)
	}
	fs := flag.NewFlagSet("gomux-go-compare "+mux+" "+mode, flag.ContinueOnError)
	fs.SetOutput(os.Stderr)
	define(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return nil
}

func benchSend(mux string, args []string) error {
	var e end
	var content contentFlags
	err := parseFlags(mux, "send", args, func(fs *flag.FlagSet) {
		e.register(fs, false)
		content.register(fs)
	})
	if err != nil {
		return err
	}
	if err := e.check(); err != nil {
		return err
	}
	p, err := content.payload()
	if err != nil {
		return err
	}
	m, err := e.session(mux)
	if err != nil {
		return err
	}
	r, err := sendAll(m, p, content.streams)
	if err != nil {
		return err
	}
	printSent(r)
	m.close()
	return nil
}

func benchReceive(mux string, args []string) error {
	var e end
	var content contentFlags
	var interval time.Duration
	err := parseFlags(mux, "receive", args, func(fs *flag.FlagSet) {
		e.register(fs, true)
		content.register(fs)
		fs.DurationVar(&interval, "progress", 250*time.Millisecond, "print the bytes received so far this often (0: never)")
	})
	if err != nil {
		return err
	}
	if err := e.check(); err != nil {
		return err
	}
	if content.streams < 1 {
		return fmt.Errorf("-streams must be at least 1, not %d", content.streams)
	}
	var progress int64
	stop := make(chan struct{})
	defer close(stop)
	go showProgress(&progress, interval, stop)

	if !e.pair {
		m, err := e.session(mux)
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
	client, server, err := sessionPair(mux)
	if err != nil {
		return err
	}
	sent := make(chan error, 1)
	go func() {
		r, err := sendAll(client, p, content.streams)
		if err == nil {
			printSent(r)
			client.close()
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
