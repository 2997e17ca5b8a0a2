package main

import (
	"fmt"
	"os"
	"testing"
)

// TestMain lets the test binary serve as relay-pair's relays, as the bench
// binary does (startRelay runs os.Executable).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == relaySubcommand {
		if err := relayMain(os.Args[2:], os.Stdin, os.Stdout); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}
