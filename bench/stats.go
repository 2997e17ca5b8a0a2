package main

import (
	"slices"
	"time"
)

// Latency is a latency distribution in microseconds.
type Latency struct {
	P50   float64 `json:"p50"`
	P90   float64 `json:"p90"`
	P99   float64 `json:"p99"`
	P999  float64 `json:"p999"`
	Max   float64 `json:"max"`
	Count int     `json:"count"`
}

// summarize sorts ds in place and returns its percentiles (nearest rank).
func summarize(ds []time.Duration) Latency {
	if len(ds) == 0 {
		return Latency{}
	}
	slices.Sort(ds)
	q := func(p float64) float64 {
		// nearest rank: the smallest value with at least p of the samples
		// at or below it.
		i := int(p*float64(len(ds))+0.999999999) - 1
		i = max(0, min(i, len(ds)-1))
		return us(ds[i])
	}
	return Latency{P50: q(0.50), P90: q(0.90), P99: q(0.99), P999: q(0.999), Max: us(ds[len(ds)-1]), Count: len(ds)}
}

func us(d time.Duration) float64 { return float64(d.Nanoseconds()) / 1e3 }

// gbps is bits per second in units of 10^9.
func gbps(bytes int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return float64(bytes) * 8 / d.Seconds() / 1e9
}

// median is the middle value of vs (the mean of the two middle ones for
// an even count), 0 for none. It sorts vs.
func median(vs []float64) float64 {
	if len(vs) == 0 {
		return 0
	}
	slices.Sort(vs)
	n := len(vs)
	if n%2 == 1 {
		return vs[n/2]
	}
	return (vs[n/2-1] + vs[n/2]) / 2
}
