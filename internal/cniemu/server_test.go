package cniemu

import (
	"context"
	"errors"
	"net"
	"os"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel/internal/inpod"
	"github.com/ztunnel-go/ztunnel/internal/inpod/zdspb"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func runServer(t *testing.T, opts Options) *Server {
	t.Helper()
	dir, err := os.MkdirTemp("", "cniemu")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	opts.Path = dir + "/z.sock"
	s, err := New(opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Run: %v", err)
		}
		s.Close()
	})
	return s
}

// fakeZtunnel is a hand-driven ZDS client.
type fakeZtunnel struct {
	t *testing.T
	c *net.UnixConn
}

func dialZtunnel(t *testing.T, s *Server) *fakeZtunnel {
	t.Helper()
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: s.Path(), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if err := inpod.WriteMsg(c, &zdspb.ZdsHello{Version: zdspb.Version_V1}); err != nil {
		t.Fatal(err)
	}
	return &fakeZtunnel{t: t, c: c}
}

// next reads one request (and its FD) and acks it with ackErr.
func (z *fakeZtunnel) next(ackErr string) inpod.Request {
	z.t.Helper()
	_ = z.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	req, err := inpod.ReadRequest(z.c)
	if err != nil {
		z.t.Fatal(err)
	}
	if req.FD >= 0 {
		unix.Close(req.FD)
	}
	if err := inpod.WriteMsg(z.c, &zdspb.WorkloadResponse{Payload: &zdspb.WorkloadResponse_Ack{Ack: &zdspb.Ack{Error: ackErr}}}); err != nil {
		z.t.Fatal(err)
	}
	return req
}

func TestServerSequence(t *testing.T) {
	s := runServer(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	self, err := os.Open("/proc/self/ns/net")
	if err != nil {
		t.Fatal(err)
	}
	defer self.Close()
	for _, p := range []struct {
		uid string
		ns  *os.File
	}{{"a", self}, {"b", nil}, {"c", self}} {
		if err := s.AddPod(ctx, p.uid, &zdspb.WorkloadInfo{Name: p.uid}, p.ns); p.ns != nil && !errors.Is(err, ErrNoConnection) {
			t.Fatalf("AddPod %s: %v", p.uid, err)
		}
	}
	z := dialZtunnel(t, s)
	// Snapshot in cache order: Add (with FD) / Keep (no netns), then SnapshotSent.
	want := []struct {
		kind inpod.Kind
		uid  string
	}{{inpod.KindAdd, "a"}, {inpod.KindKeep, "b"}, {inpod.KindAdd, "c"}, {inpod.KindSnapshotSent, ""}}
	for i, w := range want {
		ack := ""
		if i == 1 {
			ack = "keep_unknown"
		}
		if got := z.next(ack); got.Kind != w.kind || got.UID != w.uid {
			t.Fatalf("request %d: %s %q, want %s %q", i, got.Kind, got.UID, w.kind, w.uid)
		}
	}
	if err := s.WaitSnapshots(ctx, 1); err != nil {
		t.Fatal(err)
	}
	// Live updates, each waiting for its Ack.
	errc := make(chan error, 1)
	go func() { errc <- s.AddPod(ctx, "d", &zdspb.WorkloadInfo{Name: "d"}, self) }()
	if got := z.next("inpod: start_failed"); got.Kind != inpod.KindAdd || got.UID != "d" || got.Info.GetName() != "d" {
		t.Fatalf("live add: %+v", got)
	}
	if err := <-errc; err == nil {
		t.Fatal("AddPod did not report the ack error")
	}
	go func() { errc <- s.RemovePod(ctx, "a") }()
	if got := z.next(""); got.Kind != inpod.KindDel || got.UID != "a" {
		t.Fatalf("live del: %+v", got)
	}
	if err := <-errc; err != nil {
		t.Fatal(err)
	}
	acks := s.Acks()
	if len(acks) != 6 || acks[1].Error != "keep_unknown" || acks[4].Kind != inpod.KindAdd || acks[4].Error == "" || acks[5].Kind != inpod.KindDel {
		t.Fatalf("acks %+v", acks)
	}
}

func TestServerDropsChattyZtunnel(t *testing.T) {
	s := runServer(t, Options{KeepaliveInterval: 20 * time.Millisecond})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	z := dialZtunnel(t, s)
	z.next("") // SnapshotSent
	if err := s.WaitSnapshots(ctx, 1); err != nil {
		t.Fatal(err)
	}
	// ztunnel must speak only when spoken to: an unsolicited packet ends
	// the connection at the next probe, as istio-cni does.
	if err := inpod.WriteMsg(z.c, &zdspb.WorkloadResponse{}); err != nil {
		t.Fatal(err)
	}
	_ = z.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := inpod.ReadRequest(z.c); err == nil {
		t.Fatal("connection still open")
	}
	if err := s.wait(ctx, func() bool { return len(s.conns) == 0 }); err != nil {
		t.Fatal(err)
	}
}

func TestServerHelloTimeout(t *testing.T) {
	s := runServer(t, Options{AckTimeout: 50 * time.Millisecond})
	c, err := net.DialUnix("unixpacket", nil, &net.UnixAddr{Name: s.Path(), Net: "unixpacket"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	// No hello: the server gives up and closes.
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := inpod.ReadRequest(c); err == nil {
		t.Fatal("server sent a request without a hello")
	}
}
