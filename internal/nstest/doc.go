// Package nstest builds small "clusters" out of Linux network namespaces for
// tests, the demo and the bench: a netns per node and per pod, veth links,
// addresses and routes, all made with netlink and removed on Close.
//
// Topology (see Cluster): each node netns holds a bridge ("br0", the node's
// pod network gateway 10.244.<node>.1/24); each pod netns has eth0 with
// 10.244.<node>.<n>/24 attached to that bridge; nodes reach each other over
// a veth pair per node into a shared "fabric" netns (10.250.0.<node>/24),
// with routes for every other node's pod CIDR. Nothing touches the host
// netns except creating and deleting the named namespaces under
// /var/run/netns, so traffic never leaves the machine.
//
// Everything needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN); RequireRoot skips a
// test with a clear message otherwise.
package nstest
