// Package dns is ztunnel's DNS proxy: the server istio-cni's in-pod rules
// send every captured pod's UDP and TCP port-53 traffic to (15053 on
// localhost inside the pod's netns), and in dedicated mode a server on
// localhost:15053 of ztunnel's own netns. It is built on
// github.com/miekg/dns, which does the wire format, UDP and TCP serving.
//
// # What it owns
//
//   - [Resolver] (one per ztunnel): answers A and AAAA questions for mesh
//     hostnames from the state snapshot, as upstream ztunnel's
//     src/dns/server.rs does: a service's VIPs in this node's network (a
//     headless Kubernetes service: one address per endpoint), or failing
//     that a workload's IPs when the workload has that hostname. Short
//     names are completed for the client's namespace and the cluster
//     domain (`shop` → shop.<ns>.svc.cluster.local, `shop.default`,
//     `shop.default.svc`), search domains are stripped (answered with a
//     CNAME to the stripped name), and wildcard service hostnames
//     (*.example.com) match. A mesh name with no address of the asked
//     family (an IPv4-only service asked for AAAA) gets an empty,
//     authoritative NOERROR, never NXDOMAIN. TTL 30 s. Other types and
//     names are forwarded to the upstream resolvers (the node's
//     /etc/resolv.conf) in order, within a timeout (default 2 s, then
//     SERVFAIL) shared equally by the resolvers left, over UDP and again
//     over TCP when the answer is truncated; a SERVFAIL or REFUSED answer
//     moves on to the next resolver.
//   - [Server] (one per pod in shared mode): serves UDP and TCP on the
//     sockets it is given. Answers over UDP larger than 512 bytes, or than
//     the client's EDNS size, are truncated with TC so the client retries
//     over TCP. Forwarded queries go out on sockets from the Server's Dial:
//     in-pod, made in the pod's netns with SO_MARK 0x539, which istio-cni's
//     rules let through, so they are not captured again.
//
// # Bad input
//
// A packet shorter than a header is dropped; one that does not parse gets
// FORMERR; a response, a question count other than one (a query for 500
// names) or stray records get FORMERR, an opcode other than QUERY NOTIMP; a
// forward nobody answers SERVFAIL within the timeout. Each is counted with
// a [Reason] and logged at debug; none stops the server. At most
// [DefaultMaxForwards] forwards are in flight per Resolver, 64 TCP
// connections per Server, each bounded by a 2 s read and 8 s idle timeout.
//
// # Env vars
//
// Read by internal/config: ISTIO_META_DNS_CAPTURE (unset or "true": on),
// ISTIO_META_DNS_PROXY_ADDR (default localhost:15053), CLUSTER_DOMAIN,
// NETWORK and this project's DNS_RESOLV_CONF (default /etc/resolv.conf).
//
// # Metrics
//
// Upstream's, with its labels request_query_type (lower case: a, aaaa, …),
// request_protocol (udp, tcp), source_canonical_service,
// source_canonical_revision ("unknown" when the source is not a known
// workload):
//
//   - istio_dns_requests_total: every request that reached the resolver.
//   - istio_dns_upstream_requests_total: requests forwarded.
//   - istio_dns_upstream_failures_total: forwards that got no usable answer
//     (upstream also counts NXDOMAIN here; this project counts an NXDOMAIN
//     as an answer).
//   - istio_dns_upstream_request_duration_seconds: forward latency,
//     upstream's buckets.
//
// Ours: ztunnel_dns_errors_total{reason}, reason one of the [Reason] values.
package dns
