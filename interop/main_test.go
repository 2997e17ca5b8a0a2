package interop

import (
	"testing"

	"go.uber.org/goleak"
)

// checkLeaks fails t if goroutines started during it are still running
// after its cleanups (it runs last, being registered first).
func checkLeaks(t *testing.T) {
	t.Helper()
	opt := goleak.IgnoreCurrent()
	t.Cleanup(func() { goleak.VerifyNone(t, opt) })
}
