// Package identitytest has test helpers for code that needs certificates:
//
//   - NewManager(t, ca): a running identity.Manager over ca (a fresh
//     ephemeral LocalCA if nil), closed at test cleanup. Use its
//     ServerConfig/ClientConfig for real mTLS in other packages' tests.
//   - NewLocalCA(t, trustDomain): an ephemeral LocalCA.
//   - StartCAServer(t, opts): a real gRPC IstioCertificateService on
//     127.0.0.1:0 with its own TLS serving certificate (root in RootFile),
//     backed by any identity.CA, checking "authorization: Bearer <Token>";
//     it records every request (metadata, ImpersonatedIdentity,
//     validity_duration) and can be told to fail (SetError).
//     ClientOptions() gives caclient.Options that reach it.
//
// Use only from tests: it imports "testing".
package identitytest
