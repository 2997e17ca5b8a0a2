package dns

import (
	"fmt"
	"net"
	"strconv"
)

// DefaultPort is upstream's DNS proxy port (DEFAULT_DNS_PORT), where
// istio-cni's rules send each pod's port-53 traffic.
const DefaultPort = 15053

// ListenFuncs open sockets where the Server should serve: inside a pod's
// netns (inpod.Netns.Listen/ListenPacket) or in ztunnel's own.
type ListenFuncs struct {
	Listen       func(network, addr string) (net.Listener, error)
	ListenPacket func(network, addr string) (net.PacketConn, error)
}

// Listen binds UDP and TCP on addr (ISTIO_META_DNS_PROXY_ADDR): "localhost:PORT"
// binds 127.0.0.1 and, where the netns has IPv6 loopback, [::1] (as
// upstream's Address::Localhost); "IP:PORT" binds that address only. On
// error nothing stays open.
func Listen(addr string, f ListenFuncs) ([]net.PacketConn, []net.Listener, error) {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, fmt.Errorf("dns: listen %s: %w", addr, err)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return nil, nil, fmt.Errorf("dns: listen %s: bad port", addr)
	}
	if host != "localhost" {
		pc, ln, err := listenPair(addr, f)
		if err != nil {
			return nil, nil, err
		}
		return []net.PacketConn{pc}, []net.Listener{ln}, nil
	}
	pc, ln, err := listenPair(net.JoinHostPort("127.0.0.1", port), f)
	if err != nil {
		return nil, nil, err
	}
	pcs, lns := []net.PacketConn{pc}, []net.Listener{ln}
	// IPv6 loopback is best effort: a pod may have IPv6 disabled.
	if pc6, ln6, err := listenPair(net.JoinHostPort("::1", port), f); err == nil {
		pcs, lns = append(pcs, pc6), append(lns, ln6)
	}
	return pcs, lns, nil
}

func listenPair(addr string, f ListenFuncs) (net.PacketConn, net.Listener, error) {
	pc, err := f.ListenPacket("udp", addr)
	if err != nil {
		return nil, nil, fmt.Errorf("dns: listen udp %s: %w", addr, err)
	}
	ln, err := f.Listen("tcp", addr)
	if err != nil {
		pc.Close()
		return nil, nil, fmt.Errorf("dns: listen tcp %s: %w", addr, err)
	}
	return pc, ln, nil
}

// LocalListenFuncs listen in the current netns.
var LocalListenFuncs = ListenFuncs{Listen: net.Listen, ListenPacket: net.ListenPacket}
