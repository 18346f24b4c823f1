package main

// The latency bench (benches/latency.rs): a small message to an echoing peer and back, on one
// stream that stays open, one round trip at a time.

import (
	"fmt"
	"io"
	"net"
	"time"

	"github.com/Acebond/gomux"
)

// echoBuffer is what an echoing stream reads into, as benches/support's echo does.
const echoBuffer = 4096

// echoStream writes back whatever it reads from s until s ends, then half-closes.
func echoStream(s io.ReadWriter, buf []byte) error {
	for {
		n, err := s.Read(buf)
		if n > 0 {
			if _, werr := s.Write(buf[:n]); werr != nil {
				return werr
			}
		}
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// serveEcho echoes every stream the peer opens on m, each in its own goroutine, until the
// session ends.
func serveEcho(m *gomux.Mux) {
	for {
		s, err := m.AcceptStream()
		if err != nil {
			return
		}
		go func(s *gomux.Stream) {
			if echoStream(s, make([]byte, echoBuffer)) == nil {
				s.CloseWrite()
			}
			s.Close()
		}(s)
	}
}

// roundTrips makes count round trips of message on rw and returns the time they took.
func roundTrips(rw io.ReadWriter, message []byte, count int) (time.Duration, error) {
	back := make([]byte, len(message))
	start := time.Now()
	for i := 0; i < count; i++ {
		if _, err := rw.Write(message); err != nil {
			return 0, err
		}
		if _, err := io.ReadFull(rw, back); err != nil {
			return 0, err
		}
	}
	return time.Since(start), nil
}

// rttFlags are what the round trips are made of.
type rttFlags struct {
	size, count, warmup int
	raw                 bool
}

// measureRTT makes the warm-up and then the measured round trips on rw, and prints the result.
func measureRTT(rw io.ReadWriter, f rttFlags) error {
	message := make([]byte, f.size)
	for i := range message {
		message[i] = 0x5a
	}
	if _, err := roundTrips(rw, message, f.warmup); err != nil {
		return fmt.Errorf("warming up: %w", err)
	}
	elapsed, err := roundTrips(rw, message, f.count)
	if err != nil {
		return err
	}
	transport := "gomux"
	if f.raw {
		transport = "tcp"
	}
	each := elapsed.Seconds() * 1e6 / float64(f.count)
	fmt.Printf("rtt: %d round trips of %d bytes, %.2f µs each (%s)\n", f.count, f.size, each, transport)
	return nil
}

// rttClient opens one stream on m, measures on it, and closes the session.
func rttClient(m *gomux.Mux, f rttFlags) error {
	s, err := m.OpenStream()
	if err != nil {
		return err
	}
	if err := measureRTT(s, f); err != nil {
		return err
	}
	s.Close()
	closeMux(m)
	return nil
}

// rawEcho echoes a raw TCP connection until it ends.
func rawEcho(c net.Conn) error {
	defer c.Close()
	return echoStream(c, make([]byte, echoBuffer))
}

func benchEcho(args []string) error {
	fs := newFlagSet("echo")
	var end benchEnd
	var raw bool
	end.register(fs, false)
	fs.BoolVar(&raw, "raw", false, "echo the TCP connection itself, no gomux")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if raw {
		c, err := end.conn()
		if err != nil {
			return err
		}
		return rawEcho(c)
	}
	m, err := end.mux()
	if err != nil {
		return err
	}
	serveEcho(m)
	return nil
}

func benchRTT(args []string) error {
	fs := newFlagSet("rtt")
	var end benchEnd
	var f rttFlags
	end.register(fs, true)
	fs.IntVar(&f.size, "size", 64, "bytes sent each way per round trip")
	fs.IntVar(&f.count, "count", 20000, "round trips measured")
	fs.IntVar(&f.warmup, "warmup", 2000, "round trips made first, not measured")
	fs.BoolVar(&f.raw, "raw", false, "use the TCP connection itself, no gomux")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if err := end.check(); err != nil {
		return err
	}
	if f.size < 1 || f.count < 1 || f.warmup < 0 {
		return fmt.Errorf("-size and -count must be at least 1, -warmup at least 0")
	}
	switch {
	case f.raw && end.pair:
		dialed, accepted, err := loopbackPair()
		if err != nil {
			return err
		}
		go rawEcho(accepted)
		defer dialed.Close()
		return measureRTT(dialed, f)
	case f.raw:
		c, err := end.conn()
		if err != nil {
			return err
		}
		defer c.Close()
		return measureRTT(c, f)
	case end.pair:
		client, server, err := muxPair()
		if err != nil {
			return err
		}
		go serveEcho(server)
		return rttClient(client, f)
	default:
		m, err := end.mux()
		if err != nil {
			return err
		}
		return rttClient(m, f)
	}
}
