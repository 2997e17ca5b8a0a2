package admin

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
)

// Reasons an admin request is refused. Each is the "reason" label of
// ztunnel_admin_request_errors_total and starts the error body.
const (
	// ReasonMethod: a method the endpoint does not take.
	ReasonMethod = "method_not_allowed"
	// ReasonBadQuery: a query parameter the endpoint cannot use (an unknown
	// log level or scope, parameters on GET /logging).
	ReasonBadQuery = "bad_query"
	// ReasonBodyTooLarge: a request body over MaxRequestBody; no admin
	// endpoint takes a body, so a large one is refused unread.
	ReasonBodyTooLarge = "body_too_large"
	// ReasonNotFound: a path no endpoint serves.
	ReasonNotFound = "not_found"
	// ReasonUnavailable: the endpoint is not wired in this process.
	ReasonUnavailable = "unavailable"
	// ReasonInternal: a config_dump section failed.
	ReasonInternal = "internal"
)

// MaxRequestBody bounds what an admin request may carry: no endpoint reads
// a body, so anything beyond a few bytes is a client mistake or abuse, and
// is refused before net/http spends effort discarding it.
const MaxRequestBody = 1 << 10

// requestErrors counts refused requests; nil-safe.
type requestErrors struct{ c *prometheus.CounterVec }

func newRequestErrors(r prometheus.Registerer) requestErrors {
	if r == nil {
		return requestErrors{}
	}
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ztunnel_admin_request_errors_total",
		Help: "Admin (15000) requests refused, by reason.",
	}, []string{"reason"})
	if err := r.Register(c); err != nil {
		if are, ok := err.(prometheus.AlreadyRegisteredError); ok {
			c = are.ExistingCollector.(*prometheus.CounterVec)
		}
	}
	return requestErrors{c: c}
}

// fail answers code with "<reason>: <msg>" and counts reason.
func (s *Server) fail(w http.ResponseWriter, reason, msg string, code int) {
	if s.errs.c != nil {
		s.errs.c.WithLabelValues(reason).Inc()
	}
	s.log.Debug("admin: request refused", "reason", reason, "err", msg)
	http.Error(w, reason+": "+msg, code)
}

// limitBody refuses requests whose body is, or turns out to be, larger than
// MaxRequestBody.
func (s *Server) limitBody(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ContentLength > MaxRequestBody {
			w.Header().Set("Connection", "close")
			s.fail(w, ReasonBodyTooLarge, "admin endpoints take no request body", http.StatusRequestEntityTooLarge)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, MaxRequestBody)
		next.ServeHTTP(w, r)
	})
}
