// Package demo builds a small ambient "cluster" on one machine and sends
// traffic along every path the design describes, for `ztunnel demo`.
//
// Topology (network namespaces made by internal/nstest):
//
//	node1: ztunnel (in-pod mode, its own CNI emulator), pods client and echo-a
//	node2: ztunnel (in-pod mode, its own CNI emulator), pods echo-b and outside
//
// client, echo-a and echo-b are in the mesh (HBONE); outside is not. Both
// ztunnels read the same local config (workloads, the echo service at VIP
// 10.96.0.10, one DENY policy) and sign with one built-in CA loaded from
// plug-in files (LOCAL_CA_DIR), so the two nodes trust each other.
//
// The outside pod also plays the cluster's DNS server (port 53, knowing
// only web.outside.example); both ztunnels forward to it, and every mesh
// pod's DNS capture rules hand its lookups to its ztunnel's DNS proxy, which
// answers mesh hostnames (the short name "echo" → the VIP) itself.
//
// The demo prints a table of path / result / latency / bytes and exits 0
// only when every path gave its expected result. Everything it created
// (namespaces, veths, iptables rules inside them, sockets, temp files) is
// removed on exit, including on Ctrl-C; with Keep it waits for Ctrl-C
// first so the admin endpoints can be explored.
package demo
