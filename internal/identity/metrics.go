package identity

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Reasons a certificate fetch fails; each is a value of the "reason" label
// of istio_cert_fetch_failures_total.
const (
	reasonCSR     = "csr"     // local key or CSR generation failed
	reasonCA      = "ca"      // the CA call failed
	reasonInvalid = "invalid" // the CA's answer did not pass NewCertificate
)

// metrics is nil-safe: a Manager without a Registerer has a nil *metrics.
type metrics struct {
	fetches  prometheus.Counter
	failures *prometheus.CounterVec
	latency  prometheus.Histogram
}

func newMetrics(reg prometheus.Registerer, m *Manager) (*metrics, error) {
	if reg == nil {
		return nil, nil
	}
	mt := &metrics{
		fetches: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "istio_cert_fetch_total",
			Help: "Workload certificate requests sent to the CA (first fetches and renewals).",
		}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_cert_fetch_failures_total",
			Help: "Workload certificate fetches that failed, by reason (csr, ca, invalid).",
		}, []string{"reason"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "istio_cert_fetch_duration_seconds",
			Help:    "Duration of CA certificate requests.",
			Buckets: prometheus.ExponentialBuckets(0.005, 2, 12), // 5 ms … ~10 s
		}),
	}
	for _, r := range []string{reasonCSR, reasonCA, reasonInvalid} {
		mt.failures.WithLabelValues(r) // export zeros so rate() works from the start
	}
	for _, c := range []prometheus.Collector{mt.fetches, mt.failures, mt.latency, newCertCollector(m)} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return mt, nil
}

func (mt *metrics) fetched(d time.Duration) {
	if mt == nil {
		return
	}
	mt.fetches.Inc()
	mt.latency.Observe(d.Seconds())
}

func (mt *metrics) fetchFailed(reason string) {
	if mt == nil {
		return
	}
	mt.failures.WithLabelValues(reason).Inc()
}

// certCollector reports per-identity expiry at scrape time, so no gauge has
// to be kept in step with renewals and forgets.
type certCollector struct {
	m               *Manager
	expiry, managed *prometheus.Desc
}

func newCertCollector(m *Manager) *certCollector {
	return &certCollector{
		m: m,
		expiry: prometheus.NewDesc("istio_cert_expiry_seconds",
			"Seconds until the current workload certificate of an identity expires (negative once expired).",
			[]string{"identity"}, nil),
		managed: prometheus.NewDesc("istio_certs_managed",
			"Identities whose certificates the manager keeps.", nil, nil),
	}
}

func (c *certCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.expiry
	ch <- c.managed
}

func (c *certCollector) Collect(ch chan<- prometheus.Metric) {
	entries := c.m.snapshot()
	now := time.Now()
	ch <- prometheus.MustNewConstMetric(c.managed, prometheus.GaugeValue, float64(len(entries)))
	for _, e := range entries {
		if cert := e.cur.Load(); cert != nil {
			ch <- prometheus.MustNewConstMetric(c.expiry, prometheus.GaugeValue,
				cert.NotAfter.Sub(now).Seconds(), e.id.String())
		}
	}
}
