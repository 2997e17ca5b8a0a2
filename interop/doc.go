// Package interop checks wire compatibility with upstream Istio by linking
// Istio's own Go code (module istio.io/istio) next to ours and making the
// two talk. It is a separate module so that Istio's module graph never
// reaches the root go.mod; the root module is used through a replace
// directive (../).
//
// What is tested, all against Istio's code rather than against expectations
// written here:
//
//   - descriptor_test.go: every message, field, oneof and enum value of
//     Istio's workload.proto (istio.io/istio/pkg/workloadapi),
//     authorization.proto (.../workloadapi/security) and zds.proto
//     (.../pkg/zdsapi) has the same full name, number, name, kind,
//     cardinality, presence, packing, JSON name, oneof membership and
//     message/enum type in our workloadpb, securitypb and zdspb, and
//     neither side has anything the other lacks. The one deliberate
//     difference, authorization.proto's Group/Rules that upstream ztunnel
//     (and so ours) calls Rule/Clause, is listed in knownRenames and still
//     compared structurally.
//   - roundtrip_test.go: fully populated Istio messages (every field, one
//     oneof branch at a time) encoded by Istio's types, both with
//     proto.Marshal and with vtprotobuf's MarshalVTStrict (what istiod
//     sends), decode into ours with no unknown fields, and our re-encoding
//     decodes back into Istio's types as proto.Equal to the original.
//   - xds_test.go: resources whose bytes istiod's encoder produced are
//     served by our go-control-plane test server (internal/xds/xdstest) to
//     our delta xDS client, which ACKs and delivers them to internal/state;
//     the converted workloads, services and policies are checked.
//   - hbone_test.go: Istio's HBONE dialer (pkg/hbone.NewDialer) against our
//     HBONE server, and our HBONE pool against Istio's HBONE server
//     (pkg/hbone.NewServer), over mutual TLS from our identity Manager.
//
// # Registration conflict
//
// Istio's generated packages and ours register the same proto full names
// (istio.workload.*, istio.security.*, istio.workload.zds.*) in the global
// registry, which by default panics at init. The tests must run with
//
//	GOLANG_PROTOBUF_REGISTRATION_CONFLICT=ignore   (or =warn)
//
// read by google.golang.org/protobuf/reflect/protoregistry at init; the
// link-time alternative is
// -ldflags=-X=google.golang.org/protobuf/reflect/protoregistry.conflictPolicy=warn.
// Both work with protobuf-go v1.36.12 and neither is covered by its
// compatibility promise. "warn" and "ignore" behave alike, "warn" also
// prints about a hundred warnings; run.sh defaults to "ignore". Either way
// the first package to register a name keeps it in
// protoregistry.GlobalFiles/GlobalTypes, so the tests never look types up
// by name in the global registry: they use each package's Go types and
// file descriptors directly.
//
// # Build tag
//
// run.sh builds with -tags=vtprotobuf, as istiod's release build does
// (Makefile.core.mk STANDARD_TAGS), which compiles Istio's vtprotobuf
// marshalers: istiod encodes pushes with MarshalVTStrict by default
// (ENABLE_VTPROTOBUF=true), so the tests do too. Without the tag the
// vtprotobuf cases fail with a message saying so.
//
// Network: only the Go module proxy, to download istio.io/istio and its
// small set of build dependencies. Every socket is on 127.0.0.1.
//
// Env vars: GOLANG_PROTOBUF_REGISTRATION_CONFLICT (above). Metrics: none.
//
// Run: interop/run.sh [go test flags].
package interop
