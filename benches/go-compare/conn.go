package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
)

// end is where a run's one connection comes from: -listen, -connect or (receive only) -pair.
type end struct {
	listen  string
	connect string
	pair    bool
}

func (e *end) register(fs *flag.FlagSet, pairable bool) {
	fs.StringVar(&e.listen, "listen", "", "listen on ADDR, print the address, accept one connection, be the server")
	fs.StringVar(&e.connect, "connect", "", "dial ADDR and be the client")
	if pairable {
		fs.BoolVar(&e.pair, "pair", false, "run both ends in this process, over a loopback TCP connection of its own")
	}
}

// check rejects a command line that does not name exactly one way to the connection.
func (e *end) check() error {
	ways := 0
	for _, given := range []bool{e.listen != "", e.connect != "", e.pair} {
		if given {
			ways++
		}
	}
	if ways != 1 {
		return errors.New("give exactly one of -listen and -connect (or -pair)")
	}
	return nil
}

// session opens the connection and wraps it in a session of the multiplexer mux, the server
// on the listening end.
func (e *end) session(mux string) (session, error) {
	var c net.Conn
	if e.listen != "" {
		l, err := net.Listen("tcp", e.listen)
		if err != nil {
			return nil, err
		}
		defer l.Close()
		fmt.Println("listening", l.Addr())
		os.Stdout.Sync()
		if c, err = l.Accept(); err != nil {
			return nil, err
		}
	} else {
		var err error
		if c, err = net.Dial("tcp", e.connect); err != nil {
			return nil, err
		}
	}
	noDelay(c)
	return newSession(mux, c, e.listen != "")
}

// noDelay turns Nagle's algorithm off, as a multiplexer's users set it (Go's default too).
func noDelay(c net.Conn) {
	if tcp, ok := c.(*net.TCPConn); ok {
		tcp.SetNoDelay(true)
	}
}

// sessionPair is a client and a server of the multiplexer mux over one loopback TCP
// connection.
func sessionPair(mux string) (client, server session, err error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, nil, err
	}
	defer l.Close()
	type accepted struct {
		c   net.Conn
		err error
	}
	ch := make(chan accepted, 1)
	go func() {
		c, err := l.Accept()
		ch <- accepted{c, err}
	}()
	dialed, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		return nil, nil, err
	}
	a := <-ch
	if a.err != nil {
		dialed.Close()
		return nil, nil, a.err
	}
	noDelay(dialed)
	noDelay(a.c)
	if client, err = newSession(mux, dialed, false); err != nil {
		return nil, nil, err
	}
	if server, err = newSession(mux, a.c, true); err != nil {
		return nil, nil, err
	}
	return client, server, nil
}
