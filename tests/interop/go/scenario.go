package main

import "fmt"

func scenarioMain(name string, args []string) error {
	return fmt.Errorf("unknown scenario %q", name)
}
