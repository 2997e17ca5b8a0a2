//go:build !amd64

package aesgcm

import "crypto/cipher"

const cpuHasVAES = false

// gcmAsm is never made here; it exists so the tests build.
type gcmAsm struct{ cipher.AEAD }

func newAsm(key []byte) cipher.AEAD { panic("aesgcm: no assembly on this architecture") }
