package caclient_test

import (
	"context"
	"io"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ztunnel-go/ztunnel/internal/identity"
	"github.com/ztunnel-go/ztunnel/internal/identity/caclient"
	"github.com/ztunnel-go/ztunnel/internal/identity/identitytest"
)

// TestFaultCADownDuringRotation: the Istio CA (real gRPC over TLS, reached
// through a TCP relay) goes away right after the first certificate is
// issued. Renewals fail from half-life on; the manager keeps serving the
// old certificate until its NotAfter and no longer, counts every failed
// fetch in istio_cert_fetch_failures_total{reason="ca"}, and picks up a new
// certificate once the CA is reachable again.
func TestFaultCADownDuringRotation(t *testing.T) {
	const ttl = 4 * time.Second
	ca := identitytest.StartCAServer(t, identitytest.CAServerOptions{})
	relay := startRelay(t, strings.TrimPrefix(ca.URL, "https://"))
	opts := ca.ClientOptions()
	opts.Address = "https://" + relay.addr()
	client, err := caclient.New(opts)
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	reg := prometheus.NewRegistry()
	m, err := identity.NewManager(identity.ManagerOptions{CA: client, TTL: ttl, Registerer: reg})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 40*time.Second)
	defer cancel()
	old, err := m.Get(ctx, podID)
	if err != nil {
		t.Fatal(err)
	}
	relay.down()
	downAt := time.Now()

	// Until just before expiry, every Get returns the old certificate.
	var gets int
	for time.Until(old.NotAfter) > 150*time.Millisecond {
		c, err := m.Get(ctx, podID)
		if err != nil || c != old {
			t.Fatalf("Get %v before expiry with the CA down = %v, %v; want the old certificate", time.Until(old.NotAfter), c, err)
		}
		gets++
		time.Sleep(50 * time.Millisecond)
	}
	failures := caFailures(t, reg)
	if failures < 1 {
		t.Fatalf("istio_cert_fetch_failures_total{reason=ca} = %v before expiry, want the failed renewals counted", failures)
	}
	// After expiry: no certificate rather than an expired one.
	time.Sleep(time.Until(old.NotAfter) + 100*time.Millisecond)
	if c, err := m.Get(ctx, podID); err == nil {
		t.Fatalf("Get after NotAfter returned a certificate expiring %v with the CA down", c.NotAfter)
	}
	relay.up()
	upAt := time.Now()
	var fresh *identity.Certificate
	for fresh == nil {
		if c, err := m.Get(ctx, podID); err == nil {
			fresh = c
		} else if ctx.Err() != nil {
			t.Fatalf("no certificate after the CA came back: %v", err)
		} else {
			time.Sleep(50 * time.Millisecond)
		}
	}
	if fresh == old || !fresh.NotAfter.After(old.NotAfter) {
		t.Fatalf("certificate after recovery expires %v, old one %v", fresh.NotAfter, old.NotAfter)
	}
	t.Logf("fault ca-down-during-rotation: ttl=%v ca_down_for=%v old_cert_served_gets=%d until=%v_before_expiry fetch_failures{ca}=%v recovered_in=%v",
		ttl, upAt.Sub(downAt).Round(time.Millisecond), gets, 150*time.Millisecond,
		caFailures(t, reg), time.Since(upAt).Round(time.Millisecond))
}

// caFailures reads istio_cert_fetch_failures_total{reason="ca"}.
func caFailures(t *testing.T, reg *prometheus.Registry) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "istio_cert_fetch_failures_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "reason" && l.GetValue() == "ca" {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}

// relay forwards TCP to target while up; down closes the listener and
// resets every relayed connection, as a CA pod that went away.
type relay struct {
	target string
	t      *testing.T

	mu    sync.Mutex
	ln    net.Listener
	laddr string
	conns []net.Conn
	wg    sync.WaitGroup
}

func startRelay(t *testing.T, target string) *relay {
	r := &relay{target: target, t: t}
	r.listen("127.0.0.1:0")
	t.Cleanup(func() { r.down(); r.wg.Wait() })
	return r
}

func (r *relay) addr() string { r.mu.Lock(); defer r.mu.Unlock(); return r.laddr }

func (r *relay) up() { r.listen(r.addr()) }

func (r *relay) listen(addr string) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		r.t.Fatal(err)
	}
	r.mu.Lock()
	r.ln, r.laddr = ln, ln.Addr().String()
	r.mu.Unlock()
	r.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			up, err := net.Dial("tcp", r.target)
			if err != nil {
				c.Close()
				continue
			}
			r.mu.Lock()
			r.conns = append(r.conns, c, up)
			r.mu.Unlock()
			r.wg.Go(func() { io.Copy(up, c); up.Close() })
			r.wg.Go(func() { io.Copy(c, up); c.Close() })
		}
	})
}

func (r *relay) down() {
	r.mu.Lock()
	ln, conns := r.ln, r.conns
	r.ln, r.conns = nil, nil
	r.mu.Unlock()
	if ln != nil {
		ln.Close()
	}
	for _, c := range conns {
		if tc, ok := c.(*net.TCPConn); ok {
			tc.SetLinger(0)
		}
		c.Close()
	}
}
