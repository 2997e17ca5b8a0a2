package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/nstest"
)

// nsGet does a plain HTTP/1.0 GET of path on addr from inside ns (a
// ztunnel's loopback ports are only reachable there).
func nsGet(ns *nstest.NS, addr, path string) (code int, body string, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := ns.Dial(ctx, "tcp", addr)
	if err != nil {
		return 0, "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	fmt.Fprintf(c, "GET %s HTTP/1.0\r\n\r\n", path)
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), err
}

// scrape fetches /metrics from inside ns.
func scrape(t *testing.T, ns *nstest.NS) string {
	t.Helper()
	_, body, err := nsGet(ns, "127.0.0.1:15020", "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// metricSum adds the samples of name whose labels contain every want pair.
func metricSum(text, name string, want ...string) float64 {
	total := 0.0
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, name+"{") {
			continue
		}
		ok := true
		for _, w := range want {
			if !strings.Contains(line, w) {
				ok = false
			}
		}
		if !ok {
			continue
		}
		f := strings.Fields(line)
		v, _ := strconv.ParseFloat(f[len(f)-1], 64)
		total += v
	}
	return total
}

// TestMetricsAfterKnownTraffic: after N connections with known byte counts
// through the real binary, /metrics has exact counters and byte totals for
// both reporters, with workload labels.
func TestMetricsAfterKnownTraffic(t *testing.T) {
	n := newInpodNode(t, "zmt", "STATS_ADDR=127.0.0.1:15020")
	dst := netip.AddrPortFrom(n.sv.IP, 7100).String()
	const conns, size = 3, 100_000
	for i := 0; i < conns; i++ {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		c, err := n.cl.Dial(ctx, "tcp", dst)
		if err != nil {
			t.Fatal(err)
		}
		buf := make([]byte, size)
		rand.Read(buf)
		c.Write(buf)
		c.(*net.TCPConn).CloseWrite()
		reply, err := io.ReadAll(c)
		c.Close()
		cancel()
		if err != nil || !strings.HasPrefix(string(reply), strconv.Itoa(size)+" ") {
			t.Fatalf("conn %d reply %q %v\n%s", i, reply, err, readFile(n.logPath))
		}
	}
	replyLen := float64(len(fmt.Sprintf("%d %064x\n", size, 0)))
	deadline := time.Now().Add(10 * time.Second)
	for {
		text := scrape(t, n.node.NS)
		type check struct {
			name   string
			labels []string
			want   float64
		}
		checks := []check{}
		for _, rep := range []string{`reporter="source"`, `reporter="destination"`} {
			checks = append(checks,
				check{"istio_tcp_connections_opened_total", []string{rep}, conns},
				check{"istio_tcp_connections_closed_total", []string{rep}, conns},
				check{"istio_tcp_received_bytes_total", []string{rep}, conns * size},
				check{"istio_tcp_sent_bytes_total", []string{rep}, conns * replyLen},
			)
		}
		checks = append(checks, check{"istio_tcp_connections_opened_total",
			[]string{`source_principal="spiffe://cluster.local/ns/d/sa/cl"`, `destination_principal="spiffe://cluster.local/ns/d/sa/sv"`, `connection_security_policy="mutual_tls"`}, 2 * conns})
		var failed []string
		for _, c := range checks {
			if got := metricSum(text, c.name, c.labels...); got != c.want {
				failed = append(failed, fmt.Sprintf("%s%v = %v, want %v", c.name, c.labels, got, c.want))
			}
		}
		if len(failed) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics:\n%s", strings.Join(failed, "\n"))
		}
		time.Sleep(100 * time.Millisecond)
	}
}
