// The Go peer of the interop suite and of the speed tool's `go` mode: a program of this
// project's own, built against the unmodified Go gomux source that lies beside the clone (in
// ../shared/gomux-go, never copied here), with nothing downloaded:
//
//	GOFLAGS=-mod=mod GOPROXY=off go build -o gomux-go-peer .
module gomux-go-peer

go 1.19

require github.com/Acebond/gomux v0.0.0

replace github.com/Acebond/gomux => ../../../../shared/gomux-go
