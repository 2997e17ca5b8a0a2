package demo

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/netip"
	"strings"
	"text/tabwriter"
	"time"
)

// result is one path's outcome.
type result struct {
	path, dst, expect string
	got               string // "ok <who>" or "refused: <why>"
	allowed           bool
	latency           time.Duration
	bytes             int
	wantAllowed       bool
	wantFrom          []string // pods that may answer
}

func (r result) ok() bool {
	if r.allowed != r.wantAllowed {
		return false
	}
	if !r.allowed {
		return true
	}
	for _, w := range r.wantFrom {
		if strings.HasPrefix(r.got, "ok "+w) {
			return true
		}
	}
	return false
}

func runPaths(ctx context.Context, pods map[string]*MeshPod) []result {
	client := pods["client"]
	ap := func(name string, port int) string {
		return netip.AddrPortFrom(pods[name].IP, uint16(port)).String()
	}
	paths := []result{
		{path: "same node (HBONE, node1 → node1)", dst: ap("echo-a", echoPort), expect: "allowed", wantAllowed: true, wantFrom: []string{"echo-a"}},
		{path: "cross node (HBONE, node1 → node2)", dst: ap("echo-b", echoPort), expect: "allowed", wantAllowed: true, wantFrom: []string{"echo-b"}},
		{path: "service VIP (echo.demo, 2 endpoints)", dst: serviceVIP + ":80", expect: "allowed", wantAllowed: true, wantFrom: []string{"echo-a", "echo-b"}},
		{path: "denied by policy (port 9090)", dst: ap("echo-b", adminPort), expect: "denied", wantAllowed: false},
		{path: "non-mesh destination (passthrough)", dst: ap("outside", echoPort), expect: "allowed", wantAllowed: true, wantFrom: []string{"outside"}},
	}
	for i := range paths {
		send(ctx, client, &paths[i])
	}
	// The client's nameserver is the stand-in resolver in the outside pod;
	// its DNS capture rules hand every query to node1's ztunnel instead.
	resolver := netip.AddrPortFrom(pods["outside"].IP, 53).String()
	paths = append(paths,
		dnsPath(ctx, client, resolver, "DNS (mesh hostname → VIP)", "echo", 80, "echo-a", "echo-b"),
		dnsPath(ctx, client, resolver, "DNS (other name, forwarded)", outsideName, echoPort, "outside"),
	)
	return paths
}

// dnsPath resolves name (short, as an app would) from the client pod, then
// connects to what it resolved to on port.
func dnsPath(ctx context.Context, client *MeshPod, resolver, path, name string, port int, wantFrom ...string) result {
	r := result{path: path, dst: name, expect: "allowed", wantAllowed: true, wantFrom: wantFrom}
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	ip, err := resolveA(lctx, client.Pod, resolver, name)
	if err != nil {
		r.got = "refused: " + err.Error()
		return r
	}
	r.dst = netip.AddrPortFrom(ip, uint16(port)).String()
	send(ctx, client, &r)
	r.dst = name + " → " + r.dst
	return r
}

// send makes one request from the client pod; the client dials the real
// destination and its iptables rules send it through ztunnel.
func send(ctx context.Context, client *MeshPod, r *result) {
	start := time.Now()
	dctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	c, err := client.Dial(dctx, "tcp", r.dst)
	if err != nil {
		r.got = "refused: " + err.Error()
		return
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	req := "hello from client " + strings.Repeat("x", 1000) + "\n"
	if _, err := io.WriteString(c, req); err != nil {
		r.got = "refused: " + err.Error()
		return
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	r.latency = time.Since(start)
	if err != nil {
		switch {
		case err == io.EOF:
			r.got = "refused: closed without an answer"
		case strings.Contains(err.Error(), "reset"):
			r.got = "refused: connection reset"
		default:
			r.got = "refused: " + err.Error()
		}
		return
	}
	who, _, _ := strings.Cut(line, ":")
	r.allowed = true
	r.bytes = len(req) + len(line)
	r.got = "ok " + who
}

func printTable(out io.Writer, rs []result) {
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "PATH\tDESTINATION\tEXPECTED\tRESULT\tLATENCY\tBYTES\t")
	for _, r := range rs {
		mark := "PASS"
		if !r.ok() {
			mark = "FAIL"
		}
		lat := "-"
		if r.allowed {
			lat = r.latency.Round(10 * time.Microsecond).String()
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s [%s]\t%s\t%d\t\n", r.path, r.dst, r.expect, short(r.got), mark, lat, r.bytes)
	}
	tw.Flush()
}

func short(s string) string {
	if len(s) > 60 {
		return s[:57] + "..."
	}
	return s
}

func printExplore(out io.Writer, nodes []*MeshNode) {
	fmt.Fprintln(out, "\nexplore (each ztunnel's admin listens on 127.0.0.1 inside its node namespace):")
	for _, n := range nodes {
		fmt.Fprintf(out, "  node%d: ip netns exec %s curl -s localhost:15000/config_dump | less\n", n.Index, n.Name)
		fmt.Fprintf(out, "         ip netns exec %s curl -s localhost:15020/metrics | grep istio_tcp\n", n.Name)
		fmt.Fprintf(out, "         log: %s\n", n.LogPath)
	}
}
