package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/ztunnel-go/ztunnel/internal/demo"
)

func runDemo(args []string) int {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	keep := fs.Bool("keep", false, "leave the cluster running until Ctrl-C, for exploring the admin endpoints")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	self, err := os.Executable()
	if err != nil {
		fmt.Fprintf(os.Stderr, "ztunnel demo: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := demo.Run(ctx, demo.Options{Binary: self, Keep: *keep, Out: os.Stdout}); err != nil {
		fmt.Fprintf(os.Stderr, "ztunnel demo: %v\n", err)
		return 1
	}
	return 0
}
