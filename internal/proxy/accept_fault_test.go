package proxy

import (
	"errors"
	"net"
	"os"
	"syscall"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
)

// scriptedListener returns its errors in order, then net.ErrClosed.
type scriptedListener struct {
	net.Listener
	errs []error
}

func (l *scriptedListener) Accept() (net.Conn, error) {
	if len(l.errs) == 0 {
		return nil, net.ErrClosed
	}
	err := l.errs[0]
	l.errs = l.errs[1:]
	return nil, err
}

func (l *scriptedListener) Addr() net.Addr { return &net.TCPAddr{Port: 15001} }

// TestFaultAcceptErrorsCounted: each failed Accept is counted once under
// its reason; closing the listener is not a failure.
func TestFaultAcceptErrorsCounted(t *testing.T) {
	wrap := func(e syscall.Errno) error {
		return &net.OpError{Op: "accept", Net: "tcp", Err: os.NewSyscallError("accept4", e)}
	}
	cases := []struct {
		err    error
		reason string
	}{
		{wrap(syscall.EMFILE), acceptEMFILE},
		{wrap(syscall.ENFILE), acceptENFILE},
		{wrap(syscall.ENOBUFS), acceptNoMem},
		{wrap(syscall.ECONNABORTED), acceptAborted},
		{errors.New("weird"), acceptOther},
	}
	m := NewMetrics(nil)
	var errs []error
	for _, tc := range cases {
		errs = append(errs, tc.err, tc.err)
	}
	ln := countAccepts(&scriptedListener{errs: errs}, m)
	for {
		if _, err := ln.Accept(); errors.Is(err, net.ErrClosed) {
			break
		}
	}
	for _, tc := range cases {
		if got := testutil.ToFloat64(m.acceptErrors.WithLabelValues("15001", tc.reason)); got != 2 {
			t.Errorf("accept errors{port=15001,reason=%s} = %v, want 2", tc.reason, got)
		}
	}
	if n := testutil.CollectAndCount(m.acceptErrors); n != len(cases) {
		t.Errorf("%d label sets, want %d (ErrClosed must not count)", n, len(cases))
	}
}
