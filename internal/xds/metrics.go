package xds

import (
	"errors"
	"fmt"

	discovery "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus"
)

// terminationReason says why one ADS stream ended. The values are upstream's
// label values for istio_xds_connection_terminations_total, so dashboards
// written for upstream ztunnel keep working.
type terminationReason string

const (
	// reasonConnectionError: the stream could not be opened (dial, TLS,
	// token, or the server refusing the RPC before any response).
	reasonConnectionError terminationReason = "ConnectionError"
	// reasonError: the stream ended with a gRPC error the server did not
	// mean as a routine reconnect.
	reasonError terminationReason = "Error"
	// reasonReconnect: the server (or the transport) closed the stream in a
	// way that asks for a prompt reconnect: GOAWAY, max connection age,
	// "transport is closing", cancelled or deadline exceeded.
	reasonReconnect terminationReason = "Reconnect"
	// reasonComplete: the server ended the stream cleanly (status OK).
	reasonComplete terminationReason = "Complete"
)

// metrics are the client's instruments. They always exist so that the code
// never checks for nil; they are registered only when a Registerer is given.
type metrics struct {
	terminations *prometheus.CounterVec // reason
	messages     *prometheus.CounterVec // url
	messageBytes *prometheus.CounterVec // url
	nacks        *prometheus.CounterVec // url
	connected    prometheus.Gauge
	resources    *prometheus.GaugeVec // url
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		// Upstream names: upstream registers "xds_connection_terminations",
		// "xds_message" and "xds_message" with unit bytes under the
		// "istio" prefix; OpenMetrics adds the _total / _bytes_total tails.
		terminations: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_xds_connection_terminations_total",
			Help: "The total number of completed connections to xds server (unstable)",
		}, []string{"reason"}),
		messages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_xds_message_total",
			Help: "Total number of messages received (unstable)",
		}, []string{"url"}),
		messageBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "istio_xds_message_bytes_total",
			Help: "Total number of bytes received (unstable)",
		}, []string{"url"}),
		// Not in upstream.
		nacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "ztunnel_xds_nacks_total",
			Help: "Responses this client rejected (NACKed), at least in part, by type URL.",
		}, []string{"url"}),
		connected: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "ztunnel_xds_connected",
			Help: "1 while an ADS stream to the xDS server is open, else 0.",
		}),
		resources: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "ztunnel_xds_resources",
			Help: "Resources currently held (accepted) from the xDS server, by type URL.",
		}, []string{"url"}),
	}
	if reg == nil {
		return m, nil
	}
	for _, c := range []prometheus.Collector{m.terminations, m.messages, m.messageBytes, m.nacks, m.connected, m.resources} {
		if err := reg.Register(c); err != nil {
			var already prometheus.AlreadyRegisteredError
			if errors.As(err, &already) {
				return nil, fmt.Errorf("xds: register metrics: %w (one Client per Registerer)", err)
			}
			return nil, fmt.Errorf("xds: register metrics: %w", err)
		}
	}
	return m, nil
}

// recordResponse counts one response and the bytes of its resources, as
// upstream does (resource bodies only, not the envelope).
func (m *metrics) recordResponse(resp *discovery.DeltaDiscoveryResponse) {
	url := resp.GetTypeUrl()
	m.messages.WithLabelValues(url).Inc()
	var n int
	for _, r := range resp.GetResources() {
		n += len(r.GetResource().GetValue())
	}
	m.messageBytes.WithLabelValues(url).Add(float64(n))
}
