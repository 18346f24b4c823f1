package main

// Fault roles: Go gomux doing what makes its known faults show, one run per process, for
// examples/go_faults.rs, which plays the other end, bounds each run in time and tells how it
// ended (the crate docs, "Talking to Go gomux", give the counts).
//
//	fault write        (-connect ADDR | -listen ADDR) [-streams N]
//	fault write-close  (-connect ADDR | -listen ADDR) [-streams N] [-delay MS]
//	fault accept       (-listen ADDR | -connect ADDR)
//	fault accept-close (-listen ADDR | -connect ADDR) [-accept=false] [-delay MS]
//	fault send-close   (-connect ADDR | -listen ADDR) [-bytes N]
//
// write opens N streams, each writing 64 KiB writes until Write fails (the peer ends the
// session), then calls Mux.Close; write-close does the same but calls Mux.Close itself MS
// milliseconds after the start. accept accepts streams and reads each to its end until
// AcceptStream fails, then calls Mux.Close; accept-close calls Mux.Close MS milliseconds after
// the start (with -accept=false it accepts nothing), then waits 200 ms, long enough for a
// session reader that sends on the closed accept channel to crash the program. send-close opens
// one stream, writes N bytes in one Write, closes the stream and at once the session.
//
// Each prints "done ..." and exits 0 when every call it made returned. A run whose Go session
// deadlocks never gets there: the caller sends SIGQUIT, and the goroutine dump on stderr shows
// where it hung. A crash exits 2 with the panic on stderr.

import (
	"flag"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"
)

func faultMain(mode string, args []string) error {
	fs := flag.NewFlagSet("fault "+mode, flag.ExitOnError)
	var e endpoint
	e.register(fs)
	streams := fs.Int("streams", 1, "write, write-close: streams writing")
	delay := fs.Int("delay", 100, "write-close, accept-close: milliseconds from the start to Mux.Close")
	accept := fs.Bool("accept", true, "accept-close: accept and read the streams")
	size := fs.Int("bytes", 1<<20, "send-close: bytes written")
	fs.Parse(args)
	switch mode {
	case "write", "write-close", "accept", "accept-close", "send-close":
	default:
		return fmt.Errorf("unknown fault mode %q", mode)
	}

	m, err := e.mux()
	if err != nil {
		return err
	}
	start := time.Now()
	sleepUntil := func(ms int) { time.Sleep(time.Until(start.Add(time.Duration(ms) * time.Millisecond))) }
	switch mode {
	case "write", "write-close":
		var written int64
		var wg sync.WaitGroup
		buf := make([]byte, 64*1024)
		for i := 0; i < *streams; i++ {
			s, err := m.OpenStream()
			if err != nil {
				return err
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					n, err := s.Write(buf)
					atomic.AddInt64(&written, int64(n))
					if err != nil {
						return
					}
				}
			}()
		}
		if mode == "write-close" {
			sleepUntil(*delay)
			m.Close()
			wg.Wait()
		} else {
			wg.Wait()
			m.Close()
		}
		fmt.Printf("done written=%d\n", atomic.LoadInt64(&written))
	case "accept", "accept-close":
		var accepted int64
		acceptDone := make(chan struct{})
		go func() {
			defer close(acceptDone)
			if mode == "accept-close" && !*accept {
				return
			}
			for {
				s, err := m.AcceptStream()
				if err != nil {
					return
				}
				atomic.AddInt64(&accepted, 1)
				go func() {
					io.Copy(io.Discard, s)
					s.Close()
				}()
			}
		}()
		if mode == "accept-close" {
			sleepUntil(*delay)
		} else {
			<-acceptDone
		}
		m.Close()
		time.Sleep(200 * time.Millisecond)
		fmt.Printf("done accepted=%d\n", atomic.LoadInt64(&accepted))
	case "send-close":
		s, err := m.OpenStream()
		if err != nil {
			return err
		}
		_, werr := s.Write(make([]byte, *size))
		s.Close()
		m.Close()
		fmt.Printf("done write_err=%v\n", werr)
	}
	return nil
}
