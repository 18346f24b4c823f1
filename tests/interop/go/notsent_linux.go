//go:build linux

package main

import "syscall"

// tcpNotsentLowat is TCP_NOTSENT_LOWAT of linux/tcp.h, which package syscall does not name.
const tcpNotsentLowat = 0x19

// setsockoptNotsentLowat sets TCP_NOTSENT_LOWAT on the socket fd.
func setsockoptNotsentLowat(fd uintptr, bytes int) error {
	return syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, tcpNotsentLowat, bytes)
}
