package identity_test

import (
	"context"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"encoding/pem"
	"errors"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ztunnel-go/ztunnel/internal/identity"
)

// testCA wraps a LocalCA: it counts calls, can fail, and can hold calls
// until released.
type testCA struct {
	ca *identity.LocalCA

	mu    sync.Mutex
	calls []time.Time // guarded by mu
	fail  error       // guarded by mu
	gate  chan struct{}
}

func newTestCA(t testing.TB) *testCA {
	ca, err := identity.NewLocalCA("")
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{ca: ca}
}

func (c *testCA) Sign(ctx context.Context, csr []byte, id identity.Identity, ttl time.Duration) ([]*x509.Certificate, []*x509.Certificate, error) {
	c.mu.Lock()
	c.calls = append(c.calls, time.Now())
	fail, gate := c.fail, c.gate
	c.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return nil, nil, ctx.Err()
		}
	}
	if fail != nil {
		return nil, nil, fail
	}
	return c.ca.Sign(ctx, csr, id, ttl)
}

func (c *testCA) set(fail error, gate chan struct{}) {
	c.mu.Lock()
	c.fail, c.gate = fail, gate
	c.mu.Unlock()
}

func (c *testCA) callTimes() []time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]time.Time(nil), c.calls...)
}

func newManager(t testing.TB, opts identity.ManagerOptions) *identity.Manager {
	t.Helper()
	m, err := identity.NewManager(opts)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

var (
	idA = identity.New("", "ns", "a")
	idB = identity.New("", "ns", "b")
)

func TestManagerCoalescesFirstFetch(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ca := newTestCA(t)
		gate := make(chan struct{})
		ca.set(nil, gate)
		m := newManager(t, identity.ManagerOptions{CA: ca})
		defer m.Close()

		const n = 50
		got := make(chan *identity.Certificate, n)
		for range n {
			go func() {
				c, err := m.Get(context.Background(), idA)
				if err != nil {
					t.Errorf("Get: %v", err)
				}
				got <- c
			}()
		}
		synctest.Wait() // all 50 blocked: one in the CA, 49 waiting for it
		if calls := len(ca.callTimes()); calls != 1 {
			t.Fatalf("CA calls while %d Gets wait = %d, want 1", n, calls)
		}
		close(gate)
		first := <-got
		for range n - 1 {
			if c := <-got; c != first {
				t.Fatal("concurrent Gets returned different certificates")
			}
		}
		if calls := len(ca.callTimes()); calls != 1 {
			t.Fatalf("CA calls = %d, want 1", calls)
		}
		if first.Identity != idA || first.Leaf().URIs[0].String() != idA.String() {
			t.Fatalf("certificate for %v", first.Identity)
		}
	})
}

func TestManagerRenewsInBackground(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ca := newTestCA(t)
		m := newManager(t, identity.ManagerOptions{CA: ca, TTL: 2 * time.Second})
		defer m.Close()
		ctx := context.Background()

		old, err := m.Get(ctx, idA)
		if err != nil {
			t.Fatal(err)
		}
		if life := old.NotAfter.Sub(old.NotBefore); life != 2*time.Second {
			t.Fatalf("certificate life %s, want 2s", life)
		}
		gate := make(chan struct{})
		ca.set(nil, gate)
		time.Sleep(1200 * time.Millisecond) // past half life ±5%
		synctest.Wait()
		calls := ca.callTimes()
		if len(calls) != 2 {
			t.Fatalf("CA calls after 1.2s = %d, want 2 (renewal in flight)", len(calls))
		}
		if renewAt := calls[1].Sub(old.NotBefore); renewAt < 900*time.Millisecond || renewAt > 1100*time.Millisecond {
			t.Fatalf("renewal started %s into a 2s certificate, want ~1s", renewAt)
		}
		// The renewal is held by the CA: Get must not wait for it.
		if c, err := m.Get(ctx, idA); err != nil || c != old {
			t.Fatalf("Get during renewal = %v, %v; want the old certificate", c, err)
		}
		close(gate)
		synctest.Wait()
		renewed, err := m.Get(ctx, idA)
		if err != nil {
			t.Fatal(err)
		}
		if renewed == old || !renewed.NotAfter.After(old.NotAfter) {
			t.Fatalf("after renewal Get returned NotAfter %s, old %s", renewed.NotAfter, old.NotAfter)
		}
		if !time.Now().Before(old.NotAfter) {
			t.Fatal("renewal finished only after the old certificate expired")
		}
	})
}

func TestManagerFailuresKeepServingUntilExpiry(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ca := newTestCA(t)
		m := newManager(t, identity.ManagerOptions{CA: ca, TTL: 10 * time.Second})
		defer m.Close()
		ctx := context.Background()
		start := time.Now()

		old, err := m.Get(ctx, idA)
		if err != nil {
			t.Fatal(err)
		}
		injected := errors.New("CA is down")
		ca.set(injected, nil)

		time.Sleep(9 * time.Second)
		synctest.Wait()
		if c, err := m.Get(ctx, idA); err != nil || c != old {
			t.Fatalf("Get at 9s with failing renewals = %v, %v; want the old certificate", c, err)
		}
		if n := len(ca.callTimes()); n < 3 {
			t.Fatalf("CA calls by 9s = %d, want a renewal and retries (>= 3)", n)
		}
		time.Sleep(2 * time.Second) // old expired at 10s
		synctest.Wait()
		if _, err := m.Get(ctx, idA); !errors.Is(err, injected) {
			t.Fatalf("Get after expiry error = %v, want %v", err, injected)
		}
		if d := m.Dump(); len(d) != 1 || d[0].State != "Unavailable: CA is down" {
			t.Fatalf("Dump = %+v", d)
		}
		calls := ca.callTimes()
		for i := 2; i < len(calls); i++ {
			if gap := calls[i].Sub(calls[i-1]); gap < 800*time.Millisecond {
				t.Fatalf("retry %d came %s after the previous one; want backoff >= 0.8s", i, gap)
			}
		}
		ca.set(nil, nil)
		time.Sleep(10 * time.Second) // next retry is at most 8s*1.2 away
		synctest.Wait()
		c, err := m.Get(ctx, idA)
		if err != nil || c == old {
			t.Fatalf("Get after CA recovery = %v, %v", c, err)
		}
		if elapsed := time.Since(start); elapsed > 25*time.Second {
			t.Fatalf("took %s", elapsed)
		}
	})
}

func TestManagerFirstFetchFailureIsReturned(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ca := newTestCA(t)
		injected := errors.New("denied")
		ca.set(injected, nil)
		m := newManager(t, identity.ManagerOptions{CA: ca})
		defer m.Close()
		if _, err := m.Get(context.Background(), idA); !errors.Is(err, injected) {
			t.Fatalf("Get = %v, want %v", err, injected)
		}
		// Failing fast: no new CA call per Get while backing off.
		if _, err := m.Get(context.Background(), idA); !errors.Is(err, injected) {
			t.Fatalf("second Get = %v", err)
		}
		if n := len(ca.callTimes()); n != 1 {
			t.Fatalf("CA calls = %d, want 1", n)
		}
		ca.set(nil, nil)
		time.Sleep(1300 * time.Millisecond)
		synctest.Wait()
		if _, err := m.Get(context.Background(), idA); err != nil {
			t.Fatalf("Get after retry: %v", err)
		}
	})
}

func TestManagerInvalidResponse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewRegistry()
		m := newManager(t, identity.ManagerOptions{CA: otherKeyCA{newTestCA(t)}, Registerer: reg})
		defer m.Close()
		_, err := m.Get(context.Background(), idA)
		if err == nil || !strings.Contains(err.Error(), "leaf public key does not match the CSR key") {
			t.Fatalf("Get = %v, want a key mismatch", err)
		}
		if v := metricValue(t, reg, "istio_cert_fetch_failures_total", "reason", "invalid"); v != 1 {
			t.Fatalf("invalid failures = %v, want 1", v)
		}
	})
}

// otherKeyCA ignores the CSR and certifies a key of its own.
type otherKeyCA struct{ *testCA }

func (c otherKeyCA) Sign(ctx context.Context, _ []byte, id identity.Identity, ttl time.Duration) ([]*x509.Certificate, []*x509.Certificate, error) {
	csr, _, err := identity.GenerateCSR(id)
	if err != nil {
		return nil, nil, err
	}
	return c.testCA.ca.Sign(ctx, csr, id, ttl)
}

func TestManagerForget(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ca := newTestCA(t)
		m := newManager(t, identity.ManagerOptions{CA: ca})
		defer m.Close()
		ctx := context.Background()
		first, err := m.Get(ctx, idA)
		if err != nil {
			t.Fatal(err)
		}
		m.Forget(idA)
		if d := m.Dump(); len(d) != 0 {
			t.Fatalf("Dump after Forget = %+v", d)
		}
		again, err := m.Get(ctx, idA)
		if err != nil || again == first {
			t.Fatalf("Get after Forget = %v, %v; want a fresh certificate", again, err)
		}
		if n := len(ca.callTimes()); n != 2 {
			t.Fatalf("CA calls = %d, want 2", n)
		}

		// Forget while the first fetch is in flight fails its waiters.
		gate := make(chan struct{})
		ca.set(nil, gate)
		errc := make(chan error, 1)
		go func() {
			_, err := m.Get(ctx, idB)
			errc <- err
		}()
		synctest.Wait()
		m.Forget(idB)
		if err := <-errc; !errors.Is(err, identity.ErrForgotten) {
			t.Fatalf("waiting Get = %v, want ErrForgotten", err)
		}
		close(gate)
	})
}

func TestManagerForgetsIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ca := newTestCA(t)
		m := newManager(t, identity.ManagerOptions{CA: ca, IdleTimeout: 10 * time.Minute})
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error)
		go func() { done <- m.Run(ctx) }()
		if _, err := m.Get(ctx, idA); err != nil {
			t.Fatal(err)
		}
		for range 16 { // idB stays in use, idA does not
			if _, err := m.Get(ctx, idB); err != nil {
				t.Fatal(err)
			}
			time.Sleep(time.Minute)
		}
		synctest.Wait()
		d := m.Dump()
		if len(d) != 1 || d[0].Identity != idB.String() {
			t.Fatalf("Dump after idle period = %+v, want only %s", d, idB)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatalf("Run = %v", err)
		}
		// Run's context ending closed the Manager.
		if _, err := m.Get(context.Background(), idB); !errors.Is(err, identity.ErrClosed) {
			t.Fatalf("Get after Run returned = %v, want ErrClosed", err)
		}
	})
}

func TestManagerClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ca := newTestCA(t)
		gate := make(chan struct{})
		ca.set(nil, gate)
		m := newManager(t, identity.ManagerOptions{CA: ca})
		errc := make(chan error, 1)
		go func() {
			_, err := m.Get(context.Background(), idA)
			errc <- err
		}()
		synctest.Wait()
		if err := m.Close(); err != nil {
			t.Fatal(err)
		}
		if err := m.Close(); err != nil {
			t.Fatalf("second Close = %v", err)
		}
		if err := <-errc; !errors.Is(err, identity.ErrClosed) {
			t.Fatalf("waiting Get = %v, want ErrClosed", err)
		}
		if err := m.Prefetch(idB); !errors.Is(err, identity.ErrClosed) {
			t.Fatalf("Prefetch after Close = %v", err)
		}
		if err := m.Run(context.Background()); err != nil {
			t.Fatalf("Run after Close = %v", err)
		}
	})
}

func TestManagerGetHonoursContext(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ca := newTestCA(t)
		gate := make(chan struct{})
		ca.set(nil, gate)
		m := newManager(t, identity.ManagerOptions{CA: ca})
		defer m.Close()
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if _, err := m.Get(ctx, idA); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Get = %v, want DeadlineExceeded", err)
		}
		close(gate)
		synctest.Wait()
		if _, err := m.Get(context.Background(), idA); err != nil {
			t.Fatalf("Get after the CA answered: %v", err)
		}
	})
}

func TestManagerMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewRegistry()
		ca := newTestCA(t)
		m := newManager(t, identity.ManagerOptions{CA: ca, Registerer: reg, TTL: time.Hour})
		defer m.Close()
		if _, err := m.Get(context.Background(), idA); err != nil {
			t.Fatal(err)
		}
		ca.set(errors.New("down"), nil)
		if _, err := m.Get(context.Background(), idB); err == nil {
			t.Fatal("Get succeeded with a failing CA")
		}
		time.Sleep(10 * time.Minute)
		synctest.Wait()
		for _, tc := range []struct {
			name, label, value string
			want               float64
		}{
			{name: "istio_certs_managed", want: 2},
			{name: "istio_cert_expiry_seconds", label: "identity", value: idA.String(), want: 50 * 60},
			{name: "istio_cert_fetch_failures_total", label: "reason", value: "csr", want: 0},
		} {
			if got := metricValue(t, reg, tc.name, tc.label, tc.value); got != tc.want {
				t.Errorf("%s{%s=%q} = %v, want %v", tc.name, tc.label, tc.value, got, tc.want)
			}
		}
		fetches := metricValue(t, reg, "istio_cert_fetch_total", "", "")
		caFailures := metricValue(t, reg, "istio_cert_fetch_failures_total", "reason", "ca")
		if fetches < 3 || caFailures != fetches-1 {
			t.Errorf("fetches %v, ca failures %v: want every fetch after the first to fail", fetches, caFailures)
		}
	})
}

// metricValue returns the value of the series of name whose label has
// value (label "" for an unlabelled metric).
func metricValue(t testing.TB, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, mt := range f.GetMetric() {
			match := label == ""
			for _, lp := range mt.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					match = true
				}
			}
			if !match {
				continue
			}
			switch {
			case mt.Counter != nil:
				return mt.GetCounter().GetValue()
			case mt.Gauge != nil:
				return mt.GetGauge().GetValue()
			}
		}
	}
	t.Fatalf("no series %s{%s=%q}", name, label, value)
	return 0
}

func TestManagerDump(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ca := newTestCA(t)
		m := newManager(t, identity.ManagerOptions{CA: ca})
		defer m.Close()
		c, err := m.Get(context.Background(), idB)
		if err != nil {
			t.Fatal(err)
		}
		gate := make(chan struct{})
		ca.set(nil, gate)
		if err := m.Prefetch(idA); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()

		raw, err := json.Marshal(m.Dump())
		if err != nil {
			t.Fatal(err)
		}
		var got []map[string]any
		if err := json.Unmarshal(raw, &got); err != nil {
			t.Fatal(err)
		}
		if len(got) != 2 {
			t.Fatalf("dump has %d entries: %s", len(got), raw)
		}
		init, avail := got[0], got[1] // sorted: .../sa/a then .../sa/b
		if init["identity"] != idA.String() || init["state"] != "Initializing" {
			t.Fatalf("first entry %v", init)
		}
		if chain, ok := init["certChain"].([]any); !ok || len(chain) != 0 {
			t.Fatalf("Initializing certChain = %#v, want []", init["certChain"])
		}
		if avail["identity"] != idB.String() || avail["state"] != "Available" {
			t.Fatalf("second entry %v", avail)
		}
		chain := avail["certChain"].([]any)
		roots := avail["rootCerts"].([]any)
		if len(chain) != 1 || len(roots) != 1 {
			t.Fatalf("chain %d roots %d", len(chain), len(roots))
		}
		leaf := chain[0].(map[string]any)
		if len(leaf) != 4 {
			t.Fatalf("certificate entry has keys %v, want pem serialNumber validFrom expirationTime", leaf)
		}
		pemText, err := base64.StdEncoding.DecodeString(leaf["pem"].(string))
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := pem.Decode(pemText); b == nil || b.Type != "CERTIFICATE" || string(b.Bytes) != string(c.Leaf().Raw) {
			t.Fatal("pem is not the base64 of the leaf's PEM")
		}
		if strings.Contains(string(raw), "PRIVATE") {
			t.Fatal("dump mentions a private key")
		}
		for k, want := range map[string]string{
			"serialNumber":   c.Leaf().SerialNumber.String(),
			"validFrom":      c.NotBefore.UTC().Format(time.RFC3339),
			"expirationTime": c.NotAfter.UTC().Format(time.RFC3339),
		} {
			if leaf[k] != want {
				t.Errorf("%s = %v, want %s", k, leaf[k], want)
			}
		}
		close(gate)
	})
}
