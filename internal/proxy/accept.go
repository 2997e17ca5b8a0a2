package proxy

import (
	"errors"
	"net"
	"strconv"
	"syscall"
)

// Accept failure reasons: the "reason" label of
// istio_ztunnel_accept_errors_total. Every one is transient: the listeners
// back off (5 ms doubling to 1 s) and keep serving the connections they
// already have.
const (
	acceptEMFILE  = "emfile"  // process fd limit reached
	acceptENFILE  = "enfile"  // system fd limit reached
	acceptNoMem   = "nomem"   // ENOBUFS / ENOMEM
	acceptAborted = "aborted" // ECONNABORTED: the client gave up first
	acceptOther   = "other"
)

func acceptReason(err error) string {
	switch {
	case errors.Is(err, syscall.EMFILE):
		return acceptEMFILE
	case errors.Is(err, syscall.ENFILE):
		return acceptENFILE
	case errors.Is(err, syscall.ENOBUFS), errors.Is(err, syscall.ENOMEM):
		return acceptNoMem
	case errors.Is(err, syscall.ECONNABORTED):
		return acceptAborted
	}
	return acceptOther
}

// countingListener counts failed Accepts (other than the listener being
// closed) by port and reason. The HBONE server's own loop does the backing
// off for 15008; the connections it returns are the inner listener's.
type countingListener struct {
	net.Listener
	m    *Metrics
	port string
}

func countAccepts(ln net.Listener, m *Metrics) net.Listener {
	port := ""
	if a, ok := ln.Addr().(*net.TCPAddr); ok {
		port = strconv.Itoa(a.Port)
	}
	return &countingListener{Listener: ln, m: m, port: port}
}

func (l *countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil && !errors.Is(err, net.ErrClosed) {
		l.m.acceptErrors.WithLabelValues(l.port, acceptReason(err)).Inc()
	}
	return c, err
}
