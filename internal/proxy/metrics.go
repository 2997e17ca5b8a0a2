package proxy

import (
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// trafficLabelNames are upstream ztunnel's label set for the istio_tcp_*
// metrics, in upstream's order. Values come from workload metadata, never
// from client ports, so cardinality is bounded by workloads.
var trafficLabelNames = []string{
	"reporter",
	"source_workload", "source_canonical_service", "source_canonical_revision",
	"source_workload_namespace", "source_principal", "source_app", "source_version", "source_cluster",
	"destination_service", "destination_service_namespace", "destination_service_name",
	"destination_workload", "destination_canonical_service", "destination_canonical_revision",
	"destination_workload_namespace", "destination_principal", "destination_app", "destination_version",
	"destination_cluster",
	"request_protocol", "response_flags", "connection_security_policy",
}

const unknown = "unknown"

// Reporter values: which side of the connection recorded it.
const (
	reporterSource      = "source"
	reporterDestination = "destination"
)

// Security policy values.
const (
	policyMutualTLS = "mutual_tls"
	policyUnknown   = "unknown"
)

// Response flags, as upstream: "-" for none, DENY for authorization
// failures, CONNECT for upstream connect failures.
const (
	flagNone    = "-"
	flagDeny    = "DENY"
	flagConnect = "CONNECT"
)

// TrafficLabels is one label set of the istio_tcp_* metrics.
type TrafficLabels struct {
	Reporter string

	SourceWorkload, SourceCanonicalService, SourceCanonicalRevision string
	SourceNamespace, SourcePrincipal, SourceApp, SourceVersion      string
	SourceCluster                                                   string

	DestinationService, DestinationServiceNamespace, DestinationServiceName string

	DestinationWorkload, DestinationCanonicalService, DestinationCanonicalRevision string
	DestinationNamespace, DestinationPrincipal, DestinationApp, DestinationVersion string
	DestinationCluster                                                             string

	RequestProtocol, ResponseFlags, SecurityPolicy string
}

func orUnknown(s string) string {
	if s == "" {
		return unknown
	}
	return s
}

func (l *TrafficLabels) values() []string {
	v := []string{
		l.Reporter,
		l.SourceWorkload, l.SourceCanonicalService, l.SourceCanonicalRevision,
		l.SourceNamespace, l.SourcePrincipal, l.SourceApp, l.SourceVersion, l.SourceCluster,
		l.DestinationService, l.DestinationServiceNamespace, l.DestinationServiceName,
		l.DestinationWorkload, l.DestinationCanonicalService, l.DestinationCanonicalRevision,
		l.DestinationNamespace, l.DestinationPrincipal, l.DestinationApp, l.DestinationVersion,
		l.DestinationCluster,
		l.RequestProtocol, l.ResponseFlags, l.SecurityPolicy,
	}
	for i := range v {
		v[i] = orUnknown(v[i])
	}
	return v
}

// Metrics are the proxy's Prometheus collectors.
type Metrics struct {
	opened   *prometheus.CounterVec
	closed   *prometheus.CounterVec
	failed   *prometheus.CounterVec
	sent     *prometheus.CounterVec
	received *prometheus.CounterVec
	denied   *prometheus.CounterVec
	rejected *prometheus.CounterVec

	acceptErrors *prometheus.CounterVec // by port, reason (accept.go)

	// series caches each label set's connection series. A lookup in the
	// vectors hashes and validates all 23 label values, once per vector:
	// 3.4-4.0 µs of every connection (BenchmarkRecordMetrics) where a map
	// hit is a fraction of that. Entries live as long as the vectors'
	// own children, which are never deleted, so the cache adds no
	// cardinality of its own.
	seriesMu sync.RWMutex
	series   map[TrafficLabels]*trafficSeries

	live atomic.Int64 // connections opened and not yet done
}

// Live is how many proxied connections are open now, across every proxy
// sharing these metrics.
func (m *Metrics) Live() int64 { return m.live.Load() }

// trafficSeries are one label set's children of the connection vectors.
type trafficSeries struct {
	opened, closed, sent, received prometheus.Counter
}

// seriesFor returns l's series, from the vectors the first time.
func (m *Metrics) seriesFor(l *TrafficLabels) *trafficSeries {
	m.seriesMu.RLock()
	s := m.series[*l]
	m.seriesMu.RUnlock()
	if s != nil {
		return s
	}
	v := l.values()
	s = &trafficSeries{
		opened:   m.opened.WithLabelValues(v...),
		closed:   m.closed.WithLabelValues(v...),
		sent:     m.sent.WithLabelValues(v...),
		received: m.received.WithLabelValues(v...),
	}
	m.seriesMu.Lock()
	defer m.seriesMu.Unlock()
	if old := m.series[*l]; old != nil {
		return old
	}
	m.series[*l] = s
	return s
}

// NewMetrics registers the proxy metrics on reg (nil: collected but not
// exported, which keeps tests and the data path on one code path).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	counter := func(name, help string, labels []string) *prometheus.CounterVec {
		c := prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "istio", Name: name, Help: help}, labels)
		if reg != nil {
			reg.MustRegister(c)
		}
		return c
	}
	return &Metrics{
		opened:   counter("tcp_connections_opened_total", "The total number of TCP connections opened.", trafficLabelNames),
		closed:   counter("tcp_connections_closed_total", "The total number of TCP connections closed.", trafficLabelNames),
		failed:   counter("tcp_connections_failed_total", "The total number of TCP connections that failed to establish.", trafficLabelNames),
		sent:     counter("tcp_sent_bytes_total", "The size of total bytes sent during request/response of a TCP connection.", trafficLabelNames),
		received: counter("tcp_received_bytes_total", "The size of total bytes received during request/response of a TCP connection.", trafficLabelNames),
		denied: counter("ztunnel_authorization_denied_total",
			"Connections denied by authorization policy, by the deciding policy.", []string{"direction", "policy"}),
		rejected: counter("ztunnel_connection_rejected_total",
			"Connections refused before reaching a destination, by reason.", []string{"direction", "reason"}),
		acceptErrors: counter("ztunnel_accept_errors_total",
			"Failed accepts on 15001/15006/15008 (the listener backs off and retries), by port and reason.", []string{"port", "reason"}),
		series: make(map[TrafficLabels]*trafficSeries),
	}
}
