package admin

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Stats serves Prometheus metrics on :15020 at /metrics and, for scrapers
// configured for Envoy-style proxies, /stats/prometheus.
type Stats struct {
	http     *httpServer
	onScrape func() // set before Start; may be nil
}

// NewStats serves g on addr.
func NewStats(addr string, g prometheus.Gatherer, log *slog.Logger) *Stats {
	s := &Stats{}
	prom := promhttp.HandlerFor(g, promhttp.HandlerOpts{ErrorLog: promLogger{orDiscard(log)}})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		prom.ServeHTTP(w, r)
		if s.onScrape != nil {
			s.onScrape()
		}
	})
	mux := http.NewServeMux()
	mux.Handle("/metrics", h)
	mux.Handle("/stats/prometheus", h)
	s.http = newHTTPServer("stats", addr, mux, orDiscard(log))
	return s
}

// OnScrape sets fn to run after each scrape was answered (ztunnel trims
// the cold pages a scrape touched). Call it before Start.
func (s *Stats) OnScrape(fn func()) { s.onScrape = fn }

func (s *Stats) Start() error                       { return s.http.start() }
func (s *Stats) Addr() net.Addr                     { return s.http.addr() }
func (s *Stats) Shutdown(ctx context.Context) error { return s.http.shutdown(ctx) }

type promLogger struct{ l *slog.Logger }

func (p promLogger) Println(v ...any) { p.l.Warn("metrics: " + strings.TrimSpace(fmt.Sprintln(v...))) }

// Readiness serves /healthz/ready on :15021: 200 once every registered
// condition is met, otherwise 503 naming what is still missing.
type Readiness struct {
	http *httpServer

	mu      sync.Mutex
	pending map[string]string // condition → why it is still pending ("" unknown); guarded by mu
}

// NewReadiness serves readiness on addr.
func NewReadiness(addr string, log *slog.Logger) *Readiness {
	r := &Readiness{pending: map[string]string{}}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz/ready", r.handle)
	r.http = newHTTPServer("readiness", addr, mux, orDiscard(log))
	return r
}

// Register adds a condition that must be marked done before the process is
// ready, and returns the function that marks it (safe to call twice).
func (r *Readiness) Register(name string) (done func()) {
	r.mu.Lock()
	r.pending[name] = ""
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		delete(r.pending, name)
		r.mu.Unlock()
	}
}

// SetDetail records why condition name is still pending (for example the
// last xDS connection error); the 503 body shows it after the name. It does
// nothing once the condition is met. An empty detail clears it.
func (r *Readiness) SetDetail(name, detail string) {
	r.mu.Lock()
	if _, ok := r.pending[name]; ok {
		r.pending[name] = detail
	}
	r.mu.Unlock()
}

// Pending lists conditions not yet met, sorted.
func (r *Readiness) Pending() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return sortedKeys(r.pending)
}

func (r *Readiness) handle(w http.ResponseWriter, req *http.Request) {
	if !getOnly(w, req) {
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if p := r.pendingText(); len(p) > 0 {
		w.WriteHeader(http.StatusServiceUnavailable)
		fmt.Fprintf(w, "not ready: waiting for %s\n", strings.Join(p, ", "))
		return
	}
	fmt.Fprint(w, "ready\n")
}

// pendingText is Pending with each detail in parentheses.
func (r *Readiness) pendingText() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := sortedKeys(r.pending)
	for i, name := range out {
		if d := r.pending[name]; d != "" {
			out[i] = name + " (" + d + ")"
		}
	}
	return out
}

func (r *Readiness) Start() error                       { return r.http.start() }
func (r *Readiness) Addr() net.Addr                     { return r.http.addr() }
func (r *Readiness) Shutdown(ctx context.Context) error { return r.http.shutdown(ctx) }
