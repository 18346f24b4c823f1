package main

// The multiplexers compared, behind one small interface, each with its default configuration,
// as a user who picks it up runs it.

import (
	"fmt"
	"io"
	"net"

	"github.com/hashicorp/yamux"
	"github.com/xtaci/smux"
)

// session is one end of a multiplexed connection.
type session interface {
	open() (stream, error)
	accept() (stream, error)
	// close ends the session and its connection.
	close() error
}

// stream is one stream of a session.
type stream interface {
	io.ReadWriter
	// closeWrite half-closes: the peer reads to its end, this end can still read.
	closeWrite() error
	// close closes both directions.
	close() error
}

// muxes are the multiplexers this program runs, by the name its command line gives them.
var muxes = map[string]func(c net.Conn, server bool) (session, error){
	"smux":  newSmux,
	"yamux": newYamux,
}

// muxNames lists the names muxes knows, for messages.
const muxNames = "smux or yamux"

// newSession wraps c in a session of the multiplexer called name.
func newSession(name string, c net.Conn, server bool) (session, error) {
	start, ok := muxes[name]
	if !ok {
		return nil, fmt.Errorf("unknown multiplexer %q (%s)", name, muxNames)
	}
	return start(c, server)
}

// xtaci/smux, protocol version 1 (its default).

type smuxSession struct{ s *smux.Session }

func newSmux(c net.Conn, server bool) (session, error) {
	var s *smux.Session
	var err error
	if server {
		s, err = smux.Server(c, smux.DefaultConfig())
	} else {
		s, err = smux.Client(c, smux.DefaultConfig())
	}
	if err != nil {
		return nil, err
	}
	return smuxSession{s}, nil
}

func (m smuxSession) open() (stream, error) {
	s, err := m.s.OpenStream()
	if err != nil {
		return nil, err
	}
	return smuxStream{s}, nil
}

func (m smuxSession) accept() (stream, error) {
	s, err := m.s.AcceptStream()
	if err != nil {
		return nil, err
	}
	return smuxStream{s}, nil
}

func (m smuxSession) close() error { return m.s.Close() }

type smuxStream struct{ *smux.Stream }

func (s smuxStream) closeWrite() error { return s.CloseWrite() }
func (s smuxStream) close() error      { return s.Close() }

// hashicorp/yamux.

type yamuxSession struct{ s *yamux.Session }

func newYamux(c net.Conn, server bool) (session, error) {
	var s *yamux.Session
	var err error
	if server {
		s, err = yamux.Server(c, yamux.DefaultConfig())
	} else {
		s, err = yamux.Client(c, yamux.DefaultConfig())
	}
	if err != nil {
		return nil, err
	}
	return yamuxSession{s}, nil
}

func (m yamuxSession) open() (stream, error) {
	s, err := m.s.OpenStream()
	if err != nil {
		return nil, err
	}
	return yamuxStream{s}, nil
}

func (m yamuxSession) accept() (stream, error) {
	s, err := m.s.AcceptStream()
	if err != nil {
		return nil, err
	}
	return yamuxStream{s}, nil
}

func (m yamuxSession) close() error { return m.s.Close() }

type yamuxStream struct{ *yamux.Stream }

// yamux's Close is a half-close: it sends FIN and the stream can still read until the peer's.
func (s yamuxStream) closeWrite() error { return s.Close() }

// yamux has no close of both directions at once; the transfer closes a stream only after
// reading the peer's FIN, and then Close, sending this end's, ends the stream.
func (s yamuxStream) close() error { return s.Close() }
