package proxy

import "time"

// SetRestAfter sets how soon a quiet connection's copy moves to a fresh
// goroutine, for a test, and returns the previous value.
func SetRestAfter(d time.Duration) time.Duration {
	old := restAfter
	restAfter = d
	return old
}

// Rests is how many copies moved to a fresh goroutine so far.
func Rests() int64 { return rests.Load() }
