package aesgcm

import (
	"crypto/aes"
	"crypto/cipher"
	"sync/atomic"
)

// The sizes TLS 1.3 uses, the only ones the assembly implements.
const (
	nonceSize = 12
	tagSize   = 16
)

// useAsm: New returns the assembly. Set where the CPU has the
// instructions unless UseAssembly(false) turned it off.
var useAsm atomic.Bool

func init() { useAsm.Store(cpuHasVAES) }

// UseAssembly turns the assembly on (only where the CPU has the
// instructions) or off for every later New; AEADs already made keep theirs.
// ztunnel calls it once at start-up from ZTUNNEL_AES_GCM.
func UseAssembly(on bool) { useAsm.Store(on && cpuHasVAES) }

// Accelerated reports whether New returns the assembly (for start-up logs).
func Accelerated() bool { return useAsm.Load() }

// New returns AES-GCM with a 12-byte nonce and a 16-byte tag for a 16- or
// 32-byte key; other key sizes get crypto/cipher's GCM, as does every key
// when the assembly is not available.
func New(key []byte) (cipher.AEAD, error) {
	if useAsm.Load() && (len(key) == 16 || len(key) == 32) {
		return newAsm(key), nil
	}
	return newStdlib(key)
}

func newStdlib(key []byte) (cipher.AEAD, error) {
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(block)
}
