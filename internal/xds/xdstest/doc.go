// Package xdstest is an xDS server for tests and the demo: a real gRPC
// AggregatedDiscoveryService serving DeltaAggregatedResources for
// istio.workload.Address and istio.security.Authorization, built on
// go-control-plane's delta server (pkg/server/delta/v3) and one LinearCache
// per type, so that the client is exercised against an implementation no
// one here wrote.
//
// Behaviour inherited from go-control-plane that tests rely on:
//   - resource versions are a SHA-256 of the marshalled resource, so they
//     are stable across Stop/Restart and an unchanged resource claimed in
//     initial_resource_versions is not sent again;
//   - for a wildcard subscription, a claimed resource the server no longer
//     has is sent in removed_resources on the first response;
//   - the first request of a wildcard subscription is always answered, even
//     when there is nothing to send;
//   - a NACK does not cause a resend (the server records versions when it
//     sends, not when the client acknowledges).
//
// Resources are set with SetAddress, SetAuthorization, SetRaw (any bytes,
// to test decode failures), Remove and Push (several in one response).
// Every request received is logged with its stream's gRPC metadata; tests
// wait for one with WaitRequest(ctx, srv.RequestCount(), match) taken before
// the action that should cause it. Stop drops every connection at once and
// Restart serves the same resources on the same port.
//
// The package does not import testing; NewServer takes the small TB
// interface that *testing.T satisfies.
//
// Env vars: none. Metrics: none.
package xdstest
