// Package cniemu emulates the part of the Istio CNI node agent that ztunnel
// talks to, for tests and the demo.
//
// Server is a ZDS server on a unix SOCK_SEQPACKET socket with istio-cni's
// behaviour (cni/pkg/nodeagent/ztunnelserver.go): it waits for ZdsHello,
// sends its cached pods as AddWorkload (netns FD in SCM_RIGHTS) or, when it
// has no netns for a pod, KeepWorkload, waiting up to 5 s for each Ack, then
// SnapshotSent; after that AddPod goes to the newest connection and
// RemovePod to every connection, one request and one Ack at a time. Idle
// connections are probed with a 10 ms read that must time out: anything
// ztunnel sends unasked ends the connection, as in istio-cni. A real
// istio-cni can take the emulator's place unchanged, and a real ztunnel can
// connect to the emulator. Every Ack is recorded (Acks, WaitAcks); SendRaw
// sends arbitrary packets for bad-input tests.
//
// InstallRedirect installs, inside a pod netns, the rules istio-cni installs
// for in-pod mode (cni/pkg/iptables AppendInpodRules), with go-iptables run
// from a thread inside that netns:
//
//	mangle ISTIO_PRERT:  mark 0x539/0xfff → CONNMARK set 0x111/0xfff
//	mangle ISTIO_OUTPUT: connmark 0x111/0xfff → restore mark
//	nat ISTIO_PRERT:     from 169.254.7.127 (node probes) ACCEPT;
//	                     tcp !dst 127.0.0.1 !dport 15008, unmarked → REDIRECT 15006
//	nat ISTIO_OUTPUT:    to 169.254.7.127 ACCEPT; tcp mark 0x111 ACCEPT;
//	                     !dst 127.0.0.1 out lo ACCEPT;
//	                     tcp !dst 127.0.0.1, unmarked → REDIRECT 15001
//	ip rule fwmark 0x111/0xfff pref 32764 lookup 100; local 0.0.0.0/0 dev lo table 100
//
// DNS capture (RedirectOptions.DNS) adds, as istio-cni with DNS capture on:
//
//	raw PREROUTING/OUTPUT: jump to ISTIO_PRERT/ISTIO_OUTPUT
//	nat ISTIO_OUTPUT: udp dport 53 !out lo, unmarked → REDIRECT 15053;
//	                  tcp dport 53 !dst 127.0.0.1, unmarked → REDIRECT 15053
//	raw ISTIO_OUTPUT: udp dport 53 marked → CT zone 1 (ztunnel → resolver)
//	raw ISTIO_PRERT:  udp sport 53 unmarked → CT zone 1 (its answers)
//
// IPv6 is an option too. It reads no environment variables and exports no
// metrics.
package cniemu
