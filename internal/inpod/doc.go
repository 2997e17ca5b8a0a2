// Package inpod is ztunnel's side of ZDS, the protocol by which the Istio
// CNI node agent hands pods to ztunnel in ambient "in-pod" mode, and the
// per-pod lifecycle that follows: for every pod ztunnel gets the pod's
// network namespace as an FD and opens its proxy listeners inside it.
//
// Files: protocol.go is the wire framing (one protobuf per SOCK_SEQPACKET
// packet, the netns FD in SCM_RIGHTS); statemanager.go is the pod state
// machine, which never touches a socket; client.go is the connect / Ack /
// reconnect loop; netns.go is the per-pod socket factory.
//
// Message sequence on each connection (ztunnel connects, the agent serves):
//
//	ztunnel → agent  ZdsHello{version: V1}
//	agent → ztunnel  WorkloadRequest{add (FD attached) | keep}   ← its whole cache,
//	ztunnel → agent  WorkloadResponse{ack{error: ""}}               one at a time
//	agent → ztunnel  WorkloadRequest{snapshot_sent}
//	ztunnel → agent  ack                ← pods not named since connecting are removed
//	agent → ztunnel  add | del          ← live changes, each acked
//
// ztunnel never sends anything else: istio-cni probes the connection with
// short reads and treats any unsolicited packet as a protocol error. Every
// request gets exactly one Ack; a bad request gets an Ack whose error names
// a Reason ("inpod: <reason>: uid "…": <detail>") and the connection stays
// up. Semantics follow upstream ztunnel: Add of a running uid with the same
// namespace (device+inode) is a no-op, with another namespace it replaces
// the proxy; Del of an unknown uid is fine; Keep is only valid before
// SnapshotSent. Differences: Keep for a uid that is not running is answered
// with keep_unknown (upstream acks it silently; istio-cni only logs it), and
// a bad packet or missing workload_info does not end the connection.
//
// A pod whose proxy fails to start is kept pending and retried every 5 s.
// The client is ready after a connection's SnapshotSent when nothing is
// pending, and not ready while disconnected. Pods keep serving while the
// agent is away; reconnects back off from 10 ms to 15 s.
//
// Sockets: Netns.Listen/ListenPacket/Dial run on a goroutine locked to its
// OS thread, which joins the pod's namespace with setns and returns to its
// own afterwards; a thread that cannot return is never unlocked, so the
// runtime destroys it. Listeners get SO_MARK and SO_REUSEPORT from
// NetnsOptions, IP_TRANSPARENT on request.
//
// Environment (read by internal/config, passed in through Options):
// INPOD_UDS (socket path), INPOD_PORT_REUSE (SO_REUSEPORT), PACKET_MARK
// (SO_MARK, in-pod default 1337 = 0x539).
//
// Metrics (on Options.Registerer): istio_workload_manager_active_proxy_count,
// istio_workload_manager_pending_proxy_count,
// istio_workload_manager_proxies_started_total,
// istio_workload_manager_proxies_stopped_total (as upstream) and
// istio_workload_manager_zds_errors_total{reason} (ours).
//
// Client.WorkloadState is the /config_dump "workloadState" section.
package inpod
