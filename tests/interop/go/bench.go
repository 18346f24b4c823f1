package main

// Benchmark roles: Go gomux doing the same work as the Rust crate's measurements, so that both
// can be run on the same machine in the same run and set side by side.
//
//	bench send    (-connect ADDR | -listen ADDR) [-streams K] [-bytes N | -file PATH] [-chunk C]
//	bench receive (-listen ADDR | -connect ADDR | -pair) [-streams K] [-progress D]
//	bench echo    (-listen ADDR | -connect ADDR) [-raw]
//	bench rtt     (-connect ADDR | -listen ADDR | -pair) [-size B] [-count N] [-warmup N] [-raw]
//	bench many    (-connect ADDR | -listen ADDR | -pair) [-streams N] [-bytes B] [-bulk N]
//	bench idle    (-connect ADDR | -listen ADDR | -pair) [-sessions N] [-idle D]
//	bench digest  [-streams K] [-bytes N | -file PATH] [-chunk C]
//	bench loaded  (-listen ADDR | -connect ADDR) [-seconds S] [-warmup S] [-notsent-lowat N]
//
// send and receive are the two ends of the speed tool's transfer (examples/speed.rs): the
// sender opens K streams one after the other, each writing its share of the content in writes
// of C bytes and half-closing, while the receiver reads each into a 64 KiB buffer. Both hash
// every stream with the speed tool's checksum; the content is the speed tool's (see
// bench_content.go), so the digests can be checked against the Rust implementation's. Once it
// has read a stream to its end, the receiver closes it: that tells the sender everything
// arrived, and the sender then closes the session. The receiver's time runs from the first
// stream it accepts to the last byte it reads (the open frame's trip, tens of microseconds, is
// the only difference from the Rust modes, which start the clock before the first open).
//
// echo and rtt are the latency bench (benches/latency.rs): a 64-byte message and its echo on
// one stream, one at a time. many is examples/many_streams.rs: N idle streams (memory per
// stream end), one bulk stream beside them, then N streams each echoing B bytes. idle is
// benches/idle_sessions.rs: N sessions, one connection each, idle (memory per session end).
//
// With -pair the program runs both ends itself, over a loopback TCP connection of its own (the
// receiver also takes the sender's flags then), as the Rust measurements do: one process, its
// runtime on every core. With -raw, echo and rtt use the TCP connection itself, no gomux.
//
// Lines printed on stdout, one each, for the speed tool and scripts/benchmarks.sh to parse:
//
//	progress BYTES                                              (receive, every -progress)
//	received streams=K bytes=N seconds=S digest=HEX             (receive)
//	sent streams=K bytes=N seconds=S digest=HEX                 (send; S until the last close)
//	rtt: N round trips of B bytes, X µs each (gomux|tcp)        (rtt)
//	idle: N streams, H bytes per stream end (heap in use; resident set R)
//	bulk: 1 stream, M MiB beside N idle streams in T ms (R MiB/s)
//	echo: N streams x B bytes in T ms                           (many)
//	idle-sessions: ROLE N sessions, R bytes resident per session end (heap in use H)   (idle)
//	digest streams=K bytes=N digest=HEX                         (digest)
//
// A digest is 16 hex digits: the per-stream (length, hash) pairs, sorted, folded into one
// value (see combine), so it does not depend on the order in which streams were accepted.

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/Acebond/gomux"
)

// readSize is the receiver's buffer, as in the Rust modes: one maximal gomux Data frame.
const readSize = 64 * 1024

// benchMain runs one benchmark role.
func benchMain(mode string, args []string) error {
	switch mode {
	case "send":
		return benchSend(args)
	case "receive":
		return benchReceive(args)
	case "echo":
		return benchEcho(args)
	case "rtt":
		return benchRTT(args)
	case "many":
		return benchMany(args)
	case "digest":
		return benchDigest(args)
	case "loaded":
		return benchLoaded(args)
	case "idle":
		return benchIdle(args)
	}
	return fmt.Errorf("unknown bench mode %q (send, receive, echo, rtt, many, digest, loaded or idle)", mode)
}

// benchEnd is where a bench run's connection comes from: the -listen/-connect endpoint, or,
// with -pair, a loopback connection of its own whose other end this process serves too.
type benchEnd struct {
	endpoint
	pair bool
}

func (b *benchEnd) register(fs *flag.FlagSet, pairable bool) {
	b.endpoint.register(fs)
	if pairable {
		fs.BoolVar(&b.pair, "pair", false, "run both ends in this process, over a loopback TCP connection of its own")
	}
}

// check rejects a command line with both -pair and an address.
func (b *benchEnd) check() error {
	if b.pair && (b.listen != "" || b.connect != "") {
		return errors.New("-pair excludes -listen and -connect")
	}
	return nil
}

// loopbackPair connects a TCP connection to itself over loopback, Nagle's algorithm off on both
// ends as in conn.go: (dialing end, accepted end).
func loopbackPair() (net.Conn, net.Conn, error) {
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
	for _, c := range []net.Conn{dialed, a.c} {
		if tcp, ok := c.(*net.TCPConn); ok {
			tcp.SetNoDelay(true)
		}
	}
	return dialed, a.c, nil
}

// muxPair is a gomux client and server over one loopback TCP connection.
func muxPair() (client, server *gomux.Mux, err error) {
	dialed, accepted, err := loopbackPair()
	if err != nil {
		return nil, nil, err
	}
	if client, err = gomux.Client(dialed); err != nil {
		return nil, nil, err
	}
	if server, err = gomux.Server(accepted); err != nil {
		return nil, nil, err
	}
	return client, server, nil
}

// closeMux ends a session whose work is done. Its error is left out: Go gomux's Close returns
// the session's first error, and when the peer, on the CloseMux frame, closes the connection
// before Close has recorded its own reason, that is the end of the connection ("could not
// read frame header: EOF"), although everything was delivered.
func closeMux(m *gomux.Mux) {
	m.Close()
}

// waitEnd waits until the peer has closed the session (or the connection has gone), so that a
// role does not close the connection under frames it still owes the peer. Gives up after
// limit: the run's figures are printed by then.
func waitEnd(m *gomux.Mux, limit time.Duration) {
	done := make(chan struct{})
	go func() {
		for {
			s, err := m.AcceptStream()
			if err != nil {
				break
			}
			s.Close()
		}
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(limit):
		m.Close()
	}
}

// sizeFlag is a byte count written like the speed tool's: digits, then optionally K, M, G or T
// (powers of 1024), optionally followed by B or iB, in any case.
type sizeFlag uint64

func (s *sizeFlag) String() string { return strconv.FormatUint(uint64(*s), 10) }

func (s *sizeFlag) Set(value string) error {
	n, err := parseSize(value)
	if err != nil {
		return err
	}
	*s = sizeFlag(n)
	return nil
}

func parseSize(value string) (uint64, error) {
	bad := fmt.Errorf("not a size: %s (try 4096, 64K, 512M, 1G)", value)
	text := strings.ToUpper(value)
	if strings.HasSuffix(text, "IB") {
		text = text[:len(text)-2]
	} else if strings.HasSuffix(text, "B") {
		text = text[:len(text)-1]
	}
	digits := strings.TrimRight(text, "KMGT")
	shift := uint(0)
	switch text[len(digits):] {
	case "":
	case "K":
		shift = 10
	case "M":
		shift = 20
	case "G":
		shift = 30
	case "T":
		shift = 40
	default:
		return 0, bad
	}
	n, err := strconv.ParseUint(digits, 10, 64)
	if err != nil || n > (^uint64(0))>>shift {
		return 0, bad
	}
	return n << shift, nil
}

// parseFlags parses args into fs and rejects positional leftovers.
func parseFlags(fs *flag.FlagSet, args []string) error {
	fs.SetOutput(os.Stderr)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected argument %q", fs.Arg(0))
	}
	return nil
}

// readToEnd reads s until it ends, into buf, and returns how many bytes came.
func readToEnd(s io.Reader, buf []byte) (uint64, error) {
	var total uint64
	for {
		n, err := s.Read(buf)
		total += uint64(n)
		if err == io.EOF {
			return total, nil
		}
		if err != nil {
			return total, err
		}
	}
}

// newFlagSet is the flag set of one bench mode; errors are returned, not fatal.
func newFlagSet(mode string) *flag.FlagSet {
	return flag.NewFlagSet("gomux-go-peer bench "+mode, flag.ContinueOnError)
}
