package hbone

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// register registers c, or returns the collector already registered under
// the same description so several Pools (upstream has one per in-pod
// workload) can share one Registerer.
func register[T prometheus.Collector](r prometheus.Registerer, c T) T {
	if err := r.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(T); ok {
				return existing
			}
		}
		// A conflicting definition is a programming error; keep the
		// unregistered collector so the caller still works.
	}
	return c
}

// poolMetrics is nil when no Registerer was given; every method is nil-safe.
type poolMetrics struct {
	conns    prometheus.Gauge
	streams  prometheus.Gauge
	dials    *prometheus.CounterVec
	h2errors *prometheus.CounterVec
}

func newPoolMetrics(r prometheus.Registerer) *poolMetrics {
	if r == nil {
		return nil
	}
	return &poolMetrics{
		conns: register(r, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ztunnel_hbone_pool_connections",
			Help: "Open HBONE client connections.",
		})),
		streams: register(r, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ztunnel_hbone_pool_streams",
			Help: "Open HBONE client streams.",
		})),
		dials: register(r, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ztunnel_hbone_pool_dials_total",
			Help: "New HBONE client connections attempted, by result.",
		}, []string{"result"})),
		h2errors: register(r, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ztunnel_hbone_pool_http2_errors_total",
			Help: "HTTP/2 protocol errors seen by HBONE client connections, by type.",
		}, []string{"type"})),
	}
}

func (m *poolMetrics) connDelta(d float64) {
	if m != nil {
		m.conns.Add(d)
	}
}

func (m *poolMetrics) streamDelta(d float64) {
	if m != nil {
		m.streams.Add(d)
	}
}

func (m *poolMetrics) dial(result string) {
	if m != nil {
		m.dials.WithLabelValues(result).Inc()
	}
}

func (m *poolMetrics) countError(typ string) {
	if m != nil {
		m.h2errors.WithLabelValues(typ).Inc()
	}
}

// serverMetrics is nil when no Registerer was given; every method is nil-safe.
type serverMetrics struct {
	conns    prometheus.Gauge
	streams  prometheus.Gauge
	rejects  *prometheus.CounterVec
	h2errors *prometheus.CounterVec
}

func newServerMetrics(r prometheus.Registerer) *serverMetrics {
	if r == nil {
		return nil
	}
	return &serverMetrics{
		conns: register(r, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ztunnel_hbone_server_connections",
			Help: "Open HBONE server connections.",
		})),
		streams: register(r, prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ztunnel_hbone_server_streams",
			Help: "HBONE CONNECT streams being handled.",
		})),
		rejects: register(r, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ztunnel_hbone_server_rejects_total",
			Help: "HBONE connections and CONNECT streams rejected, by reason.",
		}, []string{"reason"})),
		h2errors: register(r, prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ztunnel_hbone_server_http2_errors_total",
			Help: "HTTP/2 protocol errors seen by the HBONE server, by type.",
		}, []string{"type"})),
	}
}

func (m *serverMetrics) connDelta(d float64) {
	if m != nil {
		m.conns.Add(d)
	}
}

func (m *serverMetrics) streamDelta(d float64) {
	if m != nil {
		m.streams.Add(d)
	}
}

func (m *serverMetrics) reject(reason string) {
	if m != nil {
		m.rejects.WithLabelValues(reason).Inc()
	}
}

func (m *serverMetrics) countError(typ string) {
	if m != nil {
		m.h2errors.WithLabelValues(typ).Inc()
	}
}
