// Command ztunnel is Istio ambient mesh's node proxy.
//
//	ztunnel            run, configured from the environment (see internal/config)
//	ztunnel version    print the version
//	ztunnel demo       build a two-node cluster out of network namespaces and
//	                   send traffic along every path (needs root)
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=..."; the
// module's build info is used otherwise.
var version = ""

func buildVersion() string {
	if version != "" {
		return version
	}
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" && bi.Main.Version != "(devel)" {
		return bi.Main.Version
	}
	return "dev"
}

func main() {
	args := os.Args[1:]
	cmd := ""
	if len(args) > 0 {
		cmd = args[0]
	}
	switch cmd {
	case "version", "--version", "-v":
		fmt.Printf("ztunnel %s (go %s)\n", buildVersion(), goVersion())
		return
	case "", "proxy", "run":
		// Upstream's image runs "ztunnel proxy ztunnel"; accept that too.
	case "demo":
		os.Exit(runDemo(args[1:]))
	case "help", "-h", "--help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "ztunnel: unknown command %q\n%s", cmd, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := run(ctx, os.Environ(), os.Stderr); err != nil {
		fmt.Fprintf(os.Stderr, "ztunnel: %v\n", err)
		os.Exit(1)
	}
}

const usage = `usage: ztunnel [proxy|version|demo [--keep]]
Configuration comes from environment variables (XDS_ADDRESS, CA_ADDRESS,
LOCAL_XDS_PATH, FAKE_CA, PROXY_MODE, INPOD_UDS, ...): see README.md.
`

func goVersion() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		return bi.GoVersion
	}
	return "unknown"
}
