package main

// A TCP tunnel over one Go gomux session, the counterpart of examples/tunnel.rs for
// scripts/redis-tunnel.sh to measure beside it:
//
//	gomux-go-peer tunnel exit  (-listen ADDR | -entry ADDR) -target ADDR
//	gomux-go-peer tunnel entry -listen ADDR (-exit ADDR | -accept-exit ADDR)
//
// The exit accepts gomux connections from entries; for every stream opened on one it dials the
// target and copies both ways. The entry dials the exit once, and every TCP client it accepts
// becomes a stream of that one session. Both print "tunnel exit listening ADDR" or "tunnel
// entry listening ADDR" once they listen, run until killed, and report a failed dial or copy
// on stderr without stopping. Half-closes are carried through: the end of one direction
// becomes a CloseWrite on the other side.
//
// Reversed, as the Rust tunnel's `exit --entry` and `entry --accept-exit`: the exit dials the
// entry once (-entry, the gomux client; it prints "tunnel exit connected ADDR"), and the entry
// takes one exit's connection on -accept-exit (the gomux server; it prints "tunnel entry
// accepting-exit ADDR" before its listening line) before it serves clients. The entry still
// opens every stream, whichever end dialled.

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"sync"

	"github.com/Acebond/gomux"
)

// tunnelMain runs one end of the tunnel.
func tunnelMain(role string, args []string) error {
	fs := flag.NewFlagSet("gomux-go-peer tunnel "+role, flag.ContinueOnError)
	var listen, target, exit, entry, acceptExit string
	fs.StringVar(&listen, "listen", "", "where to listen")
	switch role {
	case "exit":
		fs.StringVar(&target, "target", "", "where to forward every stream (exit)")
		fs.StringVar(&entry, "entry", "", "dial the entry instead of listening (exit)")
	case "entry":
		fs.StringVar(&exit, "exit", "", "the tunnel's exit (entry)")
		fs.StringVar(&acceptExit, "accept-exit", "", "let the exit dial in here instead (entry)")
	default:
		return fmt.Errorf("unknown tunnel role %q (entry or exit)", role)
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if role == "exit" && target != "" && entry != "" && listen == "" {
		return reverseExit(entry, target)
	}
	if role == "entry" && listen != "" && acceptExit != "" && exit == "" {
		return reverseEntry(listen, acceptExit)
	}
	if listen == "" || (role == "exit" && target == "") || (role == "entry" && exit == "") {
		return errors.New("give -listen or -entry, and -target (exit); -listen, and -exit or -accept-exit (entry)")
	}
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	defer l.Close()
	if role == "exit" {
		fmt.Println("tunnel exit listening", l.Addr())
		return tunnelExit(l, target)
	}
	c, err := net.Dial("tcp", exit)
	if err != nil {
		return err
	}
	noDelay(c)
	m, err := gomux.Client(c)
	if err != nil {
		return err
	}
	fmt.Println("tunnel entry listening", l.Addr())
	return tunnelEntry(l, m)
}

// reverseExit dials the entry once and serves the streams it opens.
func reverseExit(entry, target string) error {
	c, err := net.Dial("tcp", entry)
	if err != nil {
		return err
	}
	noDelay(c)
	m, err := gomux.Client(c)
	if err != nil {
		return err
	}
	fmt.Println("tunnel exit connected", c.RemoteAddr())
	serveStreams(m, target)
	return nil
}

// reverseEntry takes one exit's connection on acceptExit, then makes every client accepted
// on listen a stream of it.
func reverseEntry(listen, acceptExit string) error {
	exits, err := net.Listen("tcp", acceptExit)
	if err != nil {
		return err
	}
	defer exits.Close()
	l, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	defer l.Close()
	fmt.Println("tunnel entry accepting-exit", exits.Addr())
	fmt.Println("tunnel entry listening", l.Addr())
	c, err := exits.Accept()
	if err != nil {
		return err
	}
	noDelay(c)
	m, err := gomux.Server(c)
	if err != nil {
		return err
	}
	return tunnelEntry(l, m)
}

// tunnelExit serves every gomux connection accepted on l.
func tunnelExit(l net.Listener, target string) error {
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		noDelay(c)
		m, err := gomux.Server(c)
		if err != nil {
			return err
		}
		go serveStreams(m, target)
	}
}

// serveStreams connects every stream opened on m to target, until m ends.
func serveStreams(m *gomux.Mux, target string) {
	for {
		s, err := m.AcceptStream()
		if err != nil {
			return
		}
		go func() {
			t, err := net.Dial("tcp", target)
			if err != nil {
				fmt.Fprintln(os.Stderr, "tunnel exit: dialing the target:", err)
				s.Close()
				return
			}
			noDelay(t)
			splice(s, t.(*net.TCPConn))
		}()
	}
}

// tunnelEntry makes every client accepted on l a stream of m.
func tunnelEntry(l net.Listener, m *gomux.Mux) error {
	for {
		c, err := l.Accept()
		if err != nil {
			return err
		}
		noDelay(c)
		s, err := m.OpenStream()
		if err != nil {
			c.Close()
			return fmt.Errorf("opening a stream: %w", err)
		}
		go splice(s, c.(*net.TCPConn))
	}
}

// splice copies both ways between s and c, passes each direction's end on as a half-close,
// and closes both once both directions have ended.
func splice(s *gomux.Stream, c *net.TCPConn) {
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		if _, err := io.Copy(s, c); err != nil {
			fmt.Fprintln(os.Stderr, "tunnel: client to stream:", err)
		}
		s.CloseWrite()
	}()
	go func() {
		defer wg.Done()
		if _, err := io.Copy(c, s); err != nil {
			fmt.Fprintln(os.Stderr, "tunnel: stream to client:", err)
		}
		c.CloseWrite()
	}()
	wg.Wait()
	s.Close()
	c.Close()
}

// noDelay turns Nagle's algorithm off, as the Rust tunnel does.
func noDelay(c net.Conn) {
	if tcp, ok := c.(*net.TCPConn); ok {
		tcp.SetNoDelay(true)
	}
}
