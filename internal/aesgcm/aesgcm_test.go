package aesgcm

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"encoding/hex"
	"math/rand/v2"
	"testing"
)

// pair returns this package's assembly and crypto/cipher's GCM for one key.
func pair(t testing.TB, key []byte) (asm, std cipher.AEAD) {
	t.Helper()
	if !cpuHasVAES {
		t.Skip("aesgcm: this CPU lacks VAES/VPCLMULQDQ with AVX-512; only crypto/cipher's GCM runs here")
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		t.Fatal(err)
	}
	std, err = cipher.NewGCM(block)
	if err != nil {
		t.Fatal(err)
	}
	return newAsm(key), std
}

func randBytes(r *rand.ChaCha8, n int) []byte {
	b := make([]byte, n)
	r.Read(b)
	return b
}

// compare seals p with both, checks equal output, and opens it back with
// the assembly, also in place.
func compare(t *testing.T, asm, std cipher.AEAD, nonce, p, ad []byte) {
	t.Helper()
	want := std.Seal(nil, nonce, p, ad)
	got := asm.Seal(nil, nonce, p, ad)
	if !bytes.Equal(got, want) {
		t.Fatalf("seal len(p)=%d len(ad)=%d:\n got %x\nwant %x", len(p), len(ad), got, want)
	}
	// In place, with a prefix in dst as the record layer has its header.
	buf := make([]byte, 5, 5+len(p)+tagSize)
	buf = append(buf, p...)
	sealed := asm.Seal(buf[:5], nonce, buf[5:], ad)
	if !bytes.Equal(sealed[5:], want) {
		t.Fatalf("in-place seal len(p)=%d differs", len(p))
	}
	opened, err := asm.Open(nil, nonce, want, ad)
	if err != nil || !bytes.Equal(opened, p) {
		t.Fatalf("open len(p)=%d: %v, plaintext equal %v", len(p), err, bytes.Equal(opened, p))
	}
	inPlace, err := asm.Open(want[:0], nonce, want, ad)
	if err != nil || !bytes.Equal(inPlace, p) {
		t.Fatalf("in-place open len(p)=%d: %v", len(p), err)
	}
}

func TestAgainstStdlib(t *testing.T) {
	r := rand.NewChaCha8([32]byte{1})
	adLens := []int{0, 1, 5, 13, 16, 17, 64, 255, 256, 300}
	for _, keyLen := range []int{16, 32} {
		asm, std := pair(t, randBytes(r, keyLen))
		// Every length through several 16-block iterations, then
		// TLS-record sizes around 16 KiB.
		lens := make([]int, 0, 1100)
		for n := 0; n <= 1040; n++ {
			lens = append(lens, n)
		}
		lens = append(lens, 4095, 4096, 4097, 16383, 16384, 16385, 16401, 16384+256+64+16+1, 65536+7)
		for i, n := range lens {
			compare(t, asm, std, randBytes(r, nonceSize), randBytes(r, n), randBytes(r, adLens[i%len(adLens)]))
		}
	}
}

// TestManyKeys: each key has its own H and round keys, so a bug in key
// set-up (the H·x^-1 carry, an AES-256 schedule step) shows only for some;
// 2 000 random keys, half AES-256, three random records each, against
// crypto/cipher. (Run ad hoc with 300 000 keys on 2026-12-07: clean.)
func TestManyKeys(t *testing.T) {
	r := rand.NewChaCha8([32]byte{4})
	rr := rand.New(r)
	for i := range 2000 {
		keyLen := 16 + 16*(i%2)
		asm, std := pair(t, randBytes(r, keyLen))
		for range 3 {
			n := rr.IntN(64)
			if rr.IntN(2) == 0 {
				n = rr.IntN(16400)
			}
			compare(t, asm, std, randBytes(r, nonceSize), randBytes(r, n), randBytes(r, rr.IntN(20)))
		}
	}
}

// TestKnownAnswer pins the construction to published vectors (the GCM
// specification's test cases 3 and 15: AES-128 and AES-256, 64 bytes of
// plaintext, no additional data) through New, whichever implementation it
// picks, so that a bug shared with crypto/cipher could not pass.
func TestKnownAnswer(t *testing.T) {
	cases := []struct{ name, key, tag string }{
		{"aes128", "feffe9928665731c6d6a8f9467308308", "4d5c2af327cd64a62cf35abd2ba6fab4"},
		{"aes256", "feffe9928665731c6d6a8f9467308308feffe9928665731c6d6a8f9467308308", "b094dac5d93471bdec1a502270e3cc6c"},
	}
	nonce := unhex(t, "cafebabefacedbaddecaf888")
	p := unhex(t, "d9313225f88406e5a55909c5aff5269a86a7a9531534f7da2e4c303d8a318a721c3c0c95956809532fcf0e2449a6b525b16aedf5aa0de657ba637b391aafd255")
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			aead, err := New(unhex(t, c.key))
			if err != nil {
				t.Fatal(err)
			}
			out := aead.Seal(nil, nonce, p, nil)
			if got := out[len(p):]; !bytes.Equal(got, unhex(t, c.tag)) {
				t.Fatalf("tag %x, want %s", got, c.tag)
			}
		})
	}
}

func unhex(t *testing.T, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(s)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestTamper flips every bit of a sealed record (tag, body, additional
// data) in turn; each must fail to open and leave no plaintext.
func TestTamper(t *testing.T) {
	r := rand.NewChaCha8([32]byte{2})
	asm, _ := pair(t, randBytes(r, 16))
	nonce, ad := randBytes(r, nonceSize), randBytes(r, 5)
	p := randBytes(r, 300)
	sealed := asm.Seal(nil, nonce, p, ad)
	for i := range 8 * len(sealed) {
		bad := bytes.Clone(sealed)
		bad[i/8] ^= 1 << (i % 8)
		if out, err := asm.Open(nil, nonce, bad, ad); err == nil || out != nil {
			t.Fatalf("bit %d flipped: opened (%v)", i, err)
		}
	}
	for i := range 8 * len(ad) {
		badAD := bytes.Clone(ad)
		badAD[i/8] ^= 1 << (i % 8)
		if _, err := asm.Open(nil, nonce, sealed, badAD); err == nil {
			t.Fatalf("additional data bit %d flipped: opened", i)
		}
	}
	if _, err := asm.Open(nil, nonce, sealed[:tagSize-1], ad); err == nil {
		t.Fatal("a record shorter than the tag opened")
	}
}

func TestOverlapPanics(t *testing.T) {
	r := rand.NewChaCha8([32]byte{3})
	asm, _ := pair(t, randBytes(r, 16))
	buf := make([]byte, 100)
	defer func() {
		if recover() == nil {
			t.Fatal("sealing into a shifted overlap of the plaintext did not panic")
		}
	}()
	asm.Seal(buf[1:1], make([]byte, nonceSize), buf[:50], nil)
}

func TestNewFallsBack(t *testing.T) {
	for _, n := range []int{16, 24, 32} {
		a, err := New(make([]byte, n))
		if err != nil {
			t.Fatalf("New(%d-byte key): %v", n, err)
		}
		_, isAsm := a.(*gcmAsm)
		if want := Accelerated() && n != 24; isAsm != want {
			t.Fatalf("New(%d-byte key) assembly %v, want %v", n, isAsm, want)
		}
	}
	if _, err := New(make([]byte, 7)); err == nil {
		t.Fatal("New accepted a 7-byte key")
	}
}

// FuzzAgainstStdlib: any key, nonce, plaintext and additional data seal
// to crypto/cipher's bytes and open back. Key and nonce are cut from one
// input padded to length, so every input runs (a fuzzer rarely hits exact
// 16-, 32- and 12-byte inputs).
func FuzzAgainstStdlib(f *testing.F) {
	f.Add([]byte("key and nonce"), false, []byte("hello"), []byte("hdr"))
	f.Add([]byte{0xff}, true, make([]byte, 1000), []byte{})
	f.Fuzz(func(t *testing.T, keyNonce []byte, aes256 bool, p, ad []byte) {
		material := make([]byte, 32+nonceSize)
		copy(material, keyNonce)
		key, nonce := material[:16], material[32:]
		if aes256 {
			key = material[:32]
		}
		asm, std := pair(t, key)
		compare(t, asm, std, nonce, p, ad)
		sealed := std.Seal(nil, nonce, p, ad)
		sealed[len(sealed)-1] ^= 1
		if _, err := asm.Open(nil, nonce, sealed, ad); err == nil {
			t.Fatal("opened a record with a flipped tag bit")
		}
	})
}
