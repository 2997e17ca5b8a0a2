// Command bench measures the whole ztunnel data path on one machine and
// compares every figure with direct pod-to-pod TCP measured in the same run.
//
//	go run ./bench -quick            # whole run in under a minute
//	go run ./bench -duration 10s     # longer, steadier numbers
//	go run ./bench -profile          # plus CPU/heap profiles of each ztunnel
//	go run ./bench -profile-phase rps  # profiles under the CPU target's load
//	go run ./bench -phases hol -duration 30s  # some measurements only (latency, hol, newconn, connrate, bulk, idle)
//	go run ./bench -peer PATH        # the same scenarios with another ztunnel binary too
//	go run ./bench -peer PATH -mixed CADIR  # plus ours and the peer on one path, both ways (interop)
//
// Topology (internal/demo.Mesh, namespaces from internal/nstest): two nodes,
// each with its own ztunnel process (the real binary, built by the harness)
// in in-pod mode with a CNI emulator, one local config and one shared
// plug-in CA:
//
//	node1: client (mesh), plain (not in the mesh), srv-local (mesh)
//	node2: srv-remote (mesh), outside (not in the mesh)
//
// Scenarios: direct (plain → outside, no ztunnel on the path), relay-pair
// (plain → outside through two bare relays in the ztunnels' places: the
// yardstick, relay.go), sealed-relay-pair (the same with the leg between
// the relays sealed in AES-GCM records: the yardstick for a proxy that
// encrypts, relayseal.go), hbone-cross-node (client → srv-remote),
// hbone-same-node (client → srv-local), tcp-passthrough (client →
// outside). Each ztunnel is restarted before each scenario so CPU and
// memory figures start from a fresh process.
//
// Load generators and servers are this package's own Go code, dialing and
// listening inside the pod namespaces; latency is measured open-loop from
// precomputed send times (see load.go). Every byte is checked against a
// pattern and counted; any error, short count or corrupted byte fails the
// run with a non-zero exit. Each open-loop phase is checked against a plain
// loop of the same operation (selfcheck.go), and the machine's load and
// the harness's own timing precision are recorded at the start and end
// (busy.go). Every ztunnel runs with GODEBUG=gctrace=1, so the 1000 rps
// phase's slowest requests can be set beside the collections that ran
// meanwhile (gctrace.go). See bench/README.md for the method and the
// meaning of each figure.
//
// The harness reads two environment variables: BENCH_ZTUNNEL_ENV, extra
// environment for every ztunnel it starts, and BENCH_RELAY_MODE, which
// set to "goroutines" runs the relay yardsticks on Go's poller
// (relaygo.go) instead of their epoll loop. It must run as root.
package main
