package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/nstest"
)

// The relay-pair scenario is the yardstick for the targets: two bare
// relays, each its own process, where the two ztunnels of hbone-cross-node
// sit — the first in the client's pod, reached over loopback as a
// redirected connection reaches ztunnel's outbound listener; the second
// in the server's pod, reached across the nodes and dialling the server
// inside that pod, as ztunnel's inbound does. Each relay accepts, dials
// the next hop and copies bytes both ways through user space with read and
// write, as any proxy that encrypts must when the kernel cannot do TLS
// (this VM has no kernel TLS). Nothing else: no TLS, no HTTP/2, no
// policy, no metrics, no logs. Its pods are the ones outside the mesh, so
// its packets also skip the mesh pods' redirect rules.
//
// The relay is what a relay written in C would be (relayloop.go): one
// thread, one level-triggered epoll set, raw system calls that keep Go's
// scheduler out of the path, and per request and direction the least a
// copying relay can do — one wake-up, one read, one write. A Go relay
// written the usual way (a goroutine per direction, net.Conn) cost more
// than ztunnel itself: 0.20 vCPU at 1000 rps against ztunnel's 0.15 on
// the same run, with 6.6 context switches per request (each blocking
// system call through the runtime wakes its sysmon thread).
//
// A ztunnel pair does at least what the relay pair does, and mTLS, HTTP/2
// and the mesh pods' redirect rules besides: a target the relay pair
// misses in a run is out of reach for any ztunnel on that machine that
// day (within the run's noise), and the gap between it and
// hbone-cross-node is what those cost. sealed-relay-pair (relayseal.go)
// adds the encryption, and so splits that gap into what sealing costs and
// what the rest does.

// relaySubcommand, as the first argument, makes the bench binary (or the
// test binary, see TestMain) a relay: relayMain.
const relaySubcommand = "relay-child"

// relayPortShift: a relay listens on each server port plus this, so the
// second relay can sit in the server's pod beside the servers.
const relayPortShift = 1000

// relayReady is the line a relay prints once every listener is open.
const relayReady = "ready"

// relayProc is a running relay process.
type relayProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	log   strings.Builder // its stderr
}

// startRelay starts a relay inside pod's network namespace: the process is
// forked from a thread inside it, so every thread of the child is too.
// GOMAXPROCS=1: the loop holds the one P while it waits in epoll_wait, so
// no other thread looks for work; asyncpreemptoff: the runtime's
// preemption signal would interrupt that wait every 10 ms (the loop still
// yields at function calls when the runtime asks, so a GC can run).
func startRelay(ctx context.Context, pod *nstest.Pod, pairs []string) (*relayProc, error) {
	return startRelayWith(ctx, pod.Name, pod.Do, pairs)
}

// startRelayWith starts a relay from inside do (which runs its function
// in the namespace the relay belongs to) and waits for it to be ready.
func startRelayWith(ctx context.Context, where string, do func(func() error) error, pairs []string) (*relayProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("bench: relay: %w", err)
	}
	r := &relayProc{cmd: exec.Command(self, append([]string{relaySubcommand}, pairs...)...)}
	r.cmd.Env = append(os.Environ(), "GOMAXPROCS=1", "GODEBUG=asyncpreemptoff=1")
	r.cmd.Stderr = &r.log
	if r.stdin, err = r.cmd.StdinPipe(); err != nil {
		return nil, fmt.Errorf("bench: relay: %w", err)
	}
	out, err := r.cmd.StdoutPipe()
	if err != nil {
		return nil, fmt.Errorf("bench: relay: %w", err)
	}
	if err := do(r.cmd.Start); err != nil {
		return nil, fmt.Errorf("bench: start relay in %s: %w", where, err)
	}
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(out).ReadString('\n')
		if err == nil && strings.TrimSpace(line) != relayReady {
			err = fmt.Errorf("said %q", line)
		}
		ready <- err
	}()
	select {
	case err = <-ready:
	case <-ctx.Done():
		err = ctx.Err()
	case <-time.After(10 * time.Second):
		err = errors.New("not ready after 10s")
	}
	if err != nil {
		r.stop()
		return nil, fmt.Errorf("bench: relay in %s: %w (stderr: %s)", where, err, strings.TrimSpace(r.log.String()))
	}
	return r, nil
}

func (r *relayProc) pid() int { return r.cmd.Process.Pid }

// stop closes the relay's stdin, which ends it, and waits for it (killing
// it if it does not go within a few seconds).
func (r *relayProc) stop() error {
	r.stdin.Close()
	exited := make(chan error, 1)
	go func() { exited <- r.cmd.Wait() }()
	select {
	case err := <-exited:
		return err
	case <-time.After(5 * time.Second):
		r.cmd.Process.Kill()
		return fmt.Errorf("bench: relay did not stop: %w", <-exited)
	}
}

// relayArg is one argument of a relay: "listen>target", IPv4
// address:port each. A side prefixed "sealed:" carries sealed records
// (relayseal.go); a target suffixed ",mss=N" is dialled with TCP_MAXSEG N.
type relayArg struct {
	listen, target         netip.AddrPort
	sealListen, sealTarget bool
	targetMSS              int
}

func parseRelayArg(a string) (relayArg, error) {
	var ra relayArg
	from, to, ok := strings.Cut(a, ">")
	if !ok {
		return ra, fmt.Errorf("relay: %q: want listen>target", a)
	}
	from, ra.sealListen = strings.CutPrefix(from, sealedPrefix)
	to, ra.sealTarget = strings.CutPrefix(to, sealedPrefix)
	to, mss, withMSS := strings.Cut(to, ",mss=")
	if withMSS {
		n, err := strconv.Atoi(mss)
		if err != nil || n <= 0 {
			return ra, fmt.Errorf("relay: %q: bad mss", a)
		}
		ra.targetMSS = n
	}
	var err error
	if ra.listen, err = netip.ParseAddrPort(from); err != nil {
		return ra, fmt.Errorf("relay: listen address: %w", err)
	}
	if ra.target, err = netip.ParseAddrPort(to); err != nil {
		return ra, fmt.Errorf("relay: target address: %w", err)
	}
	return ra, nil
}

// relayPair is the relay-pair scenario's two relays, indexed like the
// nodes they stand in for (1: the client's side, 2: the server's).
type relayPair [2]*relayProc

// startRelayPair starts the relay in the client's pod (listening on
// loopback, dialling the second relay at the server pod's address) and
// the one in the server's pod (dialling the servers there), for every
// server port. sealed: the leg between them carries sealed records
// (relayseal.go). serverMSS > 0 is the TCP_MAXSEG of the second relay's
// sockets to the servers.
func startRelayPair(ctx context.Context, client, server *nstest.Pod, sealed bool, serverMSS int) (relayPair, error) {
	var first, second []string
	for _, port := range []int{echoPort, sinkPort, slowSinkPort} {
		mid := netip.AddrPortFrom(server.IP, uint16(port+relayPortShift)).String()
		if sealed {
			mid = sealedPrefix + mid
		}
		first = append(first, netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), uint16(port+relayPortShift)).String()+">"+mid)
		target := netip.AddrPortFrom(server.IP, uint16(port)).String()
		if serverMSS > 0 {
			target += ",mss=" + strconv.Itoa(serverMSS)
		}
		second = append(second, mid+">"+target)
	}
	var rp relayPair
	var err error
	if rp[1], err = startRelay(ctx, server, second); err != nil {
		return rp, err
	}
	if rp[0], err = startRelay(ctx, client, first); err != nil {
		rp.stop()
		return rp, err
	}
	return rp, nil
}

func (rp relayPair) pid(node int) int { return rp[node-1].pid() }

func (rp relayPair) stop() error {
	var errs []error
	for _, r := range rp {
		if r != nil {
			errs = append(errs, r.stop())
		}
	}
	return errors.Join(errs...)
}

// redirectedMSS is the TCP_MAXSEG that gives a relay leg inside a pod the
// segments the same leg of a ztunnel path has, where the socket's route
// is a pod link but its packets go over loopback:
//
//   - the client's leg (client → relay 1): the kernel sizes a socket's
//     segments from the route to the address dialled, before the mesh's
//     REDIRECT sends the packets over loopback to ztunnel, so that leg
//     runs at the pod link's MTU (1 448 B of payload here, seen with ss
//     -tni); the relays' client dials 127.0.0.1 and would run at
//     loopback's 64 KiB, fewer segments and wake-ups per byte than any
//     redirected path has. Measured on 2026-12-07 (three alternating
//     pairs, -phases bulk): sealed relays 4.63 / 5.55 / 5.44 Gbit/s at the
//     redirected MSS against 6.03 / 6.36 / 6.12 at loopback's.
//   - the server's leg (relay 2 → server): ztunnel's inbound dials the
//     server from the client's address (IP_TRANSPARENT), so the server
//     announces the MSS of its route back to the client, a pod link's,
//     and both directions run at it (ss -tni: mss 1448 each way), where
//     the relay's dial from its own pod address ran at 65 483 / 32 768.
//
// The value is the MTU of the route from pod to dst less the IPv4 and TCP
// headers; the kernel takes the timestamp option off it, as it does on
// the redirected socket.
func redirectedMSS(client *nstest.Pod, dst netip.Addr) (int, error) {
	h, err := client.Netlink()
	if err != nil {
		return 0, err
	}
	defer h.Close()
	routes, err := h.RouteGet(dst.AsSlice())
	if err != nil || len(routes) == 0 {
		return 0, fmt.Errorf("bench: route from %s to %s: %v", client.Name, dst, err)
	}
	mtu := routes[0].MTU
	if mtu == 0 {
		link, err := h.LinkByIndex(routes[0].LinkIndex)
		if err != nil {
			return 0, fmt.Errorf("bench: link of the route from %s to %s: %w", client.Name, dst, err)
		}
		mtu = link.Attrs().MTU
	}
	if mtu < 576 {
		return 0, fmt.Errorf("bench: MTU %d from %s to %s", mtu, client.Name, dst)
	}
	return mtu - 40, nil
}
