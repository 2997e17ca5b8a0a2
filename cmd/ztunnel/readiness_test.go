package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/cniemu"
)

// TestReadinessWaitsForSnapshot: in shared mode /healthz/ready answers 503
// naming the in-pod snapshot until the node agent has sent one, then 200.
func TestReadinessWaitsForSnapshot(t *testing.T) {
	sock := filepath.Join(t.TempDir(), "zds.sock")
	p := startZtunnel(t, "FAKE_CA=true", "XDS_ADDRESS=", "LOCAL_XDS_PATH=../../examples/localhost.yaml", "INPOD_UDS="+sock)
	url := "http://" + p.addrs["readiness"] + "/healthz/ready"
	code, body := get(t, url)
	if code != 503 || !strings.Contains(string(body), "inpod snapshot") {
		t.Fatalf("readiness before the agent = %d %q, want 503 naming the inpod snapshot", code, body)
	}
	cni, err := cniemu.New(cniemu.Options{Path: sock})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go cni.Run(ctx)
	defer cni.Close()
	deadline := time.Now().Add(15 * time.Second)
	for {
		code, body = get(t, url)
		if code == 200 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("readiness after the snapshot = %d %q, want 200", code, body)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if string(body) != "ready\n" {
		t.Fatalf("ready body = %q", body)
	}
}
