// Package proxy owns ztunnel's three listeners per served workload and what
// happens to each connection on them:
//
//   - outbound (15001): connections the pod's iptables rules redirected;
//     the original destination (SO_ORIGINAL_DST) is looked up in state: a
//     service VIP picks an endpoint; a waypoint, if the destination has
//     one, gets an HBONE tunnel with the original destination as
//     :authority; an HBONE workload gets a tunnel to its 15008; anything
//     else is plain TCP passthrough;
//   - inbound HBONE (15008): CONNECT streams from other ztunnels and
//     waypoints; the :authority must be a workload this proxy serves; L4
//     policy is evaluated with the peer's certificate identity; the 200 is
//     sent only after policy allowed and the local dial succeeded;
//   - inbound plaintext (15006): TCP from outside the mesh to a served
//     workload; policy applies with no identity.
//
// Every upstream socket carries the in-pod mark (0x539) through the Dial
// the caller passes, so the pod's own rules do not capture it again.
//
// Bytes are copied with splice between two TCP sockets (splice.go: a pipe
// is borrowed only while bytes move, so an idle copy holds none); between a
// socket and an HBONE stream the stream copies itself (hbone's CopyFrom and
// StartCopyTo: no buffer while idle and no goroutine for the stream →
// socket direction), so an idle proxied connection costs one parked
// goroutine, started once set-up is done so that it parks with a small
// stack (relay; on 15008 the hbone Handler detaches); anything else uses
// pooled buffers that grow for bulk traffic. Half-close and resets are propagated; a failure in either
// direction aborts both. Each connection produces one access-log line ("connection
// complete") and one update of the istio_tcp_* metrics at close. Inbound
// connections stay tracked so a policy change that now denies them closes
// them (Reevaluate), and so a drain can wait for them and then force them.
// A drain also waits for connections still being set up; at its deadline
// it cancels their upstream connects, and one that completes afterwards is
// closed at once rather than left running untracked.
//
// Metrics: istio_tcp_connections_opened_total, istio_tcp_connections_closed_total,
// istio_tcp_connections_failed_total, istio_tcp_sent_bytes_total,
// istio_tcp_received_bytes_total (upstream's label set),
// istio_ztunnel_authorization_denied_total{direction,policy},
// istio_ztunnel_connection_rejected_total{direction,reason},
// istio_ztunnel_accept_errors_total{port,reason} (accept.go: EMFILE and
// other transient accept failures; the listener backs off 5 ms → 1 s).
package proxy
