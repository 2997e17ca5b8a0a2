package dns

import (
	"strings"
	"time"

	mdns "github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// Label values upstream uses when a source is not known.
const unknown = "unknown"

// forwardBuckets are upstream's (src/dns/metrics.rs): sub-millisecond for a
// node-local cache, up to 5 s for a resolver that is timing out.
var forwardBuckets = []float64{0.0005, 0.001, 0.01, 0.1, 1, 5}

// dnsLabels are upstream's DnsLabels, in its order.
var dnsLabels = []string{"request_query_type", "request_protocol", "source_canonical_service", "source_canonical_revision"}

// Metrics are the DNS proxy's counters. One set is shared by every server
// (one per pod in shared mode); the vectors are safe for concurrent use.
type Metrics struct {
	requests         *prometheus.CounterVec
	forwarded        *prometheus.CounterVec
	forwardFailures  *prometheus.CounterVec
	forwardDurations *prometheus.HistogramVec
	errors           *prometheus.CounterVec
}

// NewMetrics creates the metrics and registers them on reg (nil: not
// registered, for tests).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_dns_requests_total",
			Help: "Total number of DNS requests (unstable)",
		}, dnsLabels),
		forwarded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_dns_upstream_requests_total",
			Help: "Total number of DNS requests forwarded to upstream (unstable)",
		}, dnsLabels),
		forwardFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_dns_upstream_failures_total",
			Help: "Total number of DNS requests that failed to forward upstream (unstable)",
		}, dnsLabels),
		forwardDurations: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "istio_dns_upstream_request_duration_seconds",
			Help:    "Total time in seconds Istio takes to get DNS response from upstream (unstable)",
			Buckets: forwardBuckets,
		}, dnsLabels),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ztunnel_dns_errors_total",
			Help: "DNS requests or forwards that went wrong, by reason (see internal/dns Reason)",
		}, []string{"reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.requests, m.forwarded, m.forwardFailures, m.forwardDurations, m.errors)
	}
	// Pre-create every reason so a dashboard sees zeros, not absent series.
	for _, r := range allReasons {
		m.errors.WithLabelValues(string(r))
	}
	return m
}

// labels is one request's label values.
type labels [4]string

func newLabels(qtype uint16, proto, canonicalService, canonicalRevision string) labels {
	t := unknown
	if name, ok := typeNames[qtype]; ok {
		t = name
	}
	return labels{t, proto, orUnknown(canonicalService), orUnknown(canonicalRevision)}
}

func orUnknown(s string) string {
	if s == "" {
		return unknown
	}
	return s
}

func (m *Metrics) request(l labels)        { m.requests.WithLabelValues(l[:]...).Inc() }
func (m *Metrics) forward(l labels)        { m.forwarded.WithLabelValues(l[:]...).Inc() }
func (m *Metrics) forwardFailure(l labels) { m.forwardFailures.WithLabelValues(l[:]...).Inc() }
func (m *Metrics) countError(r Reason)     { m.errors.WithLabelValues(string(r)).Inc() }
func (m *Metrics) forwardTook(l labels, d time.Duration) {
	m.forwardDurations.WithLabelValues(l[:]...).Observe(d.Seconds())
}

// typeNames are lower-case query type names, as upstream's labels have
// them ("a", "aaaa"); built once so labelling a request does not allocate.
var typeNames = func() map[uint16]string {
	out := make(map[uint16]string, 100)
	for t, name := range mdns.TypeToString {
		out[t] = strings.ToLower(name)
	}
	return out
}()
