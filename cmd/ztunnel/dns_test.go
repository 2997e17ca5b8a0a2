package main

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	mdns "github.com/miekg/dns"

	"github.com/ztunnel-go/ztunnel/internal/demo"
	"github.com/ztunnel-go/ztunnel/internal/nstest"
)

const (
	dnsVIP      = "10.96.0.30"
	dnsFwdName  = "www.outside.example"
	dnsSlowName = "slow.outside.example"
	// dnsForwardBudget: the default forward timeout (2 s) and slack for a
	// loaded 2-core machine.
	dnsForwardBudget = 3500 * time.Millisecond
)

// dnsAsker asks questions from somewhere (a pod, a netns).
type dnsAsker func(ctx context.Context, network, addr string) (net.Conn, error)

func ask(t *testing.T, dial dnsAsker, network, server, name string, qtype uint16) *mdns.Msg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	conn, err := dial(ctx, network, server)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	m := new(mdns.Msg)
	m.SetQuestion(mdns.Fqdn(name), qtype)
	// Longer than the forward timeout, as glibc's 5 s, to see its SERVFAIL.
	resp, _, err := (&mdns.Client{Net: network, Timeout: 5 * time.Second}).ExchangeWithConnContext(ctx, m, &mdns.Conn{Conn: conn})
	if err != nil {
		t.Fatalf("%s %s: %v", network, name, err)
	}
	return resp
}

func firstA(m *mdns.Msg) string {
	for _, rr := range m.Answer {
		if a, ok := rr.(*mdns.A); ok {
			return a.A.String()
		}
	}
	return ""
}

// checkDNS runs the acceptance questions against server from dial, over
// UDP and TCP: mesh names full and short, a forwarded name, a name whose
// resolver never answers (SERVFAIL in time), and a garbage packet after
// which the server still answers.
func checkDNS(t *testing.T, dial dnsAsker, server, fwdIP string) {
	for _, network := range []string{"udp", "tcp"} {
		for _, tc := range []struct {
			name, qname string
			rcode       int
			a           string
		}{
			{"full name", "shop.mesh.svc.cluster.local", mdns.RcodeSuccess, dnsVIP},
			{"short name", "shop", mdns.RcodeSuccess, dnsVIP},
			{"name.namespace", "shop.mesh", mdns.RcodeSuccess, dnsVIP},
			{"name.namespace.svc", "shop.mesh.svc", mdns.RcodeSuccess, dnsVIP},
			{"name outside the mesh, forwarded", dnsFwdName, mdns.RcodeSuccess, fwdIP},
			{"unknown name, upstream NXDOMAIN", "nope.outside.example", mdns.RcodeNameError, ""},
		} {
			t.Run(network+"/"+tc.name, func(t *testing.T) {
				resp := ask(t, dial, network, server, tc.qname, mdns.TypeA)
				if resp.Rcode != tc.rcode || firstA(resp) != tc.a {
					t.Errorf("%s: %s %q, want %s %q", tc.qname, mdns.RcodeToString[resp.Rcode], firstA(resp), mdns.RcodeToString[tc.rcode], tc.a)
				}
			})
		}
		t.Run(network+"/resolver never answers", func(t *testing.T) {
			start := time.Now()
			resp := ask(t, dial, network, server, dnsSlowName, mdns.TypeA)
			if took := time.Since(start); resp.Rcode != mdns.RcodeServerFailure || took > dnsForwardBudget {
				t.Errorf("%s after %v, want SERVFAIL within %v", mdns.RcodeToString[resp.Rcode], took, dnsForwardBudget)
			}
		})
		t.Run(network+"/garbage then a good query", func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			conn, err := dial(ctx, network, server)
			if err != nil {
				t.Fatal(err)
			}
			junk := []byte("\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x3f\xff\xff garbage")
			if network == "tcp" {
				junk = append([]byte{0, byte(len(junk))}, junk...)
			}
			conn.Write(junk)
			conn.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
			conn.Read(make([]byte, 512)) // FORMERR, or nothing
			conn.Close()
			if got := firstA(ask(t, dial, network, server, "shop", mdns.TypeA)); got != dnsVIP {
				t.Errorf("after garbage: %q, want %s", got, dnsVIP)
			}
		})
	}
}

// checkDNSMetrics: upstream's DNS metric names are on /metrics after the
// lookups, for both protocols, with the failed forwards counted.
func checkDNSMetrics(t *testing.T, metrics string) {
	for _, tc := range []struct {
		name   string
		labels []string
		min    float64
	}{
		{"istio_dns_requests_total", []string{`request_protocol="udp"`, `request_query_type="a"`}, 8},
		{"istio_dns_requests_total", []string{`request_protocol="tcp"`}, 8},
		{"istio_dns_upstream_requests_total", nil, 6},
		{"istio_dns_upstream_failures_total", nil, 2},
		{"istio_dns_upstream_request_duration_seconds_count", nil, 6},
		{"ztunnel_dns_errors_total", []string{`reason="forward_timeout"`}, 2},
	} {
		if got := metricSum(metrics, tc.name, tc.labels...); got < tc.min {
			t.Errorf("%s%v = %v, want at least %v", tc.name, tc.labels, got, tc.min)
		}
	}
}

// TestDNSInpod: pods of an in-pod ztunnel with istio-cni's DNS capture
// rules resolve mesh hostnames through the node's ztunnel (the app asks its
// nameserver; the rules send the query to 15053 in the pod), names outside
// the mesh are forwarded (from the pod, marked, so not captured again) to
// the cluster resolver, and the VIP it gave out carries a connection.
func TestDNSInpod(t *testing.T) {
	nstest.RequireRoot(t)
	if _, err := exec.LookPath("iptables"); err != nil {
		t.Skip("dns: skipping: iptables is not installed (scripts/test installs it)")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	m, err := demo.NewMesh(ctx, demo.MeshOptions{
		Binary: binary,
		Prefix: "zdn",
		Nodes:  1,
		Pods: []demo.MeshPodSpec{
			{Node: 1, Name: "client", Mesh: true},
			{Node: 1, Name: "shop-0", Mesh: true, WorkloadYAML: "  services:\n    \"mesh/shop.mesh.svc.cluster.local\":\n      80: 8080\n"},
			{Node: 1, Name: "kubedns"},
		},
		ExtraConfig:    fmt.Sprintf("services:\n- {name: shop, namespace: mesh, hostname: shop.mesh.svc.cluster.local, vips: [\"/%s\"], ports: {80: 8080}}\n", dnsVIP),
		DNSResolverPod: "kubedns",
	})
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	kubedns := m.Pods["kubedns"]
	stop, err := demo.ServeResolver(kubedns.Pod, map[string]netip.Addr{dnsFwdName: kubedns.IP}, dnsSlowName)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	shop := m.Pods["shop-0"]
	ln, err := shop.Listen("tcp", netip.AddrPortFrom(shop.IP, 8080).String())
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(c, "shop-0")
			c.Close()
		}
	}()

	client := m.Pods["client"]
	server := netip.AddrPortFrom(kubedns.IP, 53).String()
	checkDNS(t, client.Dial, server, kubedns.IP.String())

	// Resolve, then connect to what came back.
	vip := firstA(ask(t, client.Dial, "udp", server, "shop", mdns.TypeA))
	conn, err := client.Dial(ctx, "tcp", net.JoinHostPort(vip, "80"))
	if err != nil {
		t.Fatal(err)
	}
	conn.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(conn).ReadString('\n')
	conn.Close()
	if line != "shop-0\n" {
		t.Errorf("connection to %s:80 got %q (%v), want shop-0", vip, line, err)
	}

	_, body, err := m.Nodes[0].Get(ctx, "127.0.0.1:15020", "/metrics", 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	checkDNSMetrics(t, string(body))
	if got := metricSum(string(body), "istio_dns_requests_total", `source_canonical_service="client"`); got == 0 {
		t.Error("no istio_dns_requests_total with the client's canonical service")
	}

	// The DNS sockets go with the pod's other listeners when it leaves.
	if err := m.Nodes[0].CNI.RemovePod(ctx, "uid-client"); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		conn, err := client.Dial(ctx, "tcp", "127.0.0.1:15053")
		if err != nil {
			break
		}
		conn.Close()
		if time.Now().After(deadline) {
			t.Fatal("127.0.0.1:15053 still accepts in a removed pod")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if t.Failed() {
		b, _ := os.ReadFile(m.Nodes[0].LogPath)
		t.Logf("ztunnel log:\n%s", b)
	}
}

// TestDNSDedicated: a ztunnel in dedicated mode answers on localhost:15053
// of its own netns (no capture rules: clients ask it directly).
func TestDNSDedicated(t *testing.T) {
	c := nstest.NewTestCluster(t, "zdd2")
	n, err := c.AddNode()
	if err != nil {
		t.Fatal(err)
	}
	p, err := n.AddPod("w")
	if err != nil {
		t.Fatal(err)
	}
	resolver, err := n.AddPod("kubedns")
	if err != nil {
		t.Fatal(err)
	}
	stop, err := demo.ServeResolver(resolver, map[string]netip.Addr{dnsFwdName: resolver.IP}, dnsSlowName)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	dir := t.TempDir()
	cfgPath := filepath.Join(dir, "mesh.yaml")
	os.WriteFile(cfgPath, []byte(fmt.Sprintf(`workloads:
- {uid: c//Pod/mesh/w, name: w, namespace: mesh, serviceAccount: w, workloadIps: ["%s"], protocol: HBONE, canonicalName: w}
services:
- {name: shop, namespace: mesh, hostname: shop.mesh.svc.cluster.local, vips: ["/%s"]}
`, p.IP, dnsVIP)), 0o600)
	resolvPath := filepath.Join(dir, "resolv.conf")
	os.WriteFile(resolvPath, []byte("search mesh.svc.cluster.local svc.cluster.local cluster.local\nnameserver "+resolver.IP.String()+"\n"), 0o600)
	logPath := startDedicated(t, p, cfgPath, "DNS_RESOLV_CONF="+resolvPath)
	checkDNS(t, p.Dial, "127.0.0.1:15053", resolver.IP.String())
	checkDNSMetrics(t, scrape(t, p.NS))
	if t.Failed() {
		t.Logf("ztunnel log:\n%s", readFile(logPath))
	}
}

// startDedicated runs ztunnel in dedicated mode for mesh/w inside p and
// waits until it is ready; it returns the log's path.
func startDedicated(t *testing.T, p *nstest.Pod, cfgPath string, env ...string) string {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), "zt.log")
	logf, _ := os.Create(logPath)
	t.Cleanup(func() { logf.Close() })
	cmd := exec.Command(binary)
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "PROXY_MODE=dedicated", "PROXY_WORKLOAD_INFO=mesh/w/w",
		"LOCAL_XDS_PATH=" + cfgPath, "FAKE_CA=true", "XDS_ADDRESS="}, env...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := p.Do(cmd.Start); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Signal(os.Interrupt); cmd.Wait() })
	deadline := time.Now().Add(15 * time.Second)
	for {
		if code, _, _ := nsGet(p.NS, "127.0.0.1:15021", "/healthz/ready"); code == 200 {
			return logPath
		}
		if time.Now().After(deadline) {
			t.Fatalf("ztunnel not ready\n%s", readFile(logPath))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestDNSSettings: ISTIO_META_DNS_CAPTURE=false leaves 15053 closed;
// ISTIO_META_DNS_PROXY_ADDR moves the proxy.
func TestDNSSettings(t *testing.T) {
	c := nstest.NewTestCluster(t, "zds")
	n, err := c.AddNode()
	if err != nil {
		t.Fatal(err)
	}
	cfgPath := filepath.Join(t.TempDir(), "mesh.yaml")
	os.WriteFile(cfgPath, []byte(fmt.Sprintf("services:\n- {name: shop, namespace: mesh, hostname: shop.mesh.svc.cluster.local, vips: [\"/%s\"]}\n", dnsVIP)), 0o600)
	for _, tc := range []struct {
		name   string
		env    []string
		closed string // must refuse TCP
		open   string // must answer "shop"
	}{
		{"capture off", []string{"ISTIO_META_DNS_CAPTURE=false"}, "127.0.0.1:15053", ""},
		{"moved", []string{"ISTIO_META_DNS_PROXY_ADDR=127.0.0.1:5353"}, "127.0.0.1:15053", "127.0.0.1:5353"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, err := n.AddPod(strings.ReplaceAll(tc.name, " ", ""))
			if err != nil {
				t.Fatal(err)
			}
			startDedicated(t, p, cfgPath, append(tc.env, "DNS_RESOLV_CONF=/dev/null")...)
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if conn, err := p.Dial(ctx, "tcp", tc.closed); err == nil {
				conn.Close()
				t.Errorf("%s accepts connections", tc.closed)
			}
			if tc.open != "" {
				if got := firstA(ask(t, p.Dial, "udp", tc.open, "shop", mdns.TypeA)); got != dnsVIP {
					t.Errorf("%s answered %q, want %s", tc.open, got, dnsVIP)
				}
			}
		})
	}
}
