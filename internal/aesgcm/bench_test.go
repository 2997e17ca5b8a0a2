package aesgcm

import (
	"crypto/cipher"
	"fmt"
	"testing"
)

// BenchmarkSeal compares this package's assembly with crypto/cipher's GCM
// on TLS-record sizes (16 KiB + 1 is a full record with its content type).
func BenchmarkSeal(b *testing.B) {
	for _, n := range []int{1024, 16385} {
		asm, std := pair(b, make([]byte, 16))
		for _, impl := range []struct {
			name string
			aead cipher.AEAD
		}{{"asm", asm}, {"stdlib", std}} {
			b.Run(fmt.Sprintf("%s/%d", impl.name, n), func(b *testing.B) {
				buf := make([]byte, n+tagSize)
				nonce, ad := make([]byte, nonceSize), make([]byte, 5)
				b.SetBytes(int64(n))
				for b.Loop() {
					impl.aead.Seal(buf[:0], nonce, buf[:n], ad)
				}
			})
		}
	}
}

func BenchmarkOpen(b *testing.B) {
	n := 16385
	asm, std := pair(b, make([]byte, 16))
	for _, impl := range []struct {
		name string
		aead cipher.AEAD
	}{{"asm", asm}, {"stdlib", std}} {
		b.Run(impl.name, func(b *testing.B) {
			nonce, ad := make([]byte, nonceSize), make([]byte, 5)
			sealed := impl.aead.Seal(nil, nonce, make([]byte, n), ad)
			out := make([]byte, n)
			b.SetBytes(int64(n))
			for b.Loop() {
				if _, err := impl.aead.Open(out[:0], nonce, sealed, ad); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
