package main

import (
	"crypto/cipher"
	"errors"
	"fmt"

	"github.com/ztunnel-go/ztunnel/internal/aesgcm"
)

// The sealed-relay-pair scenario is relay-pair with the leg between the
// two relays sealed the way TLS 1.3 seals application data: records of at
// most 16 KiB, each with a 5-byte header (its additional data) and a
// 16-byte AES-128-GCM tag, the nonce the IV XOR the record's sequence
// number, one key per direction — the cipher suite crypto/tls picks on this
// CPU, through the AES-GCM code ztunnel's record layer uses (package
// aesgcm: VAES assembly where the CPU has it, Go's crypto/cipher
// elsewhere). No handshake, HTTP/2 or anything else. It answers what the
// bare relays cannot: whether a target is out of reach for any proxy that
// encrypts its traffic with that AES-GCM on this machine, or only for
// ztunnel.
//
// The keys are fixed and public: the yardstick measures the cost of
// sealing, not secrecy.

const (
	sealRecordMax = 16 << 10 // TLS's largest record payload
	sealHeaderLen = 5
	sealTagLen    = 16
	sealOverhead  = sealHeaderLen + sealTagLen
	// sealTypeData is TLS's application_data record type; sealed records
	// carry it and the legacy version 3.3, as TLS 1.3 records do.
	sealTypeData = 23
)

// sealedPrefix marks the address whose socket carries sealed records in a
// relay's "listen>target" argument.
const sealedPrefix = "sealed:"

// sealKeys[0] seals what the dialling relay sends, sealKeys[1] what the
// accepting relay sends.
var sealKeys = [2]struct{ key, iv []byte }{
	{[]byte("bench-relay-key0"), []byte("bench-iv-0.0")},
	{[]byte("bench-relay-key1"), []byte("bench-iv-1.1")},
}

// sealDir is one direction of a sealed socket.
type sealDir struct {
	aead  cipher.AEAD
	iv    [12]byte
	seq   uint64
	nonce [12]byte
}

func newSealDir(i int) (sealDir, error) {
	g, err := aesgcm.New(sealKeys[i].key)
	if err != nil {
		return sealDir{}, err
	}
	d := sealDir{aead: g}
	copy(d.iv[:], sealKeys[i].iv)
	return d, nil
}

// next is the nonce of the next record.
func (d *sealDir) next() []byte {
	d.nonce = d.iv
	for i := range 8 {
		d.nonce[4+i] ^= byte(d.seq >> (56 - 8*i))
	}
	d.seq++
	return d.nonce[:]
}

// sealer is the record layer of one sealed socket.
type sealer struct {
	w, r sealDir
	// in holds the start of a record read without its end.
	in []byte
}

// newSealer: the dialling end writes with key 0 and reads with key 1, the
// accepting end the other way round.
func newSealer(dialer bool) (*sealer, error) {
	wi, ri := 1, 0
	if dialer {
		wi, ri = 0, 1
	}
	w, err := newSealDir(wi)
	if err != nil {
		return nil, fmt.Errorf("relay: seal: %w", err)
	}
	r, err := newSealDir(ri)
	if err != nil {
		return nil, fmt.Errorf("relay: seal: %w", err)
	}
	return &sealer{w: w, r: r}, nil
}

// sealedSize is the most sealing n bytes can take.
func sealedSize(n int) int { return n + (n/sealRecordMax+1)*sealOverhead }

// seal appends p to dst as records.
func (s *sealer) seal(dst, p []byte) []byte {
	for len(p) > 0 {
		n := min(len(p), sealRecordMax)
		m := n + sealTagLen
		hdr := [sealHeaderLen]byte{sealTypeData, 3, 3, byte(m >> 8), byte(m)}
		dst = append(dst, hdr[:]...)
		dst = s.w.aead.Seal(dst, s.w.next(), p[:n], hdr[:])
		p = p[n:]
	}
	return dst
}

var errBadRecord = errors.New("relay: bad sealed record")

// open opens, in place, the complete records at the start of b. It
// returns their plaintext, moved to the start of b, and what is left of b
// after them (the start of a record yet to be read).
func (s *sealer) open(b []byte) (plain, rest []byte, err error) {
	w, off := 0, 0
	for len(b)-off >= sealHeaderLen {
		h := b[off : off+sealHeaderLen]
		m := int(h[3])<<8 | int(h[4])
		if h[0] != sealTypeData || m < sealTagLen || m > sealRecordMax+sealTagLen {
			return nil, nil, errBadRecord
		}
		if len(b)-off-sealHeaderLen < m {
			break
		}
		ct := b[off+sealHeaderLen : off+sealHeaderLen+m]
		pt, err := s.r.aead.Open(ct[:0], s.r.next(), ct, h)
		if err != nil {
			return nil, nil, fmt.Errorf("%w: %v", errBadRecord, err)
		}
		w += copy(b[w:], pt)
		off += sealHeaderLen + m
	}
	return b[:w], b[off:], nil
}
