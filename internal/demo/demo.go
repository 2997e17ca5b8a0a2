package demo

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"sync"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/nstest"
)

// Options configure a demo run.
type Options struct {
	// Binary is the ztunnel executable to run on each node.
	Binary string
	// Keep waits for ctx to end before cleaning up.
	Keep bool
	// Out receives the report.
	Out io.Writer
	// Prefix names the namespaces (default "zd").
	Prefix string
}

const (
	echoPort   = 8080
	adminPort  = 9090 // the port the DENY policy protects
	serviceVIP = "10.96.0.10"
	// outsideName is known only to the stand-in cluster resolver (in the
	// outside pod), not to the mesh: ztunnel forwards it.
	outsideName = "web.outside.example"
)

// Run builds the cluster, runs the paths, prints the table and cleans up.
// It returns an error if any path did not give its expected result.
func Run(ctx context.Context, opts Options) error {
	if opts.Prefix == "" {
		opts.Prefix = "zd"
	}
	out := opts.Out
	fmt.Fprintln(out, "building the cluster: 2 nodes, 4 pods (3 in the mesh)")
	services := fmt.Sprintf("  services:\n    \"demo/echo.demo.svc.cluster.local\":\n      80: %d\n", echoPort)
	m, err := NewMesh(ctx, MeshOptions{
		Binary:    opts.Binary,
		Prefix:    opts.Prefix,
		Nodes:     2,
		Namespace: "demo",
		Pods: []MeshPodSpec{
			{Node: 1, Name: "client", ServiceAccount: "client", Mesh: true},
			{Node: 1, Name: "echo-a", ServiceAccount: "echo", Mesh: true, WorkloadYAML: services},
			{Node: 2, Name: "echo-b", ServiceAccount: "echo", Mesh: true, WorkloadYAML: services},
			{Node: 2, Name: "outside"},
		},
		ExtraConfig:    extraConfig,
		DNSResolverPod: "outside",
	})
	if m != nil {
		defer func() {
			m.Close()
			fmt.Fprintln(out, "cleaned up: namespaces, veths, iptables rules, sockets and temp files removed")
		}()
	}
	if err != nil {
		return err
	}
	for _, name := range []string{"echo-a", "echo-b", "outside"} {
		stop, err := serveEcho(m.Pods[name].Pod, name)
		if err != nil {
			return err
		}
		defer stop()
	}
	outside := m.Pods["outside"]
	stopResolver, err := ServeResolver(outside.Pod, map[string]netip.Addr{outsideName: outside.IP})
	if err != nil {
		return err
	}
	defer stopResolver()
	fmt.Fprintln(out, "both ztunnels ready; sending traffic from client (node1)")

	results := runPaths(ctx, m.Pods)
	printTable(out, results)
	failed := 0
	for _, r := range results {
		if !r.ok() {
			failed++
		}
	}
	printExplore(out, m.Nodes)
	if opts.Keep && ctx.Err() == nil {
		fmt.Fprintln(out, "--keep: the cluster stays up; press Ctrl-C to clean up")
		<-ctx.Done()
	}
	if failed > 0 {
		return fmt.Errorf("demo: %d of %d paths did not give the expected result", failed, len(results))
	}
	if ctx.Err() != nil && !opts.Keep {
		return ctx.Err()
	}
	return nil
}

// serveEcho answers on echoPort and adminPort in the pod: it reads one
// request line and answers "<pod>: <line>".
func serveEcho(p *nstest.Pod, name string) (func(), error) {
	var lns []net.Listener
	var wg sync.WaitGroup
	for _, port := range []int{echoPort, adminPort} {
		ln, err := p.Listen("tcp", netip.AddrPortFrom(p.IP, uint16(port)).String())
		if err != nil {
			return nil, err
		}
		lns = append(lns, ln)
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				go func() {
					defer c.Close()
					c.SetDeadline(time.Now().Add(10 * time.Second))
					line, err := bufio.NewReader(c).ReadString('\n')
					if err != nil {
						return
					}
					fmt.Fprintf(c, "%s: %s", name, line)
				}()
			}
		}()
	}
	return func() {
		for _, ln := range lns {
			ln.Close()
		}
		wg.Wait()
	}, nil
}

// extraConfig is the demo's service and its one DENY policy.
var extraConfig = fmt.Sprintf(`services:
- name: echo
  namespace: demo
  hostname: echo.demo.svc.cluster.local
  vips: ["/%s"]
  ports:
    80: %d
policies:
- name: deny-client-to-admin
  namespace: demo
  scope: Namespace
  action: Deny
  rules:
  - - - principals:
          - Exact: cluster.local/ns/demo/sa/client
    - - destinationPorts: [%d]
`, serviceVIP, echoPort, adminPort)
