package demo

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/nstest"
)

// TestDemoTwice runs the whole demo twice in a row with the real binary:
// every path must give its expected result, and nothing may be left behind
// for the second run (or after it).
func TestDemoTwice(t *testing.T) {
	nstest.RequireRoot(t)
	if _, err := exec.LookPath("iptables"); err != nil {
		t.Skip("demo: skipping: iptables is not installed (scripts/test installs it)")
	}
	bin := filepath.Join(t.TempDir(), "ztunnel")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/ztunnel").CombinedOutput(); err != nil {
		t.Fatalf("build: %v\n%s", err, out)
	}
	for run := 1; run <= 2; run++ {
		var out bytes.Buffer
		ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
		err := Run(ctx, Options{Binary: bin, Out: &out, Prefix: "zdt"})
		cancel()
		if err != nil {
			t.Fatalf("run %d: %v\n%s", run, err, out.String())
		}
		report := out.String()
		if strings.Count(report, "[PASS]") != 7 || strings.Contains(report, "[FAIL]") {
			t.Fatalf("run %d: want 7 passing paths:\n%s", run, report)
		}
		entries, _ := os.ReadDir("/var/run/netns")
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "zdt-") {
				t.Fatalf("run %d left namespace %s behind", run, e.Name())
			}
		}
	}
}
