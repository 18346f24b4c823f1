package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"os"

	"github.com/Acebond/gomux"
)

// endpoint is where a run's one connection comes from: -listen or -connect.
type endpoint struct {
	listen  string
	connect string
}

func (e *endpoint) register(fs *flag.FlagSet) {
	fs.StringVar(&e.listen, "listen", "", "listen on ADDR, print the address, accept one connection, be the gomux server")
	fs.StringVar(&e.connect, "connect", "", "dial ADDR and be the gomux client")
}

// isServer tells which gomux role the run plays.
func (e *endpoint) isServer() bool { return e.listen != "" }

// conn returns the run's connection, with Nagle's algorithm off as a multiplexer's users set it.
func (e *endpoint) conn() (net.Conn, error) {
	var c net.Conn
	switch {
	case e.listen != "" && e.connect == "":
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
	case e.connect != "" && e.listen == "":
		var err error
		if c, err = net.Dial("tcp", e.connect); err != nil {
			return nil, err
		}
	default:
		return nil, errors.New("give exactly one of -listen and -connect")
	}
	if tcp, ok := c.(*net.TCPConn); ok {
		tcp.SetNoDelay(true)
	}
	return c, nil
}

// mux opens the connection and wraps it in a gomux session of the matching role.
func (e *endpoint) mux() (*gomux.Mux, error) {
	c, err := e.conn()
	if err != nil {
		return nil, err
	}
	if e.isServer() {
		return gomux.Server(c)
	}
	return gomux.Client(c)
}
