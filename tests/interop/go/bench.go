package main

import "fmt"

// benchMain runs one benchmark role (see bench modes below).
func benchMain(mode string, args []string) error {
	return fmt.Errorf("unknown bench mode %q", mode)
}
