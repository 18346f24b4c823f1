// Command gomux-go-compare runs the speed tool's transfer (examples/speed.rs) through the Go
// multiplexers users most often pick, xtaci/smux and hashicorp/yamux, so that they can be
// measured beside this crate and Go gomux on the same machine in the same run:
//
//	gomux-go-compare MUX send    (-connect ADDR | -listen ADDR) [-streams K] [-bytes N | -file PATH] [-chunk C]
//	gomux-go-compare MUX receive (-listen ADDR | -connect ADDR | -pair) [-streams K] [-progress D]
//
// MUX is smux or yamux, each with its default configuration. The work is that of the Go peer's
// `bench send` and `bench receive` (tests/interop/go/bench.go) over Go gomux: the sender opens
// K streams one after the other, each writing its share of the content in writes of C bytes
// (64 KiB by default) and half-closing; the receiver reads each into a 64 KiB buffer; both hash
// every stream with the speed tool's checksum. Once it has read a stream to its end, the
// receiver closes it, which tells the sender that everything arrived; the sender then closes
// the session. The receiver's time runs from the first stream it accepts to the last byte it
// reads. With -pair the program runs both ends itself over a loopback TCP connection of its
// own (the receiver takes the sender's flags then): one process, as the Rust measurements run.
//
// With -listen the program prints "listening HOST:PORT" once it listens, accepts one
// connection and is the multiplexer's server; with -connect it dials and is the client. Lines
// printed on stdout, in the Go peer's format, for the speed tool and scripts/benchmarks.sh:
//
//	progress BYTES                                      (receive, every -progress)
//	received streams=K bytes=N seconds=S digest=HEX     (receive)
//	sent streams=K bytes=N seconds=S digest=HEX         (send; S until the last close)
//
// It exits 0 when the transfer delivered what was sent, 1 when it did not or the options were
// wrong, and 2 when the command is unknown.
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 3 {
		usage()
	}
	var err error
	switch os.Args[2] {
	case "send":
		err = benchSend(os.Args[1], os.Args[3:])
	case "receive":
		err = benchReceive(os.Args[1], os.Args[3:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gomux-go-compare:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: gomux-go-compare ("+muxNames+") (send | receive) (-listen ADDR | -connect ADDR | -pair) [flags]")
	os.Exit(2)
}
