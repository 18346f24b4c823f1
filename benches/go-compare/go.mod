// The Go multiplexers most often picked, measured doing the speed tool's transfer: a program of
// this project's own, built against xtaci/smux and hashicorp/yamux as published, fetched from
// the Go module proxy (go.sum pins them):
//
//	GOFLAGS=-mod=readonly go build -o gomux-go-compare .
//
// A module of its own, apart from tests/interop/go, so that the interop peer keeps building
// with nothing downloaded.
module gomux-go-compare

go 1.20

require (
	github.com/hashicorp/yamux v0.1.2
	github.com/xtaci/smux v1.5.58
)
