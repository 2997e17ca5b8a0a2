package proxy

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
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

// BenchmarkRecordMetrics: the metric work of one connection with a label
// set seen before (the common case: a node's label sets are bounded by
// its workloads): open, a byte count flush, done with logging off.
func BenchmarkRecordMetrics(b *testing.B) {
	src := netip.MustParseAddrPort("10.0.0.1:40000")
	dst := netip.MustParseAddrPort("10.0.0.2:8080")
	labels := TrafficLabels{
		Reporter: reporterSource, SourceWorkload: "client", SourceNamespace: "default",
		SourcePrincipal: "spiffe://cluster.local/ns/default/sa/client", DestinationWorkload: "server",
		DestinationNamespace: "default", DestinationPrincipal: "spiffe://cluster.local/ns/default/sa/server",
		DestinationService: "server.default.svc.cluster.local", RequestProtocol: "tcp", ResponseFlags: flagNone,
		SecurityPolicy: policyMutualTLS,
	}
	m := NewMetrics(nil)
	log := slog.New(slog.DiscardHandler)
	b.ReportAllocs()
	for b.Loop() {
		r := newRecord(m, log, "outbound", src, dst)
		r.open(labels)
		r.counts.received.Store(100)
		r.counts.sent.Store(2048)
		r.done(nil)
	}
}

// TestSeriesPerLabelSet: connections with equal labels count into one
// series and a different label set into its own, whether a record finds
// its series in the cache or creates them.
func TestSeriesPerLabelSet(t *testing.T) {
	m := NewMetrics(nil)
	log := slog.New(slog.DiscardHandler)
	a := TrafficLabels{Reporter: reporterSource, SourceWorkload: "client", DestinationWorkload: "server"}
	b := a
	b.DestinationWorkload = "other"
	conn := func(l TrafficLabels, recv, sent int64) {
		r := newRecord(m, log, "outbound", netip.AddrPort{}, netip.AddrPort{})
		r.open(l)
		r.counts.received.Store(recv)
		r.counts.sent.Store(sent)
		r.done(nil)
	}
	conn(a, 10, 1)
	conn(b, 20, 2)
	conn(a, 30, 3)
	for _, c := range []struct {
		l                              TrafficLabels
		opened, closed, received, sent float64
	}{{a, 2, 2, 40, 4}, {b, 1, 1, 20, 2}} {
		v := c.l.values()
		got := []float64{
			testutil.ToFloat64(m.opened.WithLabelValues(v...)),
			testutil.ToFloat64(m.closed.WithLabelValues(v...)),
			testutil.ToFloat64(m.received.WithLabelValues(v...)),
			testutil.ToFloat64(m.sent.WithLabelValues(v...)),
		}
		want := []float64{c.opened, c.closed, c.received, c.sent}
		if !slices.Equal(got, want) {
			t.Errorf("%s: opened, closed, received, sent = %v, want %v", c.l.DestinationWorkload, got, want)
		}
	}
	if n := len(m.series); n != 2 {
		t.Errorf("cached label sets: %d, want 2", n)
	}
}

// TestLive: Live counts connections between open and done, and one that
// never opened not at all.
func TestLive(t *testing.T) {
	m := NewMetrics(nil)
	log := slog.New(slog.DiscardHandler)
	l := TrafficLabels{Reporter: reporterSource, SourceWorkload: "client", DestinationWorkload: "server"}
	a, b, failed := newRecord(m, log, "outbound", netip.AddrPort{}, netip.AddrPort{}),
		newRecord(m, log, "inbound", netip.AddrPort{}, netip.AddrPort{}),
		newRecord(m, log, "outbound", netip.AddrPort{}, netip.AddrPort{})
	a.open(l)
	b.open(l)
	if n := m.Live(); n != 2 {
		t.Fatalf("two open: Live %d", n)
	}
	failed.done(nil)
	a.done(nil)
	if n := m.Live(); n != 1 {
		t.Errorf("one done and one that never opened: Live %d, want 1", n)
	}
	b.done(nil)
	if n := m.Live(); n != 0 {
		t.Errorf("all done: Live %d, want 0", n)
	}
}
