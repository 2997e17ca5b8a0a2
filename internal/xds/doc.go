// Package xds brings mesh configuration into ztunnel from two sources and
// delivers it to a [Handler] (internal/state satisfies it; the interface is
// declared here so that state never imports xds):
//
//   - [Client], a delta ADS (DeltaAggregatedResources) client for istiod,
//     in client.go, response.go, metadata.go and metrics.go;
//   - the LOCAL_XDS_PATH / LOCAL_XDS file loader ([Load], [LoadFile]) in
//     local*.go, which replaces the whole state at start-up.
//
// # Message sequence (delta ADS)
//
// Per connection the client sends, for each of [TypeURLAddress] then
// [TypeURLAuthorization], one initial DeltaDiscoveryRequest carrying the
// node, resource_names_subscribe ["*"] and initial_resource_versions (the
// name → version of every resource it holds and accepted). Upstream sends an
// empty subscribe list instead, the legacy spelling of the same wildcard;
// istiod and go-control-plane treat the two alike.
//
// For each DeltaDiscoveryResponse the client decodes every resource
// (anypb.Any of the response's type), calls UpdateAddresses or
// UpdateAuthorizations with the decoded upserts (keyed by resource name)
// and the removed names, and answers on the same stream:
//
//   - ACK: type_url and response_nonce;
//   - NACK, when any resource failed to decode or the handler rejected it:
//     the same plus error_detail (google.rpc.Status, INVALID_ARGUMENT) whose
//     message reads "name: reason; name: reason", sorted by name.
//
// Rejection is per resource: the valid resources of a NACKed response are
// applied, and a rejected resource keeps serving its previous value.
//
// Readiness ([Client.Ready]) waits, as upstream's does, until each type has
// had a response that was accepted in full; a type whose every response is
// NACKed keeps ztunnel unready.
//
// # Versions and reconnects
//
// The client remembers the version of every resource it accepted. A
// rejected resource keeps the version it had before (or none), so after a
// reconnect the server sees it as stale and sends it again: that is the
// retry. Removals are not inferred by the client. On reconnect the server
// learns from initial_resource_versions what the client holds and, for a
// wildcard subscription, sends removed_resources for every claimed name it no
// longer has — istiod computes them from the claimed names, go-control-plane
// from the subscription's known versions. A resource removed while the
// client was disconnected therefore disappears with the first response of
// the new stream. (The client cannot do this on its own: a server may skip
// unchanged resources, so absence from a response means nothing.)
//
// Streams are reopened with jittered exponential backoff, 100ms doubling to
// 15s; a stream that delivered at least one response resets it. Each
// attempt builds a new gRPC connection, re-reads the token and the root CA
// file.
//
// Out of scope: on-demand xDS (XDS_ON_DEMAND, upstream's Demander) and
// aliases. The client always subscribes to everything.
//
// # Env vars
//
// None are read here. The caller maps XDS_ADDRESS, XDS_ROOT_CA,
// ALT_XDS_HOSTNAME, XDS_HEADER_*, AUTH_TOKEN, CLUSTER_ID /
// ISTIO_META_CLUSTER_ID, INSTANCE_IP, POD_NAME, POD_NAMESPACE, NODE_NAME,
// ISTIO_META_* and ISTIO_METAJSON_* into [Options] and [NodeInfo].
//
// The node id is "ztunnel~<INSTANCE_IP>~<POD_NAME>.<POD_NAMESPACE>~<POD_NAMESPACE>.svc.cluster.local"
// and the node metadata has NAME, NAMESPACE, INSTANCE_IPS and NODE_NAME,
// overridden by ISTIO_META_* (strings) and then ISTIO_METAJSON_* (JSON
// values), as upstream builds them. The token goes in "authorization:
// Bearer <token>" with "clusterid: <cluster id>" beside it.
//
// # Metrics
//
// Upstream names:
//   - istio_xds_connection_terminations_total{reason}: ended streams;
//     reason is ConnectionError, Error, Reconnect or Complete.
//   - istio_xds_message_total{url}: responses received per type URL.
//   - istio_xds_message_bytes_total{url}: resource bytes received.
//
// Added here:
//   - ztunnel_xds_nacks_total{url}: responses rejected at least in part.
//   - ztunnel_xds_connected: 1 while a stream that has delivered a
//     response is open.
//   - ztunnel_xds_resources{url}: resources currently held.
package xds
