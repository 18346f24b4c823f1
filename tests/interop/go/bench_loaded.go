package main

// Latency under load (benches/latency_under_load.rs): a small ping every few milliseconds on
// one stream, echoed, while another stream of the same session sends bulk data as fast as it
// can. The Rust bench runs the server end with -listen and the client end with -connect through
// an emulated link between them.
//
//	bench loaded (-listen ADDR | -connect ADDR) [-seconds S] [-warmup S] [-interval D]
//	             [-notsent-lowat N]
//
// The wire of the measurement, the same in every implementation the bench compares: each stream
// starts with one byte, 'p' for the ping stream and 'b' for the bulk stream. A ping is 64 bytes,
// the first 8 the client's send time; the server writes the bulk bytes it has received so far
// into the next 8 (little-endian) and sends the ping back. The bulk stream carries 64 KiB
// writes until the end of the run. The client prints, once the echoes of every ping sent in the
// measured window have come back:
//
//	loaded: pings=N p50_us=X p99_us=Y bulk_mib_s=R
//
// R is the bulk rate the server saw: the difference between the counts in the last and the
// first echo, over the time between their arrival.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/Acebond/gomux"
)

const (
	// pingSize is the size of one ping and of its echo.
	pingSize = 64
	// bulkChunk is the size of each bulk write: one maximal gomux Data frame.
	bulkChunk = 64 * 1024
	// echoWait is how long the client waits, after the window, for the last echoes.
	echoWait = 10 * time.Second
)

// loadedFlags are the client's settings.
type loadedFlags struct {
	seconds, warmup float64
	interval        time.Duration
	notsentLowat    int
}

func benchLoaded(args []string) error {
	fs := newFlagSet("loaded")
	var end endpoint
	var f loadedFlags
	end.register(fs)
	fs.Float64Var(&f.seconds, "seconds", 10, "seconds of pings measured (client)")
	fs.Float64Var(&f.warmup, "warmup", 1, "seconds of bulk before the first measured ping (client)")
	fs.DurationVar(&f.interval, "interval", 10*time.Millisecond, "time between pings (client)")
	fs.IntVar(&f.notsentLowat, "notsent-lowat", 0, "set TCP_NOTSENT_LOWAT to N bytes on the connection (0: leave it)")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if f.seconds <= 0 || f.warmup < 0 || f.interval <= 0 || f.notsentLowat < 0 {
		return errors.New("-seconds and -interval must be positive, -warmup and -notsent-lowat not negative")
	}
	c, err := end.conn()
	if err != nil {
		return err
	}
	if f.notsentLowat > 0 {
		if err := setNotsentLowat(c, f.notsentLowat); err != nil {
			return fmt.Errorf("setting TCP_NOTSENT_LOWAT: %w", err)
		}
	}
	if end.isServer() {
		m, err := gomux.Server(c)
		if err != nil {
			return err
		}
		serveLoaded(m)
		return nil
	}
	m, err := gomux.Client(c)
	if err != nil {
		return err
	}
	defer closeMux(m)
	return loadedClient(m, f)
}

// serveLoaded answers the ping and bulk streams the client opens, until the session ends.
func serveLoaded(m *gomux.Mux) {
	var received atomic.Uint64
	for {
		s, err := m.AcceptStream()
		if err != nil {
			return
		}
		go func(s *gomux.Stream) {
			defer s.Close()
			tag := make([]byte, 1)
			if _, err := io.ReadFull(s, tag); err != nil {
				return
			}
			switch tag[0] {
			case 'p':
				ping := make([]byte, pingSize)
				for {
					if _, err := io.ReadFull(s, ping); err != nil {
						return
					}
					binary.LittleEndian.PutUint64(ping[8:16], received.Load())
					if _, err := s.Write(ping); err != nil {
						return
					}
				}
			case 'b':
				buf := make([]byte, readSize)
				for {
					n, err := s.Read(buf)
					received.Add(uint64(n))
					if err != nil {
						return
					}
				}
			}
		}(s)
	}
}

// echo is one ping's answer as the client saw it.
type echo struct {
	rtt     time.Duration
	arrived time.Duration
	bulk    uint64
}

// loadedClient runs the bulk stream and the pings, and prints the result.
func loadedClient(m *gomux.Mux, f loadedFlags) error {
	start := time.Now()
	bulk, err := m.OpenStream()
	if err != nil {
		return err
	}
	ping, err := m.OpenStream()
	if err != nil {
		return err
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		chunk := make([]byte, bulkChunk)
		chunk[0] = 'b'
		for {
			select {
			case <-stop:
				return
			default:
			}
			if _, err := bulk.Write(chunk); err != nil {
				return
			}
			chunk[0] = 0
		}
	}()
	defer func() {
		close(stop)
		bulk.Close()
		wg.Wait()
	}()

	if _, err := ping.Write([]byte{'p'}); err != nil {
		return err
	}
	time.Sleep(time.Duration(f.warmup * float64(time.Second)))

	// A reader takes the echoes back while this goroutine stamps each ping with its time since
	// start and sends it; the echoes of every ping sent are then collected.
	window := time.Duration(f.seconds * float64(time.Second))
	arrivals := make(chan echo, int(window/f.interval)+16)
	readErr := make(chan error, 1)
	go func() {
		back := make([]byte, pingSize)
		for {
			if _, err := io.ReadFull(ping, back); err != nil {
				readErr <- err
				return
			}
			now := time.Since(start)
			stamp := time.Duration(binary.LittleEndian.Uint64(back[0:8]))
			arrivals <- echo{now - stamp, now, binary.LittleEndian.Uint64(back[8:16])}
		}
	}()
	message := make([]byte, pingSize)
	ticker := time.NewTicker(f.interval)
	sent := 0
	end := time.Now().Add(window)
	for now := time.Now(); now.Before(end); now = <-ticker.C {
		binary.LittleEndian.PutUint64(message[0:8], uint64(time.Since(start)))
		if _, err := ping.Write(message); err != nil {
			ticker.Stop()
			return err
		}
		sent++
	}
	ticker.Stop()
	echoes := make([]echo, 0, sent)
	timeout := time.After(echoWait)
	for len(echoes) < sent {
		select {
		case e := <-arrivals:
			echoes = append(echoes, e)
		case err := <-readErr:
			return fmt.Errorf("reading echo %d of %d: %w", len(echoes)+1, sent, err)
		case <-timeout:
			return fmt.Errorf("%d of %d echoes missing after %v", sent-len(echoes), sent, echoWait)
		}
	}
	ping.Close()
	if len(echoes) < 2 {
		return errors.New("fewer than two pings in the window")
	}
	first, last := echoes[0], echoes[len(echoes)-1]
	rate := float64(last.bulk-first.bulk) / (last.arrived - first.arrived).Seconds() / (1 << 20)
	rtts := make([]time.Duration, len(echoes))
	for i, e := range echoes {
		rtts[i] = e.rtt
	}
	sort.Slice(rtts, func(i, j int) bool { return rtts[i] < rtts[j] })
	fmt.Printf("loaded: pings=%d p50_us=%d p99_us=%d bulk_mib_s=%.3f\n", len(rtts),
		percentile(rtts, 50).Microseconds(), percentile(rtts, 99).Microseconds(), rate)
	return nil
}

// percentile is the nearest-rank percentile p of sorted, as the Rust bench computes it.
func percentile(sorted []time.Duration, p int) time.Duration {
	rank := (len(sorted)*p + 99) / 100
	if rank < 1 {
		rank = 1
	}
	return sorted[rank-1]
}

// setNotsentLowat sets TCP_NOTSENT_LOWAT on c, a TCP connection.
func setNotsentLowat(c net.Conn, bytes int) error {
	tcp, ok := c.(*net.TCPConn)
	if !ok {
		return errors.New("not a TCP connection")
	}
	raw, err := tcp.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	if err := raw.Control(func(fd uintptr) { serr = setsockoptNotsentLowat(fd, bytes) }); err != nil {
		return err
	}
	return serr
}
