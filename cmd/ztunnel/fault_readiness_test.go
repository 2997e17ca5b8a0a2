package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/cniemu"
)

// TestFaultReadinessNamesMissingAgent: on a fresh node whose CNI agent is
// not up yet, readiness stays 503 and says why (the ZDS dial error); once
// the agent listens it passes without a restart.
func TestFaultReadinessNamesMissingAgent(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "zds.sock")
	start := time.Now()
	p := startZtunnel(t, "FAKE_CA=true", "XDS_ADDRESS=", "LOCAL_XDS_PATH=../../examples/localhost.yaml", "INPOD_UDS="+sock)
	url := "http://" + p.addrs["readiness"] + "/healthz/ready"
	var body []byte
	eventually(t, "readiness to name the ZDS error", func() bool {
		var code int
		code, body = get(t, url)
		return code == 503 && strings.Contains(string(body), "inpod snapshot (ZDS dial unixpacket "+sock) &&
			strings.Contains(string(body), "no such file or directory")
	})
	reasonAfter := time.Since(start)
	cni, err := cniemu.New(cniemu.Options{Path: sock})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go cni.Run(ctx)
	defer cni.Close()
	upAt := time.Now()
	eventually(t, "ready once the agent listens", func() bool {
		code, _ := get(t, url)
		return code == 200
	})
	t.Logf("fault cni-agent-absent: readiness %q after %v; ready %v after the agent came up",
		strings.TrimSpace(string(body)), reasonAfter.Round(time.Millisecond), time.Since(upAt).Round(time.Millisecond))
}
