// Package state is the one store of what this ztunnel knows about the mesh:
// workloads, services and authorization policies.
//
// # What it owns
//
//   - Conversion of xDS resources (istio.workload.Address and
//     istio.security.Authorization protos) into immutable model values
//     ([Workload], [Service], compiled [rbac.Policy]), validating each
//     resource on its own. A resource that fails validation is rejected with
//     a [*RejectError] naming a [Reason]; the previous value of that resource
//     keeps serving and every other resource in the same push applies. One
//     exception fails closed instead: an Authorization with a malformed
//     entry (bad CIDR or port) is reported rejected ([ReasonFailClosed]) and
//     its fail-closed compilation is applied, so a DENY is never skipped.
//   - [Store], which satisfies the internal/xds Handler interface
//     structurally (this package never imports internal/xds).
//   - [Snapshot], an immutable view with the indexes the data path needs:
//     workload by address or UID, service by VIP or hostname, a service's
//     endpoints, the policies that apply to a workload, endpoint and
//     waypoint selection, and the config_dump sections.
//   - Change notification: every published snapshot has a version and a
//     channel that is closed when a newer snapshot replaces it.
//
// # Concurrency
//
// Readers call [Store.Snapshot], an atomic pointer load, and never take a
// lock. Writers convert and validate outside any lock, then build the next
// snapshot under one short mutex by copying only the maps they change
// (copy-on-write), and publish it with an atomic store.
//
// # Resource names
//
// As istiod names them: an Address resource holding a workload is named by
// the workload's uid, one holding a service by "namespace/hostname"; an
// Authorization by "namespace/name". A resource whose name disagrees with
// its content is rejected ([ReasonNameMismatch]) so that removals by name
// always find what they should.
//
// # Defaults taken from upstream ztunnel
//
// A workload without trust domain gets "cluster.local", without service
// account "default", without cluster id "Kubernetes", without capacity 1.
// A service with an unknown visibility value is treated as PUBLIC rather
// than rejected (upstream fails open there so a newer istiod cannot make a
// service disappear).
//
// # Env vars
//
// None.
//
// # Metrics
//
//   - ztunnel_state_rejected_resources_total{type, reason}: resources
//     rejected by validation; type is workload, service, policy or address;
//     reason is [Reason.Label].
package state
