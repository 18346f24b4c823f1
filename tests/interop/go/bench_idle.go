package main

// bench idle is benches/idle_sessions.rs in Go: N sessions, each over a loopback TCP connection
// of its own, each with one stream that moved one 16-byte message (the client writes it, the
// server echoes it) and stays open; then every session waits -idle. What one idle session end
// costs is the growth of the resident set (and, beside it, of the heap in use), read after
// debug.FreeOSMemory has given the free memory back, divided by the session ends this process
// holds: N with -listen or -connect (the other ends in another process), 2N with -pair.
//
//	bench idle (-listen ADDR | -connect ADDR | -pair) [-sessions N] [-idle D]
//
// With -listen it prints "listening HOST:PORT" first and accepts N connections; with -connect it
// dials N. It prints one line once it has measured:
//
//	idle-sessions: ROLE N sessions, R bytes resident per session end (heap in use H)
//
// and then, with -listen or -connect, holds the sessions until its stdin ends, so that the other
// process measures with every session still open.

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"runtime"
	"runtime/debug"
	"time"

	"github.com/Acebond/gomux"
)

// idleMessage is the one message each session's stream moves.
var idleMessage = []byte("idle-sessions-16")

// idleHeld is what the application keeps of one idle session.
type idleHeld struct {
	mux    *gomux.Mux
	stream *gomux.Stream
}

type idleFlags struct {
	sessions int
	idle     time.Duration
}

func benchIdle(args []string) error {
	fs := flag.NewFlagSet("bench idle", flag.ContinueOnError)
	var end benchEnd
	end.register(fs, true)
	var f idleFlags
	fs.IntVar(&f.sessions, "sessions", 10000, "sessions to hold, one connection each")
	fs.DurationVar(&f.idle, "idle", 3*time.Second, "how long the sessions stay idle before the memory is read")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if err := end.check(); err != nil {
		return err
	}
	if f.sessions < 1 {
		return errors.New("-sessions must be at least 1")
	}
	switch {
	case end.pair:
		return idlePair(f)
	case end.listen != "" && end.connect == "":
		return idleListen(end.listen, f)
	case end.connect != "" && end.listen == "":
		return idleConnect(end.connect, f)
	}
	return errors.New("give exactly one of -listen, -connect and -pair")
}

// idleMemory reads the heap in use and the resident set once the runtime has returned its free
// memory to the operating system.
func idleMemory() memory {
	debug.FreeOSMemory()
	var stats runtime.MemStats
	runtime.ReadMemStats(&stats)
	return memory{heap: stats.HeapAlloc, resident: residentBytes()}
}

// printIdleSessions prints what the sessions cost between before and after, over ends session
// ends.
func printIdleSessions(role string, n int, before, after memory, ends int) {
	grew := func(a, b uint64) float64 {
		if b < a {
			return 0
		}
		return float64(b-a) / float64(ends)
	}
	fmt.Printf("idle-sessions: %s %d sessions, %.0f bytes resident per session end (heap in use %.0f)\n",
		role, n, grew(before.resident, after.resident), grew(before.heap, after.heap))
	os.Stdout.Sync()
}

func idlePair(f idleFlags) error {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	defer l.Close()
	before := idleMemory()
	type served struct {
		held []idleHeld
		err  error
	}
	ch := make(chan served, 1)
	go func() {
		held, err := idleServe(l, f.sessions)
		ch <- served{held, err}
	}()
	dialed, err := idleDial(l.Addr().String(), f.sessions)
	if err != nil {
		return err
	}
	s := <-ch
	if s.err != nil {
		return s.err
	}
	time.Sleep(f.idle)
	printIdleSessions("pair", f.sessions, before, idleMemory(), 2*f.sessions)
	runtime.KeepAlive(dialed)
	runtime.KeepAlive(s.held)
	return nil
}

func idleListen(addr string, f idleFlags) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	defer l.Close()
	before := idleMemory()
	fmt.Println("listening", l.Addr())
	os.Stdout.Sync()
	held, err := idleServe(l, f.sessions)
	if err != nil {
		return err
	}
	time.Sleep(f.idle)
	printIdleSessions("server", f.sessions, before, idleMemory(), f.sessions)
	io.Copy(io.Discard, os.Stdin)
	runtime.KeepAlive(held)
	return nil
}

func idleConnect(addr string, f idleFlags) error {
	before := idleMemory()
	held, err := idleDial(addr, f.sessions)
	if err != nil {
		return err
	}
	time.Sleep(f.idle)
	printIdleSessions("client", f.sessions, before, idleMemory(), f.sessions)
	io.Copy(io.Discard, os.Stdin)
	runtime.KeepAlive(held)
	return nil
}

// idleServe accepts n connections, a server session on each, and echoes the one message of
// each session's one stream.
func idleServe(l net.Listener, n int) ([]idleHeld, error) {
	held := make([]idleHeld, 0, n)
	buf := make([]byte, len(idleMessage))
	for i := 0; i < n; i++ {
		c, err := l.Accept()
		if err != nil {
			return nil, fmt.Errorf("accepting connection %d of %d: %w", i+1, n, err)
		}
		if tcp, ok := c.(*net.TCPConn); ok {
			tcp.SetNoDelay(true)
		}
		m, err := gomux.Server(c)
		if err != nil {
			return nil, err
		}
		s, err := m.AcceptStream()
		if err != nil {
			return nil, fmt.Errorf("session %d: accepting its stream: %w", i+1, err)
		}
		if _, err := io.ReadFull(s, buf); err != nil {
			return nil, fmt.Errorf("session %d: reading its message: %w", i+1, err)
		}
		if _, err := s.Write(buf); err != nil {
			return nil, fmt.Errorf("session %d: echoing its message: %w", i+1, err)
		}
		held = append(held, idleHeld{m, s})
	}
	return held, nil
}

// idleDial opens n connections to addr, a client session on each, and sends one message on one
// stream of each, checking its echo.
func idleDial(addr string, n int) ([]idleHeld, error) {
	held := make([]idleHeld, 0, n)
	buf := make([]byte, len(idleMessage))
	for i := 0; i < n; i++ {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf("connection %d of %d: %w", i+1, n, err)
		}
		if tcp, ok := c.(*net.TCPConn); ok {
			tcp.SetNoDelay(true)
		}
		m, err := gomux.Client(c)
		if err != nil {
			return nil, err
		}
		s, err := m.OpenStream()
		if err != nil {
			return nil, fmt.Errorf("session %d: opening its stream: %w", i+1, err)
		}
		if _, err := s.Write(idleMessage); err != nil {
			return nil, fmt.Errorf("session %d: writing its message: %w", i+1, err)
		}
		if _, err := io.ReadFull(s, buf); err != nil {
			return nil, fmt.Errorf("session %d: reading the echo: %w", i+1, err)
		}
		if !bytes.Equal(buf, idleMessage) {
			return nil, fmt.Errorf("session %d: echo %q, sent %q", i+1, buf, idleMessage)
		}
		held = append(held, idleHeld{m, s})
	}
	return held, nil
}
