//go:build !linux

package main

import "errors"

// setsockoptNotsentLowat is only implemented on Linux, where the bench runs.
func setsockoptNotsentLowat(fd uintptr, bytes int) error {
	return errors.New("TCP_NOTSENT_LOWAT is only set on Linux")
}
