package identity

import (
	"testing"
	"time"
)

func TestRenewDelay(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name                string
		notBefore, notAfter time.Time
		r                   float64
		want                time.Duration
	}{
		{name: "half life", notBefore: now, notAfter: now.Add(24 * time.Hour), r: 0.5, want: 12 * time.Hour},
		{name: "earliest jitter", notBefore: now, notAfter: now.Add(10 * time.Second), r: 0, want: 4500 * time.Millisecond},
		{name: "latest jitter", notBefore: now, notAfter: now.Add(10 * time.Second), r: 1, want: 5500 * time.Millisecond},
		{name: "backdated NotBefore counts from now", notBefore: now.Add(-time.Hour), notAfter: now.Add(2 * time.Second), r: 0.5, want: time.Second},
		{name: "NotBefore in the future", notBefore: now.Add(10 * time.Second), notAfter: now.Add(30 * time.Second), r: 0.5, want: 20 * time.Second},
		{name: "already expired", notBefore: now.Add(-2 * time.Hour), notAfter: now.Add(-time.Hour), r: 0.5, want: retryInitial},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &Certificate{NotBefore: tc.notBefore, NotAfter: tc.notAfter}
			if got := renewDelay(c, now, tc.r); got != tc.want {
				t.Fatalf("renewDelay = %s, want %s", got, tc.want)
			}
		})
	}
}

func TestJitterBounds(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    float64
		want time.Duration
	}{
		{name: "low", r: 0, want: 800 * time.Millisecond},
		{name: "middle", r: 0.5, want: time.Second},
		{name: "high", r: 1, want: 1200 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := jitter(time.Second, retryJitter, tc.r); got != tc.want {
				t.Fatalf("jitter = %s, want %s", got, tc.want)
			}
		})
	}
}
