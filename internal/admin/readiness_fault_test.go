package admin

import (
	"net/http"
	"testing"
)

// TestFaultReadinessSaysWhy: a pending condition's detail (the last error
// of what it waits for) is in the 503 body; it is dropped once the
// condition is met and cannot be set on a met condition.
func TestFaultReadinessSaysWhy(t *testing.T) {
	defer http.DefaultClient.CloseIdleConnections()
	r := NewReadiness("127.0.0.1:0", nil)
	done := r.Register("config")
	r.Register("certificates")
	startT(t, r)
	url := "http://" + r.Addr().String() + "/healthz/ready"
	r.SetDetail("config", "xds connection_error: connection refused")
	want := "not ready: waiting for certificates, config (xds connection_error: connection refused)\n"
	if code, body := do(t, "GET", url); code != 503 || body != want {
		t.Fatalf("readiness = %d %q, want 503 %q", code, body, want)
	}
	done()
	r.SetDetail("config", "late")
	if code, body := do(t, "GET", url); code != 503 || body != "not ready: waiting for certificates\n" {
		t.Fatalf("readiness after config = %d %q", code, body)
	}
}
