// Package admin owns ztunnel's three HTTP endpoints and the run-time log
// levels:
//
//   - admin (ADMIN_ADDR, default 127.0.0.1:15000; loopback unless configured
//     otherwise, because it exposes config and can stop the process):
//     / (plain-text index), /config_dump, /logging, /debug/pprof/*,
//     /quitquitquit;
//   - stats (STATS_ADDR, default [::]:15020): /metrics and /stats/prometheus;
//   - readiness (READINESS_ADDR, default [::]:15021): /healthz/ready.
//
// Admin only reads: other components register config_dump sections and
// readiness conditions into it; it imports none of them.
//
// The config_dump document is a JSON object whose top-level keys are the
// registered sections (upstream's: workloads, services, policies,
// certificates, workloadState, staticConfig, version, config), the shape
// istioctl ztunnel-config reads.
//
// Bad requests (errors.go) get a 4xx whose body starts with a reason
// constant, counted in ztunnel_admin_request_errors_total{reason} (on
// Options.Registerer); no endpoint takes a body, so one over MaxRequestBody
// is refused with 413, and /logging keeps at most MaxScopes overrides.
package admin
