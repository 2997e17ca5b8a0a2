// Package identity owns workload identities and their certificates.
//
//   - Identity, New, Parse: Istio SPIFFE ids, spiffe://<td>/ns/<ns>/sa/<sa>.
//   - CA: the one-method signer the Manager uses. Implementations are
//     LocalCA (this package, localca.go) and caclient.Client (subpackage
//     caclient: the Istio CA gRPC client, kept apart so that importing
//     identity does not pull in gRPC).
//   - LocalCA: the built-in CA used when FAKE_CA=true. NewLocalCA makes an
//     ephemeral self-signed ECDSA P-256 root at start; LoadLocalCA reads an
//     Istio plug-in CA directory (ca-cert.pem, ca-key.pem, root-cert.pem,
//     optional cert-chain.pem — the "cacerts" secret layout).
//   - Manager: one leaf per identity in use. The first Get of an identity
//     fetches (concurrent first Gets share one CA call); a goroutine per
//     identity renews at half life ±5%, retries failures with backoff
//     (1 s doubling to 150 s, ±20%) and keeps serving the old certificate
//     until it expires; Get never waits for a renewal. Forget drops an
//     identity (pod left); Run also forgets identities unused for
//     IdleTimeout. Keys are ECDSA P-256 made locally; the CSR carries the
//     SPIFFE id as its only (URI) SAN. Dump gives the /config_dump
//     "certificates" section in upstream's shape.
//   - TLS (tls.go): ServerConfig/ServerConfigFor/ClientConfig build mutual
//     TLS 1.3, ALPN "h2" configs once per identity (cached, never per
//     connection); certificates and trust bundles are looked up per
//     handshake so renewals and root changes apply to new connections.
//     PeerIdentity reads the verified peer id.
//
// The package reads no environment variables; cmd/ztunnel maps FAKE_CA,
// LOCAL_CA_DIR, SECRET_TTL, CA_ADDRESS, CA_ROOT_CA, AUTH_TOKEN, CLUSTER_ID
// and CA_HEADER_* onto ManagerOptions, LoadLocalCA and caclient.Options.
//
// Metrics (registered only when ManagerOptions.Registerer is set):
//
//	istio_cert_fetch_total                     counter: CA requests (first fetches and renewals)
//	istio_cert_fetch_failures_total{reason}    counter: reason = csr | ca | invalid
//	istio_cert_fetch_duration_seconds          histogram: CA request latency
//	istio_cert_expiry_seconds{identity}        gauge (at scrape): seconds until the current leaf expires
//	istio_certs_managed                        gauge (at scrape): identities managed
//
// Test helpers (a gRPC Istio CA server backed by LocalCA, a ready Manager)
// are in the subpackage identitytest.
package identity
