package admin

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// TestFaultAdminBadInput: each bad request gets a clear 4xx naming its
// reason, the reason is counted, and the levels set before are kept.
func TestFaultAdminBadInput(t *testing.T) {
	defer http.DefaultClient.CloseIdleConnections()
	levels := NewLevels(slog.DiscardHandler, slog.LevelInfo)
	reg := prometheus.NewRegistry()
	s := New(Options{Addr: "127.0.0.1:0", Levels: levels, Registerer: reg})
	startT(t, s)
	base := "http://" + s.Addr().String()
	if code, _ := doBody(t, "POST", base+"/logging?level=proxy:debug", nil); code != 200 {
		t.Fatalf("good level change = %d", code)
	}
	good := levels.String()
	huge := bytes.Repeat([]byte("x"), 16<<20)
	cases := []struct {
		name, method, path string
		body               []byte
		chunked            bool
		code               int
		reason             string
	}{
		{"unknown level", "POST", "/logging?level=verbose", nil, false, 400, ReasonBadQuery},
		{"65 new scopes", "POST", "/logging?level=" + manyScopes(MaxScopes+1), nil, false, 400, ReasonBadQuery},
		{"empty scope:level", "POST", "/logging?level=:", nil, false, 400, ReasonBadQuery},
		{"GET with parameters", "GET", "/logging?level=debug", nil, false, 400, ReasonBadQuery},
		{"16 MiB body", "POST", "/logging?level=debug", huge, false, 413, ReasonBodyTooLarge},
		{"16 MiB chunked body to quitquitquit", "POST", "/quitquitquit", huge, true, 503, ReasonUnavailable},
		{"DELETE config_dump", "DELETE", "/config_dump", nil, false, 405, ReasonMethod},
		{"unknown path", "GET", "/%ff%00", nil, false, 404, ReasonNotFound},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := testutil.ToFloat64(s.errs.c.WithLabelValues(tc.reason))
			var body io.Reader
			if tc.body != nil {
				body = bytes.NewReader(tc.body)
				if tc.chunked {
					body = io.MultiReader(body) // hides the length: chunked
				}
			}
			code, text := doBody(t, tc.method, base+tc.path, body)
			if code != tc.code || !strings.HasPrefix(text, tc.reason+": ") {
				t.Errorf("%s %s = %d %q, want %d starting %q", tc.method, tc.path, code, text, tc.code, tc.reason)
			}
			if got := testutil.ToFloat64(s.errs.c.WithLabelValues(tc.reason)); got != before+1 {
				t.Errorf("ztunnel_admin_request_errors_total{reason=%q} = %v, want %v", tc.reason, got, before+1)
			}
			if levels.String() != good {
				t.Errorf("levels changed to %q by a bad request, want %q", levels.String(), good)
			}
		})
	}
	n, _ := testutil.GatherAndCount(reg, "ztunnel_admin_request_errors_total")
	t.Logf("fault admin-bad-input: requests=%d refused=%d reasons=%d levels_kept=%v", len(cases), len(cases), n, levels.String() == good)
}

func doBody(t *testing.T, method, url string, body io.Reader) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, body)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func manyScopes(n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "s%d:debug", i)
	}
	return b.String()
}
