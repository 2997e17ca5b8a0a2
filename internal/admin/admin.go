package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Options configure the admin server.
type Options struct {
	// Addr to listen on, e.g. 127.0.0.1:15000. Port 0 picks a free port.
	Addr string
	// Levels backs /logging; nil disables changing levels.
	Levels *Levels
	// Quit is called (once) by POST /quitquitquit to start a graceful
	// shutdown; nil makes the endpoint answer 503.
	Quit func()
	// Logger may be nil.
	Logger *slog.Logger
	// Registerer receives ztunnel_admin_request_errors_total; may be nil.
	Registerer prometheus.Registerer
}

// Section produces one top-level value of /config_dump.
type Section func() (any, error)

// Server is the admin endpoint on :15000.
type Server struct {
	opts Options
	log  *slog.Logger
	http *httpServer
	errs requestErrors

	mu       sync.RWMutex
	sections map[string]Section // guarded by mu

	quitOnce sync.Once
}

// New creates an admin server; it listens when Start is called.
func New(opts Options) *Server {
	s := &Server{opts: opts, log: orDiscard(opts.Logger), sections: map[string]Section{}, errs: newRequestErrors(opts.Registerer)}
	mux := http.NewServeMux()
	mux.HandleFunc("/", s.handleIndex)
	mux.HandleFunc("/config_dump", s.handleConfigDump)
	mux.HandleFunc("/logging", s.handleLogging)
	mux.HandleFunc("/quitquitquit", s.handleQuit)
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	s.http = newHTTPServer("admin", opts.Addr, s.limitBody(mux), s.log)
	return s
}

// Register adds (or replaces) a /config_dump section.
func (s *Server) Register(key string, fn Section) {
	s.mu.Lock()
	s.sections[key] = fn
	s.mu.Unlock()
}

// Start binds the listener and serves in the background until Shutdown.
func (s *Server) Start() error { return s.http.start() }

// Addr is the bound address (valid after Start).
func (s *Server) Addr() net.Addr { return s.http.addr() }

// Shutdown stops the server, waiting for in-flight requests up to ctx.
func (s *Server) Shutdown(ctx context.Context) error { return s.http.shutdown(ctx) }

// ConfigDump renders the document /config_dump serves.
func (s *Server) ConfigDump() ([]byte, error) {
	s.mu.RLock()
	keys := make([]string, 0, len(s.sections))
	for k := range s.sections {
		keys = append(keys, k)
	}
	fns := make(map[string]Section, len(s.sections))
	for k, v := range s.sections {
		fns[k] = v
	}
	s.mu.RUnlock()
	doc := make(map[string]json.RawMessage, len(keys))
	for _, k := range keys {
		v, err := fns[k]()
		if err != nil {
			return nil, fmt.Errorf("admin: config_dump section %s: %w", k, err)
		}
		b, err := json.Marshal(v)
		if err != nil {
			return nil, fmt.Errorf("admin: config_dump section %s: %w", k, err)
		}
		doc[k] = b
	}
	raw, err := json.Marshal(doc) // map keys are sorted by encoding/json
	if err != nil {
		return nil, fmt.Errorf("admin: config_dump: %w", err)
	}
	var out bytes.Buffer
	if err := json.Indent(&out, raw, "", "  "); err != nil {
		return nil, fmt.Errorf("admin: config_dump: %w", err)
	}
	out.WriteByte('\n')
	return out.Bytes(), nil
}

const index = `ztunnel admin
  /config_dump          GET   workloads, services, policies, certificates, workloadState, config
  /logging              GET   current log levels
                        POST  ?level=<level> | ?level=<scope>:<level>,... | ?reset  (level: error|warn|info|debug|trace|off)
  /quitquitquit         POST  drain and exit
  /debug/pprof/         GET   profiles: profile?seconds=N, heap, goroutine, allocs, ...
`

func (s *Server) handleIndex(w http.ResponseWriter, r *http.Request) {
	if r.URL.Path != "/" {
		s.fail(w, ReasonNotFound, "page not found: "+r.URL.Path, http.StatusNotFound)
		return
	}
	if !s.getOnly(w, r) {
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprint(w, index)
}

func (s *Server) handleConfigDump(w http.ResponseWriter, r *http.Request) {
	if !s.getOnly(w, r) {
		return
	}
	body, err := s.ConfigDump()
	if err != nil {
		s.log.Error("config_dump failed", "err", err)
		s.fail(w, ReasonInternal, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.Write(body)
}

func (s *Server) handleLogging(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	if r.Method != http.MethodGet && r.Method != http.MethodPost {
		w.Header().Set("Allow", "GET, POST")
		s.fail(w, ReasonMethod, "use GET to list levels, POST to change them", http.StatusMethodNotAllowed)
		return
	}
	lv := s.opts.Levels
	if lv == nil {
		s.fail(w, ReasonUnavailable, "log levels are not adjustable in this process", http.StatusServiceUnavailable)
		return
	}
	q := r.URL.Query()
	if r.Method == http.MethodPost {
		_, reset := q["reset"]
		level := q.Get("level")
		switch {
		case level != "":
			if err := lv.Set(level); err != nil {
				s.fail(w, ReasonBadQuery, err.Error(), http.StatusBadRequest)
				return
			}
			s.log.Info("log level changed", "levels", lv.String())
		case reset:
			lv.Reset(slog.LevelInfo)
		}
	} else if len(q) > 0 {
		s.fail(w, ReasonBadQuery, "GET /logging takes no parameters; use POST to change levels", http.StatusBadRequest)
		return
	}
	fmt.Fprintf(w, "current log level is %s\n", lv.String())
}

func (s *Server) handleQuit(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", "POST")
		s.fail(w, ReasonMethod, "use POST", http.StatusMethodNotAllowed)
		return
	}
	if s.opts.Quit == nil {
		s.fail(w, ReasonUnavailable, "shutdown is not wired in this process", http.StatusServiceUnavailable)
		return
	}
	s.quitOnce.Do(s.opts.Quit)
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	fmt.Fprint(w, "shutdown now\n")
}

func (s *Server) getOnly(w http.ResponseWriter, r *http.Request) bool {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return true
	}
	w.Header().Set("Allow", "GET")
	s.fail(w, ReasonMethod, "use GET", http.StatusMethodNotAllowed)
	return false
}

func getOnly(w http.ResponseWriter, r *http.Request) bool {
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		return true
	}
	w.Header().Set("Allow", "GET")
	http.Error(w, "method not allowed: use GET", http.StatusMethodNotAllowed)
	return false
}

func orDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}

// httpServer is the listener lifecycle the three endpoints share.
type httpServer struct {
	name string
	srv  *http.Server
	log  *slog.Logger

	mu sync.Mutex
	ln net.Listener // guarded by mu
}

func newHTTPServer(name, addr string, h http.Handler, log *slog.Logger) *httpServer {
	return &httpServer{
		name: name,
		log:  log,
		srv: &http.Server{
			Addr:              addr,
			Handler:           h,
			ReadHeaderTimeout: 10 * time.Second,
		},
	}
}

func (h *httpServer) start() error {
	ln, err := net.Listen("tcp", h.srv.Addr)
	if err != nil {
		return fmt.Errorf("admin: %s listen %s: %w", h.name, h.srv.Addr, err)
	}
	h.mu.Lock()
	h.ln = ln
	h.mu.Unlock()
	h.log.Info("listening", "server", h.name, "addr", ln.Addr().String())
	go func() {
		if err := h.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			h.log.Error("serve failed", "server", h.name, "err", err)
		}
	}()
	return nil
}

func (h *httpServer) addr() net.Addr {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ln == nil {
		return nil
	}
	return h.ln.Addr()
}

func (h *httpServer) shutdown(ctx context.Context) error {
	err := h.srv.Shutdown(ctx)
	if err != nil {
		h.srv.Close()
	}
	return err
}

// sortedKeys returns m's keys in order.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}
