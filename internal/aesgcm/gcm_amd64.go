package aesgcm

import (
	"crypto/cipher"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"unsafe"

	"golang.org/x/sys/cpu"
)

// x/sys/cpu sets the AVX-512 flags only when the OS saves the 512-bit
// register state.
var cpuHasVAES = cpu.X86.HasAES && cpu.X86.HasPCLMULQDQ && cpu.X86.HasAVX &&
	cpu.X86.HasAVX512F && cpu.X86.HasAVX512BW && cpu.X86.HasAVX512VL &&
	cpu.X86.HasAVX512VAES && cpu.X86.HasAVX512VPCLMULQDQ

//go:noescape
func expandKey128(key *byte, rk *[240]byte)

//go:noescape
func expandKey256(key *byte, rk *[240]byte)

//go:noescape
func encryptBlock(rk *[240]byte, rounds int, dst, src *[16]byte)

//go:noescape
func gfmul(a, b *[16]byte)

//go:noescape
func ghashBlocks(htab *[256]byte, acc *[16]byte, p *byte, n int)

//go:noescape
func ctrBlocks(rk *[240]byte, rounds int, ctr *[16]byte, dst, src *byte, n int)

// GCM counts blocks in 32 bits and uses the first for the tag.
const maxPlaintext = (1<<32 - 2) * 16

var errOpen = errors.New("cipher: message authentication failed")

// gcmAsm is immutable after newAsm, so one may seal and open from several
// goroutines, as crypto/cipher's may.
type gcmAsm struct {
	rk     [240]byte // expanded key, 16 bytes per round
	rounds int       // 10 or 14
	htab   [256]byte // H·x^-1 to the powers 16..1, see gcm_amd64.s
}

func newAsm(key []byte) cipher.AEAD {
	g := &gcmAsm{}
	if len(key) == 16 {
		expandKey128(&key[0], &g.rk)
		g.rounds = 10
	} else {
		expandKey256(&key[0], &g.rk)
		g.rounds = 14
	}
	var zero, h [16]byte
	encryptBlock(&g.rk, g.rounds, &h, &zero)
	// H as the byte-reversed integer, times x^-1: a left shift of the
	// reflected value, with the bit shifted out folded back in.
	hi := binary.BigEndian.Uint64(h[:8])
	lo := binary.BigEndian.Uint64(h[8:])
	carry := -(hi >> 63)
	hi = hi<<1 | lo>>63
	lo <<= 1
	hi ^= carry & 0xc200000000000000
	lo ^= carry & 1
	var p, h1 [16]byte
	binary.LittleEndian.PutUint64(h1[:8], lo)
	binary.LittleEndian.PutUint64(h1[8:], hi)
	p = h1
	copy(g.htab[240:], h1[:])
	for i := 14; i >= 0; i-- {
		gfmul(&p, &h1)
		copy(g.htab[16*i:], p[:])
	}
	return g
}

func (g *gcmAsm) NonceSize() int { return nonceSize }
func (g *gcmAsm) Overhead() int  { return tagSize }

func (g *gcmAsm) Seal(dst, nonce, plaintext, additionalData []byte) []byte {
	if uint64(len(plaintext)) > maxPlaintext {
		panic("crypto/cipher: message too large for GCM")
	}
	ret, out := sliceForAppend(dst, len(plaintext)+tagSize)
	checkArgs(nonce, out, plaintext, additionalData)
	var ctr, tagMask [16]byte
	g.init(&ctr, &tagMask, nonce)
	g.ctr(&ctr, out[:len(plaintext)], plaintext)
	g.tag(out[len(plaintext):], &tagMask, out[:len(plaintext)], additionalData)
	return ret
}

func (g *gcmAsm) Open(dst, nonce, ciphertext, additionalData []byte) ([]byte, error) {
	if len(ciphertext) < tagSize || uint64(len(ciphertext)) > maxPlaintext+tagSize {
		return nil, errOpen
	}
	body, sent := ciphertext[:len(ciphertext)-tagSize], ciphertext[len(ciphertext)-tagSize:]
	ret, out := sliceForAppend(dst, len(body))
	checkArgs(nonce, out, ciphertext, additionalData)
	var ctr, tagMask [16]byte
	g.init(&ctr, &tagMask, nonce)
	var want [tagSize]byte
	g.tag(want[:], &tagMask, body, additionalData)
	if subtle.ConstantTimeCompare(want[:], sent) != 1 {
		clear(out)
		return nil, errOpen
	}
	g.ctr(&ctr, out, body)
	return ret, nil
}

// checkArgs panics, with crypto/cipher's messages, on what crypto/cipher's
// GCM panics on: a wrong nonce size, output overlapping the input other
// than in place, output overlapping the additional data.
func checkArgs(nonce, out, in, additionalData []byte) {
	if len(nonce) != nonceSize {
		panic("crypto/cipher: incorrect nonce length given to GCM")
	}
	if inexactOverlap(out, in) {
		panic("crypto/cipher: invalid buffer overlap")
	}
	if inexactOverlap(out, additionalData) {
		panic("crypto/cipher: invalid buffer overlap of output and additional data")
	}
}

// init sets ctr to the first counter block of the payload and tagMask to
// the encrypted pre-counter block J0 = nonce || 1.
func (g *gcmAsm) init(ctr, tagMask *[16]byte, nonce []byte) {
	copy(ctr[:], nonce)
	ctr[15] = 1
	encryptBlock(&g.rk, g.rounds, tagMask, ctr)
	ctr[15] = 2
}

// ctr XORs src with the key stream into dst (same length).
func (g *gcmAsm) ctr(ctr *[16]byte, dst, src []byte) {
	full := len(src) &^ 15
	if full > 0 {
		ctrBlocks(&g.rk, g.rounds, ctr, &dst[0], &src[0], full)
	}
	if rest := len(src) - full; rest > 0 {
		var b [16]byte
		copy(b[:], src[full:])
		ctrBlocks(&g.rk, g.rounds, ctr, &b[0], &b[0], 16)
		copy(dst[full:], b[:rest])
	}
}

// tag writes GHASH(additionalData, ciphertext) XOR tagMask to out.
func (g *gcmAsm) tag(out []byte, tagMask *[16]byte, ciphertext, additionalData []byte) {
	var acc [16]byte
	g.ghash(&acc, additionalData)
	g.ghash(&acc, ciphertext)
	var lens [16]byte
	binary.BigEndian.PutUint64(lens[:8], uint64(len(additionalData))*8)
	binary.BigEndian.PutUint64(lens[8:], uint64(len(ciphertext))*8)
	ghashBlocks(&g.htab, &acc, &lens[0], 16)
	// acc is the byte-reversed GHASH value.
	for i := range tagSize {
		out[i] = acc[15-i] ^ tagMask[i]
	}
}

// ghash absorbs p, zero-padded to a whole block.
func (g *gcmAsm) ghash(acc *[16]byte, p []byte) {
	full := len(p) &^ 15
	if full > 0 {
		ghashBlocks(&g.htab, acc, &p[0], full)
	}
	if len(p) > full {
		var b [16]byte
		copy(b[:], p[full:])
		ghashBlocks(&g.htab, acc, &b[0], 16)
	}
}

// sliceForAppend extends in by n bytes, reusing its capacity when it can;
// head is the whole slice, tail the n new bytes.
func sliceForAppend(in []byte, n int) (head, tail []byte) {
	if total := len(in) + n; cap(in) >= total {
		head = in[:total]
	} else {
		head = make([]byte, total)
		copy(head, in)
	}
	return head, head[len(in):]
}

// inexactOverlap reports whether x and y share memory other than starting
// at the same address: in-place sealing is allowed, a shifted overlap would
// read bytes already overwritten.
func inexactOverlap(x, y []byte) bool {
	if len(x) == 0 || len(y) == 0 || &x[0] == &y[0] {
		return false
	}
	xs, ys := uintptr(unsafe.Pointer(&x[0])), uintptr(unsafe.Pointer(&y[0]))
	return xs <= ys+uintptr(len(y)-1) && ys <= xs+uintptr(len(x)-1)
}
