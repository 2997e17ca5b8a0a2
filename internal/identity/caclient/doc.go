// Package caclient is the Istio CA client: an identity.CA that sends the
// Manager's CSRs to IstioCertificateService.CreateCertificate
// (istio.io/api/security/v1alpha1) over gRPC with TLS.
//
// Request, as upstream ztunnel sends it:
//   - csr: the PEM CSR; validity_duration: the TTL in whole seconds;
//   - metadata (a protobuf Struct) {"ImpersonatedIdentity": "<spiffe id>"}
//     only when Options.Impersonate is set — the shared node proxy asks for
//     a pod's identity with its own token (istiod checks
//     CA_TRUSTED_NODE_ACCOUNTS);
//   - gRPC metadata "authorization: Bearer <token>" and
//     "clusterid: <cluster id>" when a token is configured, the token file
//     being re-read on every request (projected tokens rotate), plus every
//     Options.Headers entry (CA_HEADER_*).
//
// Response: cert_chain is the leaf, then intermediates, with the last
// element holding the root(s), possibly several concatenated (ParseChain).
//
// Environment (read by internal/config, passed in Options): CA_ADDRESS,
// CA_ROOT_CA (an existing file path, "SYSTEM", or else inline PEM — the
// file is re-read when it changes, for new connections), ALT_CA_HOSTNAME,
// AUTH_TOKEN (a file path, or else a static token; upstream's default file
// is ./var/run/secrets/tokens/istio-token), CLUSTER_ID, CA_HEADER_*.
//
// No metrics of its own: the identity.Manager counts fetches.
package caclient
