package inpod_test

import (
	"context"
	"errors"
	"io"
	"net"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/ztunnel-go/ztunnel/internal/cniemu"
	"github.com/ztunnel-go/ztunnel/internal/inpod"
	"github.com/ztunnel-go/ztunnel/internal/inpod/zdspb"
	"github.com/ztunnel-go/ztunnel/internal/nstest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// listenServer is a PodServer that opens 127.0.0.1:15008 inside the pod
// netns and answers each connection with the pod's uid.
type listenServer struct {
	mu      sync.Mutex
	starts  int
	drains  []drain
	changed chan struct{} // closed and replaced on every drain
}

type drain struct {
	uid      string
	graceful bool
}

func newListenServer() *listenServer { return &listenServer{changed: make(chan struct{})} }

type listenPod struct {
	srv  *listenServer
	uid  string
	ln   net.Listener
	done chan struct{}
}

func (s *listenServer) StartPod(ctx context.Context, uid string, info inpod.WorkloadInfo, ns *inpod.Netns) (inpod.Pod, error) {
	s.mu.Lock()
	s.starts++
	s.mu.Unlock()
	ln, err := ns.Listen("tcp", "127.0.0.1:15008", inpod.ListenTransparent(false))
	if err != nil {
		return nil, err
	}
	p := &listenPod{srv: s, uid: uid, ln: ln, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Write([]byte(uid))
			c.Close()
		}
	}()
	return p, nil
}

func (p *listenPod) Drain(ctx context.Context) error {
	p.ln.Close()
	<-p.done
	s := p.srv
	s.mu.Lock()
	defer s.mu.Unlock()
	s.drains = append(s.drains, drain{uid: p.uid, graceful: ctx.Err() == nil})
	close(s.changed)
	s.changed = make(chan struct{})
	return nil
}

func (s *listenServer) waitDrains(t *testing.T, n int) []drain {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		s.mu.Lock()
		got, ch := append([]drain(nil), s.drains...), s.changed
		s.mu.Unlock()
		if len(got) >= n {
			return got
		}
		select {
		case <-ch:
		case <-deadline:
			t.Fatalf("waited for %d drains, have %d", n, len(got))
		}
	}
}

func (s *listenServer) startCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.starts
}

func sockPath(t *testing.T) string {
	dir, err := os.MkdirTemp("", "zds")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir + "/ztunnel.sock"
}

// startAgent runs a CNI emulator on path until the test ends (or stop).
func startAgent(t *testing.T, path string) (agent *cniemu.Server, stop func()) {
	t.Helper()
	agent, err := cniemu.New(cniemu.Options{Path: path, KeepaliveInterval: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- agent.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("agent Run: %v", err)
			}
			agent.Close()
		})
	}
	t.Cleanup(stop)
	return agent, stop
}

type runningClient struct {
	*inpod.Client

	mu     sync.Mutex
	events []bool        // guarded by mu: readiness changes not yet seen by waitReady
	signal chan struct{} // one pending wake-up for waitReady
}

// onReady records a readiness change without ever blocking the client
// (a bounded channel here once filled up under load and hung the client's
// Run, and with it the test's cleanup).
func (rc *runningClient) onReady(r bool) {
	rc.mu.Lock()
	rc.events = append(rc.events, r)
	rc.mu.Unlock()
	select {
	case rc.signal <- struct{}{}:
	default:
	}
}

// next returns the oldest readiness change not yet seen.
func (rc *runningClient) next() (r, ok bool) {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.events) == 0 {
		return false, false
	}
	r = rc.events[0]
	rc.events = rc.events[1:]
	return r, true
}

func startClient(t *testing.T, path string, srv inpod.PodServer, setup ...func(*inpod.Client)) *runningClient {
	t.Helper()
	rc := &runningClient{signal: make(chan struct{}, 1)}
	c, err := inpod.New(inpod.Options{
		UDSPath: path, PodServer: srv,
		Netns:   inpod.NetnsOptions{Mark: 0x539, ReusePort: true},
		OnReady: rc.onReady,
	})
	if err != nil {
		t.Fatal(err)
	}
	rc.Client = c
	for _, f := range setup {
		f(c)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := c.Shutdown(ctx); err != nil {
			t.Errorf("Shutdown: %v", err)
		}
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
	})
	return rc
}

func (rc *runningClient) waitReady(t *testing.T, want bool) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		for r, ok := rc.next(); ok; r, ok = rc.next() {
			if r == want {
				return
			}
		}
		select {
		case <-rc.signal:
		case <-timeout:
			t.Fatalf("readiness never became %v", want)
		}
	}
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func openNS(t *testing.T, ns *nstest.NS) *os.File {
	f, err := os.Open(ns.Path())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// hello dials 127.0.0.1:15008 inside ns and returns what the pod answered.
func hello(t *testing.T, ns *nstest.NS) (string, error) {
	t.Helper()
	c, err := ns.Dial(ctxT(t), "tcp", "127.0.0.1:15008")
	if err != nil {
		return "", err
	}
	defer c.Close()
	b, err := io.ReadAll(c)
	return string(b), err
}

func info(name string) *zdspb.WorkloadInfo {
	return &zdspb.WorkloadInfo{Name: name, Namespace: "default", ServiceAccount: "sa-" + name}
}

func TestClientServesPods(t *testing.T) {
	nstest.RequireRoot(t)
	podA := nstest.New(t, "zds-serve-a")
	podB := nstest.New(t, "zds-serve-b")
	path := sockPath(t)
	agent, _ := startAgent(t, path)
	ctx := ctxT(t)
	// a is known before ztunnel connects: it comes in the snapshot.
	if err := agent.AddPod(ctx, "uid-a", info("a"), openNS(t, podA)); !errors.Is(err, cniemu.ErrNoConnection) {
		t.Fatalf("AddPod before connect: %v", err)
	}
	srv := newListenServer()
	c := startClient(t, path, srv)
	c.waitReady(t, true)
	if err := agent.WaitSnapshots(ctx, 1); err != nil {
		t.Fatal(err)
	}
	acks := agent.Acks()
	if len(acks) != 2 || acks[0].Kind != inpod.KindAdd || acks[0].UID != "uid-a" || acks[1].Kind != inpod.KindSnapshotSent {
		t.Fatalf("snapshot acks %+v", acks)
	}
	for _, a := range acks {
		if a.Error != "" {
			t.Fatalf("ack error %q", a.Error)
		}
	}
	if got, err := hello(t, podA); err != nil || got != "uid-a" {
		t.Fatalf("pod a: %q %v", got, err)
	}
	// b arrives live.
	if err := agent.AddPod(ctx, "uid-b", info("b"), openNS(t, podB)); err != nil {
		t.Fatal(err)
	}
	if got, err := hello(t, podB); err != nil || got != "uid-b" {
		t.Fatalf("pod b: %q %v", got, err)
	}
	ws := c.WorkloadState()
	want := inpod.ProxyState{Info: inpod.WorkloadInfo{Name: "b", Namespace: "default", ServiceAccount: "sa-b"}, State: inpod.PhaseUp}
	if len(ws) != 2 || ws["uid-b"] != want {
		t.Fatalf("WorkloadState %+v", ws)
	}
	if err := agent.RemovePod(ctx, "uid-b"); err != nil {
		t.Fatal(err)
	}
	if d := srv.waitDrains(t, 1); d[0].uid != "uid-b" || d[0].graceful {
		t.Fatalf("drains %+v, want uid-b immediately", d)
	}
	if _, err := hello(t, podB); err == nil {
		t.Fatal("pod b still served after RemovePod")
	}
	if !c.Ready() {
		t.Fatal("not ready")
	}
}

func TestClientRejectsBadInput(t *testing.T) {
	nstest.RequireRoot(t)
	pod := nstest.New(t, "zds-bad")
	path := sockPath(t)
	agent, _ := startAgent(t, path)
	ctx := ctxT(t)
	// Cached without a netns: sent as Keep, and ztunnel runs no such pod.
	if err := agent.AddPod(ctx, "uid-keep", info("keep"), nil); err != nil {
		t.Fatal(err)
	}
	srv := newListenServer()
	c := startClient(t, path, srv)
	c.waitReady(t, true)
	if err := agent.WaitSnapshots(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if acks := agent.Acks(); len(acks) != 2 || !strings.Contains(acks[0].Error, string(inpod.ReasonKeepUnknown)) || acks[1].Error != "" {
		t.Fatalf("snapshot acks %+v", acks)
	}
	nsf := openNS(t, pod)
	devnull, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	defer devnull.Close()
	add := mustMarshal(t, &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Add{Add: &zdspb.AddWorkload{Uid: "uid-x", WorkloadInfo: info("x")}}})
	cases := []struct {
		name   string
		data   []byte
		fds    []int
		reason inpod.Reason
	}{
		{"truncated frame", make([]byte, 2*inpod.MaxMessageSize), nil, inpod.ReasonTruncated},
		{"garbage", []byte{0xff, 0x01, 0x02}, nil, inpod.ReasonDecode},
		{"unknown payload", []byte{0x48, 0x01}, nil, inpod.ReasonUnknownPayload},
		{"add without fd", add, nil, inpod.ReasonMissingFD},
		{"add with two fds", add, []int{int(nsf.Fd()), int(nsf.Fd())}, inpod.ReasonTooManyFDs},
		{"add with a non-netns fd", add, []int{int(devnull.Fd())}, inpod.ReasonNotNetns},
		{"add without workload info", mustMarshal(t, &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Add{Add: &zdspb.AddWorkload{Uid: "uid-y"}}}), []int{int(nsf.Fd())}, inpod.ReasonMissingInfo},
		{"keep after snapshot", mustMarshal(t, &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Keep{Keep: &zdspb.KeepWorkload{Uid: "uid-keep"}}}), nil, inpod.ReasonKeepAfterSnapshot},
		{"second snapshot", mustMarshal(t, &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_SnapshotSent{SnapshotSent: &zdspb.SnapshotSent{}}}), nil, inpod.ReasonDuplicateSnapshot},
		{"del with fd", mustMarshal(t, &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Del{Del: &zdspb.DelWorkload{Uid: "u"}}}), []int{int(nsf.Fd())}, inpod.ReasonUnexpectedFD},
		{"del of an unknown pod is fine", mustMarshal(t, &zdspb.WorkloadRequest{Payload: &zdspb.WorkloadRequest_Del{Del: &zdspb.DelWorkload{Uid: "ghost"}}}), nil, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := agent.SendRaw(ctx, tc.data, tc.fds...)
			if err != nil {
				t.Fatal(err)
			}
			got := resp.GetAck().GetError()
			if tc.reason == "" {
				if got != "" {
					t.Fatalf("ack error %q", got)
				}
				return
			}
			if !strings.HasPrefix(got, "inpod: "+string(tc.reason)) {
				t.Fatalf("ack error %q, want reason %s", got, tc.reason)
			}
		})
	}
	// Same connection, still serving: a good Add works, twice (same netns).
	for range 2 {
		if err := agent.AddPod(ctx, "uid-good", info("good"), nsf); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := hello(t, pod); err != nil || got != "uid-good" {
		t.Fatalf("pod: %q %v", got, err)
	}
	if n := srv.startCount(); n != 1 {
		t.Fatalf("StartPod called %d times for a duplicate Add", n)
	}
	for _, a := range agent.Acks() {
		if a.Conn != 1 {
			t.Fatalf("ack on connection %d: the client reconnected", a.Conn)
		}
	}
}

func TestClientReconnectKeepsPods(t *testing.T) {
	nstest.RequireRoot(t)
	podA := nstest.New(t, "zds-rc-a")
	podB := nstest.New(t, "zds-rc-b")
	path := sockPath(t)
	agent, stopAgent := startAgent(t, path)
	ctx := ctxT(t)
	srv := newListenServer()
	c := startClient(t, path, srv)
	c.waitReady(t, true)
	for uid, ns := range map[string]*nstest.NS{"uid-a": podA, "uid-b": podB} {
		if err := agent.AddPod(ctx, uid, info(uid), openNS(t, ns)); err != nil {
			t.Fatal(err)
		}
	}

	// The connection drops: pods keep serving, the client reconnects and
	// gets the same pods again in the snapshot.
	agent.DropConnections()
	if err := agent.WaitSnapshots(ctx, 2); err != nil {
		t.Fatal(err)
	}
	c.waitReady(t, true)
	for uid, ns := range map[string]*nstest.NS{"uid-a": podA, "uid-b": podB} {
		if got, err := hello(t, ns); err != nil || got != uid {
			t.Fatalf("%s after reconnect: %q %v", uid, got, err)
		}
	}
	if n := srv.startCount(); n != 2 {
		t.Fatalf("StartPod called %d times, want 2 (reconnect must not restart pods)", n)
	}

	// The agent restarts and has lost pod b meanwhile: it is removed when
	// the new agent's snapshot arrives; a is untouched.
	stopAgent()
	c.waitReady(t, false)
	if got, err := hello(t, podB); err != nil || got != "uid-b" {
		t.Fatalf("pod b while the agent is down: %q %v", got, err)
	}
	agent2, _ := startAgent(t, path)
	if err := agent2.AddPod(ctx, "uid-a", info("uid-a"), openNS(t, podA)); !errors.Is(err, cniemu.ErrNoConnection) {
		t.Fatalf("AddPod: %v", err)
	}
	if err := agent2.WaitSnapshots(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if d := srv.waitDrains(t, 1); d[0].uid != "uid-b" {
		t.Fatalf("drains %+v, want uid-b", d)
	}
	if got, err := hello(t, podA); err != nil || got != "uid-a" {
		t.Fatalf("pod a after agent restart: %q %v", got, err)
	}
	if n := srv.startCount(); n != 2 {
		t.Fatalf("StartPod called %d times, want 2", n)
	}
}

func TestClientRetriesPendingPods(t *testing.T) {
	nstest.RequireRoot(t)
	pod := nstest.New(t, "zds-pending")
	// Something else holds 15008 without SO_REUSEPORT: the proxy cannot start.
	blocker, err := pod.Listen("tcp", "127.0.0.1:15008")
	if err != nil {
		t.Fatal(err)
	}
	path := sockPath(t)
	agent, _ := startAgent(t, path)
	ctx := ctxT(t)
	srv := newListenServer()
	c := startClient(t, path, srv, func(c *inpod.Client) { inpod.SetRetryInterval(c, 50*time.Millisecond) })
	c.waitReady(t, true)
	err = agent.AddPod(ctx, "uid-p", info("p"), openNS(t, pod))
	if err == nil || !strings.Contains(err.Error(), string(inpod.ReasonStartFailed)) {
		t.Fatalf("AddPod: %v, want %s", err, inpod.ReasonStartFailed)
	}
	c.waitReady(t, false)
	if ws := c.WorkloadState(); ws["uid-p"].State != inpod.PhasePending {
		t.Fatalf("WorkloadState %+v", ws)
	}
	blocker.Close()
	c.waitReady(t, true)
	if got, err := hello(t, pod); err != nil || got != "uid-p" {
		t.Fatalf("pod after retry: %q %v", got, err)
	}
}

func TestClientShutdownDrainsGracefully(t *testing.T) {
	nstest.RequireRoot(t)
	pod := nstest.New(t, "zds-shut")
	path := sockPath(t)
	agent, _ := startAgent(t, path)
	ctx := ctxT(t)
	srv := newListenServer()
	c, err := inpod.New(inpod.Options{UDSPath: path, PodServer: srv})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- c.Run(context.Background()) }()
	if err := agent.WaitSnapshots(ctx, 1); err != nil {
		t.Fatal(err)
	}
	if err := agent.AddPod(ctx, "uid-s", info("s"), openNS(t, pod)); err != nil {
		t.Fatal(err)
	}
	if err := c.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatalf("Run after Shutdown: %v", err)
	}
	if d := srv.waitDrains(t, 1); !d[0].graceful {
		t.Fatalf("drains %+v, want graceful", d)
	}
	if err := c.Shutdown(ctx); err != nil {
		t.Fatalf("second Shutdown: %v", err)
	}
	if len(c.WorkloadState()) != 0 {
		t.Fatal("pods left after Shutdown")
	}
}

type resources struct{ fds, netnsFDs, goroutines, threads int }

func measure(t *testing.T) resources {
	t.Helper()
	var r resources
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	r.fds = len(ents)
	for _, e := range ents {
		if l, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil && strings.HasPrefix(l, "net:[") {
			r.netnsFDs++
		}
	}
	tasks, err := os.ReadDir("/proc/self/task")
	if err != nil {
		t.Fatal(err)
	}
	r.threads = len(tasks)
	r.goroutines = runtime.NumGoroutine()
	return r
}

func TestClientAddRemoveLeavesNothing(t *testing.T) {
	nstest.RequireRoot(t)
	pod := nstest.New(t, "zds-leak")
	nsf := openNS(t, pod)
	path := sockPath(t)
	agent, _ := startAgent(t, path)
	ctx := ctxT(t)
	srv := newListenServer()
	c := startClient(t, path, srv)
	c.waitReady(t, true)

	cycle := func(i int, check bool) {
		uid := "uid-" + string(rune('a'+i%26)) + string(rune('0'+i/26))
		if err := agent.AddPod(ctx, uid, info(uid), nsf); err != nil {
			t.Fatal(err)
		}
		if check {
			if got, err := hello(t, pod); err != nil || got != uid {
				t.Fatalf("%s: %q %v", uid, got, err)
			}
		}
		if err := agent.RemovePod(ctx, uid); err != nil {
			t.Fatal(err)
		}
		// The drain runs after the Ack; wait for it so the next pod's
		// SO_REUSEPORT listener does not share the port with a closing one.
		srv.waitDrains(t, i+1)
	}
	cycle(0, true) // warm up pools and lazily started goroutines
	before := measure(t)
	const n = 100
	for i := 1; i <= n; i++ {
		cycle(i, i%10 == 0)
	}
	srv.waitDrains(t, n+1)
	if ws := c.WorkloadState(); len(ws) != 0 {
		t.Fatalf("WorkloadState after removing everything: %v", ws)
	}
	// Drain goroutines finish just after recording the drain.
	var after resources
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		after = measure(t)
		if after.goroutines <= before.goroutines && after.fds <= before.fds || time.Now().After(deadline) {
			break
		}
	}
	if after.fds > before.fds || after.netnsFDs > before.netnsFDs || after.goroutines > before.goroutines {
		t.Fatalf("leak after %d pods: before %+v after %+v", n, before, after)
	}
	// Threads are pooled by the runtime; a per-pod leak would show as ~n.
	if after.threads > before.threads+4 {
		t.Fatalf("threads %d → %d after %d pods", before.threads, after.threads, n)
	}
	t.Logf("before %+v after %+v", before, after)
}

func mustMarshal(t *testing.T, m interface{ ProtoReflect() protoreflect.Message }) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
