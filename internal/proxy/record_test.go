package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"net/netip"
	"strings"
	"testing"
)

// TestAccessLog: one line per connection with upstream's field names, at
// INFO when it ended well and WARN with the error when it did not, and
// none when the level filters it out.
func TestAccessLog(t *testing.T) {
	src := netip.MustParseAddrPort("10.0.0.1:40000")
	dst := netip.MustParseAddrPort("10.0.0.2:8080")
	labels := TrafficLabels{
		SourceWorkload: "client", SourceNamespace: "default", SourcePrincipal: "spiffe://cluster.local/ns/default/sa/client",
		DestinationWorkload: "server", DestinationNamespace: "default", DestinationPrincipal: "spiffe://cluster.local/ns/default/sa/server",
		DestinationService: "server.default.svc.cluster.local",
	}
	run := func(level slog.Level, err error) []map[string]any {
		var buf bytes.Buffer
		log := slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: level}))
		r := newRecord(NewMetrics(nil), log, "outbound", src, dst)
		r.hbone = "10.0.0.2:15008"
		r.open(labels)
		r.counts.received.Store(100)
		r.counts.sent.Store(2048)
		r.done(&err)
		var lines []map[string]any
		for _, l := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
			if l == "" {
				continue
			}
			m := map[string]any{}
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatalf("%q: %v", l, err)
			}
			lines = append(lines, m)
		}
		return lines
	}

	lines := run(slog.LevelInfo, nil)
	if len(lines) != 1 {
		t.Fatalf("lines: %v", lines)
	}
	want := map[string]any{
		"level": "INFO", "msg": "connection complete", "src.addr": "10.0.0.1:40000", "dst.addr": "10.0.0.2:8080",
		"dst.hbone_addr": "10.0.0.2:15008", "src.workload": "client", "src.identity": labels.SourcePrincipal,
		"dst.service": labels.DestinationService, "dst.identity": labels.DestinationPrincipal, "direction": "outbound",
		"bytes_sent": float64(2048), "bytes_recv": float64(100),
	}
	for k, v := range want {
		if lines[0][k] != v {
			t.Errorf("%s = %v, want %v", k, lines[0][k], v)
		}
	}
	if _, ok := lines[0]["time"]; !ok {
		t.Error("no time")
	}
	if _, ok := lines[0]["error"]; ok {
		t.Error("error on a clean close")
	}

	lines = run(slog.LevelInfo, errors.New("connection reset by peer"))
	if len(lines) != 1 || lines[0]["level"] != "WARN" || lines[0]["error"] != "connection reset by peer" {
		t.Fatalf("failed connection: %v", lines)
	}
	if lines := run(slog.LevelWarn, nil); len(lines) != 0 {
		t.Fatalf("clean close logged at level WARN: %v", lines)
	}
	if lines := run(slog.LevelWarn, errors.New("boom")); len(lines) != 1 {
		t.Fatalf("failed connection not logged at level WARN: %v", lines)
	}
}
