package inpod

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are upstream's workload manager metrics (prefix
// istio_workload_manager_) plus a rejection counter of our own.
type metrics struct {
	active  prometheus.Gauge
	pending prometheus.Gauge
	started prometheus.Counter
	stopped prometheus.Counter
	errors  *prometheus.CounterVec // label: reason
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	const ns, sub = "istio", "workload_manager"
	m := &metrics{
		active: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "active_proxy_count", Help: "The total number current workloads with active proxies (unstable)"}),
		pending: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "pending_proxy_count", Help: "The total number current workloads with pending proxies (unstable)"}),
		started: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "proxies_started_total", Help: "The total number of proxies that were started (unstable)"}),
		stopped: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "proxies_stopped_total", Help: "The total number of proxies that were stopped (unstable)"}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "zds_errors_total", Help: "ZDS requests answered with an error Ack, by reason (not in upstream)"},
			[]string{"reason"}),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.active, m.pending, m.started, m.stopped, m.errors} {
		if err := reg.Register(c); err != nil {
			errs = append(errs, err)
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("inpod: register metrics: %w", err)
	}
	return m, nil
}
