package proxy

import (
	"testing"

	"github.com/ztunnel-go/ztunnel/internal/hbone"
)

// FuzzConnectHeaders feeds the CONNECT request fields the inbound path
// reads from a peer (:authority, Forwarded, Baggage, Traceparent) to the
// parsers it uses: none may panic, and what parses must format and parse
// back to the same value.
func FuzzConnectHeaders(f *testing.F) {
	f.Add("10.0.0.1:8080", `for="10.0.0.2:1234";host=echo.demo.svc.cluster.local`,
		"k8s.cluster.name=Kubernetes,k8s.namespace.name=ns,k8s.deployment.name=app", "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")
	f.Add("[fd00::1]:443", `for="[fd00::2]:80"`, "", "")
	f.Add("10.0.0.1", "host=", "=,=", "zz-")
	f.Add(":0", `for=;host="`, "k8s.namespace.name", "00-00000000000000000000000000000000-0000000000000000-00")
	f.Fuzz(func(t *testing.T, authority, forwarded, baggage, traceparent string) {
		if ap, err := hbone.ParseAuthority(authority); err == nil {
			back, err := hbone.ParseAuthority(ap.String())
			if err != nil || back != ap {
				t.Fatalf("authority %q → %v → %v, %v", authority, ap, back, err)
			}
		}
		_, _ = hbone.ParseForwardedHost(forwarded)
		if b, ok := hbone.ParseBaggage([]string{baggage}); ok {
			if _, ok := hbone.ParseBaggage([]string{hbone.FormatBaggage(b, "pod")}); !ok {
				t.Fatalf("baggage %q parsed but its formatting does not", baggage)
			}
		}
		if tp, err := hbone.ParseTraceParent(traceparent); err == nil {
			if back, err := hbone.ParseTraceParent(tp.String()); err != nil || back != tp {
				t.Fatalf("traceparent %q → %v → %v, %v", traceparent, tp, back, err)
			}
		}
	})
}
