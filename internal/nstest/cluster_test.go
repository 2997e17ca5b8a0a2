package nstest

import (
	"context"
	"io"
	"net/netip"
	"testing"
	"time"
)

func TestClusterConnectivity(t *testing.T) {
	c := NewTestCluster(t, "nst")
	n1, err := c.AddNode()
	if err != nil {
		t.Fatal(err)
	}
	n2, err := c.AddNode()
	if err != nil {
		t.Fatal(err)
	}
	a, err := n1.AddPod("a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := n1.AddPod("b")
	if err != nil {
		t.Fatal(err)
	}
	x, err := n2.AddPod("x")
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name string
		from *NS
		to   *Pod
	}{
		{"same node", a.NS, b},
		{"cross node", a.NS, x},
		{"node to remote pod", n1.NS, x},
		{"back", x.NS, a},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ln, err := tc.to.Listen("tcp", netip.AddrPortFrom(tc.to.IP, 0).String())
			if err != nil {
				t.Fatal(err)
			}
			defer ln.Close()
			go func() {
				c, err := ln.Accept()
				if err == nil {
					c.Write([]byte("hi from " + tc.to.Name))
					c.Close()
				}
			}()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			conn, err := tc.from.Dial(ctx, "tcp", ln.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			got, _ := io.ReadAll(conn)
			if string(got) != "hi from "+tc.to.Name {
				t.Fatalf("got %q", got)
			}
		})
	}
}
