package main

import (
	"bytes"
	"fmt"
	"math/rand/v2"
)

// Every payload byte the harness sends is byte (offset mod patternPeriod) of
// one fixed pseudo-random sequence. A prime period means a lost, repeated or
// reordered chunk of any power-of-two size shifts the phase and is caught;
// checking is a memcmp against the expected slice, fast enough not to limit
// multi-Gbit/s streams.
const (
	patternPeriod = 65521 // largest prime below 64 KiB
	// maxChunk bounds one read or write of a pattern stream.
	maxChunk = 256 << 10
)

// pattern is patternPeriod bytes repeated to patternPeriod+maxChunk, so the
// expected bytes for any chunk at any offset are one contiguous slice.
var pattern = func() []byte {
	r := rand.New(rand.NewPCG(0x7a74756e, 0x6e656c21))
	period := make([]byte, patternPeriod)
	for i := range period {
		period[i] = byte(r.Uint32())
	}
	p := make([]byte, patternPeriod+maxChunk)
	for i := range p {
		p[i] = period[i%patternPeriod]
	}
	return p
}()

// patternAt returns the n (≤ maxChunk) pattern bytes starting at stream
// offset off.
func patternAt(off int64, n int) []byte {
	s := int(off % patternPeriod)
	return pattern[s : s+n]
}

// checker verifies a stream against the pattern as it arrives.
type checker struct {
	off int64 // bytes checked so far
	bad int64 // offset of the first wrong byte, -1 if none
}

func newChecker() *checker { return &checker{bad: -1} }

// check consumes b (any length) and returns false once a byte was wrong.
func (c *checker) check(b []byte) bool {
	for len(b) > 0 {
		n := min(len(b), maxChunk)
		if c.bad < 0 {
			want := patternAt(c.off, n)
			if !bytes.Equal(b[:n], want) {
				for i := range n {
					if b[i] != want[i] {
						c.bad = c.off + int64(i)
						break
					}
				}
			}
		}
		c.off += int64(n)
		b = b[n:]
	}
	return c.bad < 0
}

func (c *checker) err() error {
	if c.bad >= 0 {
		return fmt.Errorf("corrupted stream: first wrong byte at offset %d of %d", c.bad, c.off)
	}
	return nil
}

// request fills b (len ≥ 8) with a request: the sequence number in the
// first 8 bytes (so a response to another request is caught) and pattern
// bytes after.
func request(b []byte, seq uint64) {
	for i := range 8 {
		b[i] = byte(seq >> (8 * i))
	}
	copy(b[8:], patternAt(int64(seq), len(b)-8))
}
