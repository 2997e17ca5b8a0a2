package proxy_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"os/exec"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/ztunnel-go/ztunnel/internal/cniemu"
	"github.com/ztunnel-go/ztunnel/internal/hbone"
	"github.com/ztunnel-go/ztunnel/internal/identity"
	"github.com/ztunnel-go/ztunnel/internal/identity/identitytest"
	"github.com/ztunnel-go/ztunnel/internal/nstest"
	"github.com/ztunnel-go/ztunnel/internal/proxy"
	"github.com/ztunnel-go/ztunnel/internal/sockopt"
	"github.com/ztunnel-go/ztunnel/internal/state"
	"github.com/ztunnel-go/ztunnel/internal/workers"
	"github.com/ztunnel-go/ztunnel/internal/xds"
)

const mark = 0x539

// mesh is two nodes, each with one pod served by its own dedicated-mode
// proxy, as a sidecar-less ztunnel in the pod's own namespace would be.
type mesh struct {
	cluster     *nstest.Cluster
	client      *nstest.Pod // on node 1
	server      *nstest.Pod // on node 2
	store       *state.Store
	clientZT    *proxy.Proxy
	serverZT    *proxy.Proxy
	reg         *prometheus.Registry
	ca          identity.CA // signs every proxy's certificates
	clientCerts *identity.Manager
	serverCerts *identity.Manager
	hboneConns  atomic.Int64 // TCP connections accepted on the server's 15008
	// onServerState, if set, is called with each snapshot the server proxy
	// reads, right after the read, until it returns true: a test publishes
	// a change at the moment it picks. (A hook that fired on the next read
	// of any kind could fire before the change the test waits for.)
	onServerState atomic.Pointer[func(*state.Snapshot) bool]
	// onServerDial, if set, runs once, before the server proxy's next dial.
	onServerDial atomic.Pointer[func()]
}

const meshConfig = `
workloads:
- uid: c1//Pod/ns1/client
  name: client
  namespace: ns1
  serviceAccount: client
  workloadIps: ["%[1]s"]
  protocol: HBONE
  workloadName: client
  canonicalName: client
- uid: c1//Pod/ns2/server
  name: server
  namespace: ns2
  serviceAccount: server
  workloadIps: ["%[2]s"]
  protocol: HBONE
  workloadName: server
  canonicalName: server
  services:
    "ns2/echo.ns2.svc.cluster.local":
      80: 7000
services:
- name: echo
  namespace: ns2
  hostname: echo.ns2.svc.cluster.local
  vips: ["/10.96.0.10"]
  ports:
    80: 7000
`

func newMesh(t testing.TB, maxStreams int) *mesh { return newMeshTTL(t, maxStreams, 0) }

func newMeshTTL(t testing.TB, maxStreams int, ttl time.Duration) *mesh {
	t.Helper()
	c := nstest.NewTestCluster(t, "px"+fmt.Sprint(time.Now().UnixNano()%10000))
	n1, err := c.AddNode()
	if err != nil {
		t.Fatal(err)
	}
	n2, err := c.AddNode()
	if err != nil {
		t.Fatal(err)
	}
	cl, err := n1.AddPod("cl")
	if err != nil {
		t.Fatal(err)
	}
	sv, err := n2.AddPod("sv")
	if err != nil {
		t.Fatal(err)
	}
	// The pod VIP range must route too: services are reached through the
	// client's capture, so only the route into eth0 matters.
	for _, p := range []*nstest.Pod{cl, sv} {
		if _, err := exec.LookPath("iptables"); err != nil {
			t.Skip("proxy e2e: skipping: iptables is not installed (scripts/test installs it)")
		}
		if err := cniemu.InstallRedirect(p.Path(), cniemu.RedirectOptions{}); err != nil {
			t.Fatal(err)
		}
	}

	store, err := state.New(state.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := xds.Load("mesh.yaml", []byte(fmt.Sprintf(meshConfig, cl.IP, sv.IP)), store); err != nil {
		t.Fatal(err)
	}
	m := &mesh{cluster: c, client: cl, server: sv, store: store, reg: prometheus.NewRegistry()}
	ca := identitytest.NewLocalCA(t, "cluster.local")
	m.ca = ca
	metrics := proxy.NewMetrics(m.reg)
	if ttl == 0 {
		m.clientCerts = identitytest.NewManager(t, ca)
		m.serverCerts = identitytest.NewManager(t, ca)
	} else {
		m.clientCerts, m.serverCerts = shortLived(t, ca, ttl), shortLived(t, ca, ttl)
	}
	m.clientZT = m.startProxy(t, cl, proxy.LocalWorkload{Namespace: "ns1", Name: "client", ServiceAccount: "client"}, m.clientCerts, metrics, maxStreams, false)
	m.serverZT = m.startProxy(t, sv, proxy.LocalWorkload{Namespace: "ns2", Name: "server", ServiceAccount: "server"}, m.serverCerts, metrics, maxStreams, true)
	return m
}

type countingListener struct {
	net.Listener
	n *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err == nil {
		l.n.Add(1)
	}
	return c, err
}

func (m *mesh) startProxy(t testing.TB, pod *nstest.Pod, local proxy.LocalWorkload, certs *identity.Manager, metrics *proxy.Metrics, maxStreams int, server bool) *proxy.Proxy {
	t.Helper()
	snapshot := m.store.Snapshot
	if server {
		snapshot = func() *state.Snapshot {
			s := m.store.Snapshot()
			if hook := m.onServerState.Load(); hook != nil && (*hook)(s) {
				m.onServerState.CompareAndSwap(hook, nil)
			}
			return s
		}
	}
	dial := func(ctx context.Context, network, addr string) (net.Conn, error) {
		if server {
			if hook := m.onServerDial.Swap(nil); hook != nil {
				(*hook)()
			}
		}
		return markedDial(ctx, pod, network, addr)
	}
	pool, err := hbone.NewPool(hbone.PoolOptions{Dial: dial, TLS: proxy.PoolTLS(certs), MaxStreamsPerConn: maxStreams})
	if err != nil {
		t.Fatal(err)
	}
	// Set-up runs on kept goroutines, as in ztunnel (a few, so bursts in
	// tests also take the fresh-goroutine path).
	wctx, stopWorkers := context.WithCancel(context.Background())
	t.Cleanup(stopWorkers)
	p, err := proxy.New(proxy.Options{
		State:   snapshot,
		Pool:    pool,
		Certs:   certs,
		Dial:    dial,
		Local:   local,
		Metrics: metrics,
		Workers: workers.New(wctx, 2),
		// Live byte counts reach the metrics quickly in tests.
		MetricsFlushInterval: 50 * time.Millisecond,
	})
	if err != nil {
		t.Fatal(err)
	}
	listen := func(port int) net.Listener {
		ln, err := pod.Listen("tcp", fmt.Sprintf("0.0.0.0:%d", port))
		if err != nil {
			t.Fatal(err)
		}
		return ln
	}
	p.ServeOutbound(listen(proxy.OutboundPort))
	p.ServeInboundPlaintext(listen(proxy.InboundPlaintextPort))
	hb := listen(proxy.HBONEPort)
	if server {
		hb = countingListener{hb, &m.hboneConns}
	}
	p.ServeHBONE(hb)
	t.Cleanup(func() {
		p.Close()
		pool.Close()
	})
	return p
}

// echoBufs are echoServer's copy buffers.
var echoBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// echoServer runs in the server pod on port 7000: it copies back what it
// reads until EOF, then half-closes.
func echoServer(t testing.TB, pod *nstest.Pod) {
	t.Helper()
	ln, err := pod.Listen("tcp", netip.AddrPortFrom(pod.IP, 7000).String())
	if err != nil {
		t.Fatal(err)
	}
	serveConns(t, ln, func(c net.Conn) {
		// Hide ReadFrom and WriteTo: the runtime would splice
		// through a pipe it keeps pooled until a GC, which
		// TestE2ENoFDLeak would count as the proxy's, or allocate
		// a 32 KiB buffer per connection, which
		// BenchmarkNewConnection would count.
		buf := echoBufs.Get().(*[]byte)
		io.CopyBuffer(struct{ io.Writer }{c}, struct{ io.Reader }{c}, *buf)
		echoBufs.Put(buf)
		c.(*net.TCPConn).CloseWrite()
	})
}

// serveConns runs handle on each connection ln accepts, on a goroutine
// of its own, and closes the connection after it; the test's cleanup
// closes ln and waits for every handler.
func serveConns(t testing.TB, ln net.Listener, handle func(net.Conn)) {
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			// Not wg.Go: its wrapper is one more allocation per
			// connection, which BenchmarkNewConnection would count.
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer c.Close()
				handle(c)
			}()
		}
	})
}

func markedDial(ctx context.Context, pod *nstest.Pod, network, addr string) (net.Conn, error) {
	var c net.Conn
	err := pod.Do(func() (err error) {
		d := net.Dialer{Control: sockopt.Mark(mark)}
		c, err = d.DialContext(ctx, network, addr)
		return err
	})
	return c, err
}

func sumCounter(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, mt := range mf.GetMetric() {
			for _, lp := range mt.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					total += mt.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func shortLived(t testing.TB, ca identity.CA, ttl time.Duration) *identity.Manager {
	t.Helper()
	m, err := identity.NewManager(identity.ManagerOptions{CA: ca, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	go m.Run(ctx)
	t.Cleanup(func() { cancel(); m.Close() })
	return m
}
