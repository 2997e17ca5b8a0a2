//go:build race

package hbone

// raceEnabled: under the race detector sync.Pool drops items at random and
// the detector allocates by itself, so allocation figures mean nothing.
const raceEnabled = true
