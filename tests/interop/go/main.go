// Command gomux-go-peer is a Go gomux peer for testing and measuring the Rust crate against the
// Go implementation: it runs one interop scenario, one benchmark role or one fault role on one
// connection.
//
//	gomux-go-peer scenario NAME (-listen ADDR | -connect ADDR) [flags]
//	gomux-go-peer bench    MODE (-listen ADDR | -connect ADDR) [flags]
//	gomux-go-peer fault    MODE (-listen ADDR | -connect ADDR) [flags]
//	gomux-go-peer tunnel   exit (-listen ADDR | -entry ADDR) -target ADDR
//	gomux-go-peer tunnel   entry -listen ADDR (-exit ADDR | -accept-exit ADDR)
//
// With -listen the program prints "listening HOST:PORT" on a line of its own once it listens,
// accepts one connection and is the gomux server; with -connect it dials and is the gomux
// client. It prints what it checked on stdout and exits 0 when the run did what the scenario
// expects, 1 when it did not or its options were wrong, and 2 when the command is unknown.
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
	switch os.Args[1] {
	case "scenario":
		err = scenarioMain(os.Args[2], os.Args[3:])
	case "bench":
		err = benchMain(os.Args[2], os.Args[3:])
	case "fault":
		err = faultMain(os.Args[2], os.Args[3:])
	case "tunnel":
		err = tunnelMain(os.Args[2], os.Args[3:])
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gomux-go-peer:", err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: gomux-go-peer (scenario NAME | bench MODE | fault MODE | tunnel ROLE) (-listen ADDR | -connect ADDR) [flags]")
	os.Exit(2)
}
