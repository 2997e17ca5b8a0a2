package inpod_test

import (
	"context"
	"net"
	"os"
	"testing"
	"time"

	"github.com/ztunnel-go/ztunnel/internal/inpod"
	"github.com/ztunnel-go/ztunnel/internal/nstest"
)

// TestFaultReusePortCloseKeepsQueuedConns is the kernel side of a ztunnel
// handoff: two SO_REUSEPORT listeners on one port in a pod namespace (old
// and new ztunnel), clients connect, nobody accepts yet, then the old
// listener closes. With ReusePort, Listen turned tcp_migrate_req on, so
// every queued connection moves to the new listener; with the sysctl
// turned back off (the control case) the ones queued on the old listener
// are reset — which is what the handoff test saw before.
func TestFaultReusePortCloseKeepsQueuedConns(t *testing.T) {
	nstest.RequireRoot(t)
	if _, err := os.Stat("/proc/sys/net/ipv4/tcp_migrate_req"); err != nil {
		t.Skip("inpod: skipping: kernel without net.ipv4.tcp_migrate_req (Linux < 5.14)")
	}
	const conns = 64
	cases := []struct {
		name     string
		migrate  bool
		wantLost bool
	}{
		{"tcp_migrate_req set by Listen", true, false},
		{"control: tcp_migrate_req off", false, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := nstest.New(t, "zmig"+map[bool]string{true: "1", false: "0"}[tc.migrate])
			ns, err := inpod.OpenNetns(pod.Path(), inpod.NetnsOptions{ReusePort: true})
			if err != nil {
				t.Fatal(err)
			}
			defer ns.Close()
			old, err := ns.Listen("tcp", "127.0.0.1:15008")
			if err != nil {
				t.Fatal(err)
			}
			defer old.Close()
			cur, err := ns.Listen("tcp", "127.0.0.1:15008")
			if err != nil {
				t.Fatal(err)
			}
			defer cur.Close()
			if got := sysctl(t, ns); got != "1" {
				t.Fatalf("tcp_migrate_req in the pod = %q after a ReusePort Listen, want 1", got)
			}
			if !tc.migrate {
				if err := ns.Do(func() error { return os.WriteFile("/proc/sys/net/ipv4/tcp_migrate_req", []byte("0"), 0) }); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			var clients []net.Conn
			for range conns {
				c, err := pod.Dial(ctx, "tcp", "127.0.0.1:15008")
				if err != nil {
					t.Fatal(err)
				}
				defer c.Close()
				c.Write([]byte("x"))
				clients = append(clients, c)
			}
			old.Close() // the draining ztunnel stops listening
			accepted := 0
			cur.(*net.TCPListener).SetDeadline(time.Now().Add(time.Second))
			for {
				s, err := cur.Accept()
				if err != nil {
					break
				}
				accepted++
				s.Write([]byte("y"))
				defer s.Close()
			}
			reset := 0
			for _, c := range clients {
				c.SetReadDeadline(time.Now().Add(time.Second))
				if _, err := c.Read(make([]byte, 1)); err != nil {
					reset++
				}
			}
			t.Logf("fault reuseport-close: migrate=%v queued=%d accepted_by_new=%d reset=%d", tc.migrate, conns, accepted, reset)
			if lost := reset > 0 || accepted != conns; lost != tc.wantLost {
				t.Errorf("accepted %d of %d, %d reset; want lost=%v", accepted, conns, reset, tc.wantLost)
			}
		})
	}
}

func sysctl(t *testing.T, ns *inpod.Netns) string {
	t.Helper()
	var b []byte
	if err := ns.Do(func() (err error) {
		b, err = os.ReadFile("/proc/sys/net/ipv4/tcp_migrate_req")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	return string(b[:len(b)-1])
}
