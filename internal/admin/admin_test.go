package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type started interface {
	Start() error
	Shutdown(context.Context) error
}

func startT(t *testing.T, s started) {
	t.Helper()
	if err := s.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Shutdown(context.Background()) })
}

func do(t *testing.T, method, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
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

func TestAdminEndpoints(t *testing.T) {
	defer http.DefaultClient.CloseIdleConnections()
	var buf bytes.Buffer
	levels := NewLevels(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug - 10}), slog.LevelInfo)
	quit := make(chan struct{}, 2)
	s := New(Options{Addr: "127.0.0.1:0", Levels: levels, Quit: func() { quit <- struct{}{} }})
	s.Register("workloads", func() (any, error) { return []map[string]string{{"uid": "u1"}}, nil })
	s.Register("version", func() (any, error) { return map[string]string{"version": "test"}, nil })
	startT(t, s)
	base := "http://" + s.Addr().String()

	cases := []struct {
		name       string
		method     string
		path       string
		wantStatus int
		wantBody   string // substring
	}{
		{"index", "GET", "/", 200, "/config_dump"},
		{"unknown path", "GET", "/nope", 404, "not found"},
		{"config dump", "GET", "/config_dump", 200, `"uid": "u1"`},
		{"config dump post", "POST", "/config_dump", 405, "use GET"},
		{"logging list", "GET", "/logging", 200, "current log level is info"},
		{"logging set", "POST", "/logging?level=proxy:debug", 200, "current log level is info,proxy:debug"},
		{"logging bad level", "POST", "/logging?level=loud", 400, `level "loud" is invalid`},
		{"logging bad scope", "POST", "/logging?level=:debug", 400, "with level one of error|warn|info|debug|trace|off"},
		{"logging put", "PUT", "/logging?level=debug", 405, "use GET to list levels"},
		{"logging get with params", "GET", "/logging?level=debug", 400, "use POST to change levels"},
		{"logging reset", "POST", "/logging?reset", 200, "current log level is info\n"},
		{"quit get", "GET", "/quitquitquit", 405, "use POST"},
		{"quit", "POST", "/quitquitquit", 200, "shutdown now"},
		{"pprof index", "GET", "/debug/pprof/", 200, "goroutine"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			code, body := do(t, tc.method, base+tc.path)
			if code != tc.wantStatus || !strings.Contains(body, tc.wantBody) {
				t.Fatalf("%s %s = %d %q, want %d containing %q", tc.method, tc.path, code, body, tc.wantStatus, tc.wantBody)
			}
		})
	}
	if len(quit) != 1 {
		t.Fatalf("Quit called %d times, want 1", len(quit))
	}
	do(t, "POST", base+"/quitquitquit")
	if len(quit) != 1 {
		t.Fatalf("second /quitquitquit called Quit again")
	}

	var doc map[string]json.RawMessage
	raw, err := s.ConfigDump()
	if err != nil || json.Unmarshal(raw, &doc) != nil {
		t.Fatalf("config dump not JSON: %v %s", err, raw)
	}
	if len(doc) != 2 || doc["workloads"] == nil || doc["version"] == nil {
		t.Fatalf("config dump keys: %v", doc)
	}
}

func TestLevelsApplyAtRunTime(t *testing.T) {
	var buf bytes.Buffer
	levels := NewLevels(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug - 10}), slog.LevelInfo)
	proxy, xds := levels.Logger("proxy"), levels.Logger("xds")
	proxy.Debug("hidden")
	if err := levels.Set("proxy:debug"); err != nil {
		t.Fatal(err)
	}
	proxy.Debug("shown-proxy")
	xds.Debug("hidden-xds")
	if err := levels.Set("off"); err != nil {
		t.Fatal(err)
	}
	proxy.Error("hidden-off")
	out := buf.String()
	if strings.Contains(out, "hidden") || !strings.Contains(out, "shown-proxy") || !strings.Contains(out, "scope=proxy") {
		t.Fatalf("log output:\n%s", out)
	}
}

func TestReadinessAndStats(t *testing.T) {
	defer http.DefaultClient.CloseIdleConnections()
	r := NewReadiness("127.0.0.1:0", nil)
	xdsDone := r.Register("xds")
	certDone := r.Register("certificates")
	startT(t, r)
	url := "http://" + r.Addr().String() + "/healthz/ready"
	if code, body := do(t, "GET", url); code != 503 || body != "not ready: waiting for certificates, xds\n" {
		t.Fatalf("initial readiness = %d %q", code, body)
	}
	xdsDone()
	if code, body := do(t, "GET", url); code != 503 || body != "not ready: waiting for certificates\n" {
		t.Fatalf("readiness after xds = %d %q", code, body)
	}
	certDone()
	certDone()
	if code, body := do(t, "GET", url); code != 200 || body != "ready\n" {
		t.Fatalf("readiness after all = %d %q", code, body)
	}

	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "istio_test_total", Help: "test"})
	reg.MustRegister(c)
	c.Add(3)
	st := NewStats("127.0.0.1:0", reg, nil)
	startT(t, st)
	for _, p := range []string{"/metrics", "/stats/prometheus"} {
		code, body := do(t, "GET", "http://"+st.Addr().String()+p)
		if code != 200 || !strings.Contains(body, "istio_test_total 3") {
			t.Fatalf("%s = %d %q", p, code, body)
		}
	}
}
