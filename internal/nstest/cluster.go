package nstest

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"sync"
	"testing"

	"github.com/vishvananda/netlink"
)

// Cluster is a set of nodes joined by a fabric namespace, each node with a
// pod bridge. Names are prefixed so concurrent clusters do not collide.
type Cluster struct {
	Prefix string
	Fabric *NS

	mu    sync.Mutex
	nodes []*Node
	all   []*NS // every namespace, for Close
	seq   int   // veth name counter
}

// Node is a node namespace: where a node's ztunnel runs (hostNetwork).
type Node struct {
	*NS
	Index int
	// IP is the node's address on the fabric, 10.250.0.<index>.
	IP netip.Addr
	// Gateway is the bridge address pods route through, 10.244.<index>.1.
	Gateway netip.Addr

	cluster *Cluster
	pods    int
}

// Pod is a pod namespace attached to its node's bridge.
type Pod struct {
	*NS
	Node *Node
	IP   netip.Addr
}

// NewCluster creates the fabric namespace. prefix names every namespace
// (keep it short: it is also used in interface names).
func NewCluster(prefix string) (*Cluster, error) {
	f, err := NewNS(prefix + "-fabric")
	if err != nil {
		return nil, err
	}
	c := &Cluster{Prefix: prefix, Fabric: f, all: []*NS{f}}
	if err := c.withLink(f, func(h *netlink.Handle) error {
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "fabric0"}}
		if err := h.LinkAdd(br); err != nil {
			return fmt.Errorf("add fabric bridge: %w", err)
		}
		return h.LinkSetUp(br)
	}); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// NewTestCluster is NewCluster for tests, closed when tb ends.
func NewTestCluster(tb testing.TB, prefix string) *Cluster {
	tb.Helper()
	RequireRoot(tb)
	c, err := NewCluster(prefix)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(c.Close)
	return c
}

// Close deletes every namespace the cluster made; links go with them.
func (c *Cluster) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i := len(c.all) - 1; i >= 0; i-- {
		c.all[i].Close()
	}
	c.all = nil
}

func (c *Cluster) withLink(n *NS, fn func(*netlink.Handle) error) error {
	h, err := n.Netlink()
	if err != nil {
		return err
	}
	defer h.Close()
	if err := fn(h); err != nil {
		return fmt.Errorf("nstest: %s: %w", n.Name, err)
	}
	return nil
}

// vethPair creates a veth pair in namespace a named aName, with the peer
// moved into b and renamed bName there; the a side is set up.
func (c *Cluster) vethPair(a, b *NS, aName, bName string) error {
	tmp := aName + "p" // the peer's name while it is still in a
	if err := c.withLink(a, func(h *netlink.Handle) error {
		v := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: aName, MTU: 1500}, PeerName: tmp}
		if err := h.LinkAdd(v); err != nil {
			return fmt.Errorf("add veth %s/%s: %w", aName, tmp, err)
		}
		peer, err := h.LinkByName(tmp)
		if err != nil {
			return fmt.Errorf("find %s: %w", tmp, err)
		}
		if err := h.LinkSetNsFd(peer, int(b.Handle)); err != nil {
			return fmt.Errorf("move %s to %s: %w", tmp, b.Name, err)
		}
		self, err := h.LinkByName(aName)
		if err != nil {
			return err
		}
		return h.LinkSetUp(self)
	}); err != nil {
		return err
	}
	return c.withLink(b, func(h *netlink.Handle) error {
		peer, err := h.LinkByName(tmp)
		if err != nil {
			return fmt.Errorf("find %s: %w", tmp, err)
		}
		if err := h.LinkSetName(peer, bName); err != nil {
			return fmt.Errorf("rename %s to %s: %w", tmp, bName, err)
		}
		return nil
	})
}

// enslave attaches link to bridge inside ns.
func (c *Cluster) enslave(ns *NS, link, bridge string) error {
	return c.withLink(ns, func(h *netlink.Handle) error {
		l, err := h.LinkByName(link)
		if err != nil {
			return err
		}
		br, err := h.LinkByName(bridge)
		if err != nil {
			return err
		}
		return h.LinkSetMaster(l, br)
	})
}

func (c *Cluster) nextVeth() string {
	c.seq++
	return fmt.Sprintf("vz%d", c.seq)
}

// AddNode creates node i (1-based, ≤ 200): its namespace, its link to the
// fabric, its pod bridge and routes to every existing node's pods.
func (c *Cluster) AddNode() (*Node, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	idx := len(c.nodes) + 1
	ns, err := NewNS(fmt.Sprintf("%s-node%d", c.Prefix, idx))
	if err != nil {
		return nil, err
	}
	c.all = append(c.all, ns)
	n := &Node{NS: ns, Index: idx, cluster: c,
		IP:      netip.AddrFrom4([4]byte{10, 250, 0, byte(idx)}),
		Gateway: netip.AddrFrom4([4]byte{10, 244, byte(idx), 1}),
	}
	fab := c.nextVeth()
	if err := c.vethPair(c.Fabric, ns, fab, "eth0"); err != nil {
		return nil, err
	}
	if err := c.enslave(c.Fabric, fab, "fabric0"); err != nil {
		return nil, err
	}
	if err := c.withLink(ns, func(h *netlink.Handle) error {
		eth, err := h.LinkByName("eth0")
		if err != nil {
			return err
		}
		if err := h.AddrAdd(eth, addr(n.IP, 24)); err != nil {
			return fmt.Errorf("address eth0: %w", err)
		}
		if err := h.LinkSetUp(eth); err != nil {
			return err
		}
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: "br0"}}
		if err := h.LinkAdd(br); err != nil {
			return fmt.Errorf("add br0: %w", err)
		}
		if err := h.AddrAdd(br, addr(n.Gateway, 24)); err != nil {
			return fmt.Errorf("address br0: %w", err)
		}
		return h.LinkSetUp(br)
	}); err != nil {
		return nil, err
	}
	if err := ns.Sysctl("net.ipv4.ip_forward", "1"); err != nil {
		return nil, err
	}
	// Routes both ways between the new node and every existing node.
	for _, other := range c.nodes {
		if err := routeVia(ns, podCIDR(other.Index), other.IP); err != nil {
			return nil, err
		}
		if err := routeVia(other.NS, podCIDR(idx), n.IP); err != nil {
			return nil, err
		}
	}
	c.nodes = append(c.nodes, n)
	return n, nil
}

// AddPod creates a pod namespace on node n with the next free address.
func (n *Node) AddPod(name string) (*Pod, error) {
	c := n.cluster
	c.mu.Lock()
	defer c.mu.Unlock()
	n.pods++
	if n.pods > 250 {
		return nil, errors.New("nstest: too many pods on one node")
	}
	ip := netip.AddrFrom4([4]byte{10, 244, byte(n.Index), byte(n.pods + 1)})
	ns, err := NewNS(fmt.Sprintf("%s-%s", c.Prefix, name))
	if err != nil {
		return nil, err
	}
	c.all = append(c.all, ns)
	hostSide := c.nextVeth()
	if err := c.vethPair(n.NS, ns, hostSide, "eth0"); err != nil {
		return nil, err
	}
	if err := c.enslave(n.NS, hostSide, "br0"); err != nil {
		return nil, err
	}
	if err := c.withLink(ns, func(h *netlink.Handle) error {
		eth, err := h.LinkByName("eth0")
		if err != nil {
			return err
		}
		if err := h.AddrAdd(eth, addr(ip, 24)); err != nil {
			return fmt.Errorf("address eth0: %w", err)
		}
		if err := h.LinkSetUp(eth); err != nil {
			return err
		}
		return h.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: net.IP(n.Gateway.AsSlice())})
	}); err != nil {
		return nil, err
	}
	return &Pod{NS: ns, Node: n, IP: ip}, nil
}

// RemovePod deletes a pod's namespace (its veth goes with it).
func (c *Cluster) RemovePod(p *Pod) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, ns := range c.all {
		if ns == p.NS {
			c.all = append(c.all[:i], c.all[i+1:]...)
			break
		}
	}
	p.NS.Close()
}

func podCIDR(node int) netip.Prefix {
	return netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 244, byte(node), 0}), 24)
}

func routeVia(ns *NS, dst netip.Prefix, via netip.Addr) error {
	h, err := ns.Netlink()
	if err != nil {
		return err
	}
	defer h.Close()
	_, ipnet, _ := net.ParseCIDR(dst.String())
	if err := h.RouteAdd(&netlink.Route{Dst: ipnet, Gw: net.IP(via.AsSlice())}); err != nil {
		return fmt.Errorf("nstest: %s: route %s via %s: %w", ns.Name, dst, via, err)
	}
	return nil
}

func addr(ip netip.Addr, bits int) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(ip.AsSlice()), Mask: net.CIDRMask(bits, ip.BitLen())}}
}
