package hbone

import (
	"bytes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"

	"github.com/ztunnel-go/ztunnel/internal/aesgcm"
)

// After crypto/tls has done the handshake, an HBONE connection seals and
// opens its TLS 1.3 records itself (record.go). crypto/tls hands out a
// connection's traffic secrets only through Config.KeyLogWriter, so each
// handshake gets a config whose KeyLogWriter is a keyCapture: the secrets
// stay in this connection's memory (a KeyLogWriter the caller set, say
// for SSLKEYLOGFILE, still gets every line).

// keyCapture collects the two application traffic secrets of one
// handshake from crypto/tls's key log lines ("LABEL <random> <secret>").
type keyCapture struct {
	next           io.Writer
	client, server []byte
}

func (k *keyCapture) Write(line []byte) (int, error) {
	if k.next != nil {
		_, _ = k.next.Write(line)
	}
	label, rest, _ := bytes.Cut(line, []byte(" "))
	_, secret, ok := bytes.Cut(rest, []byte(" "))
	if !ok {
		return len(line), nil
	}
	dst := &k.client
	switch string(label) {
	case "CLIENT_TRAFFIC_SECRET_0":
	case "SERVER_TRAFFIC_SECRET_0":
		dst = &k.server
	default:
		return len(line), nil
	}
	s, err := hex.DecodeString(string(bytes.TrimSpace(secret)))
	if err == nil {
		*dst = s
	}
	return len(line), nil
}

// captureKeys returns a clone of cfg that logs the traffic secrets to k.
// A server config that picks its per-handshake config through
// GetConfigForClient gets the capture on the picked config too, because
// crypto/tls then uses that config's KeyLogWriter. Servers send no session
// tickets: tickets would be records sealed by crypto/tls after the
// handshake, which our record layer would then have to count.
func captureKeys(cfg *tls.Config, k *keyCapture, server bool) *tls.Config {
	c := cfg.Clone()
	k.next = c.KeyLogWriter
	c.KeyLogWriter = k
	if server {
		c.SessionTicketsDisabled = true
		if pick := c.GetConfigForClient; pick != nil {
			c.GetConfigForClient = func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
				picked, err := pick(hello)
				if err != nil || picked == nil {
					return picked, err
				}
				p := picked.Clone()
				if p.KeyLogWriter != nil {
					k.next = p.KeyLogWriter // crypto/tls would log to it
				}
				p.KeyLogWriter = k
				p.SessionTicketsDisabled = true
				return p, nil
			}
		}
	}
	return c
}

// errRecordSuite: the negotiated cipher suite is one the record layer does
// not implement (ChaCha20-Poly1305, chosen only without AES hardware); the
// connection then stays on crypto/tls.
var errRecordSuite = errors.New("hbone: record layer: cipher suite not supported")

// trafficKeys is one direction of a TLS 1.3 connection: the traffic
// secret (RFC 8446 section 7.1), the AEAD and IV derived from it, and the
// sequence number of the next record.
type trafficKeys struct {
	hash   func() hash.Hash
	keyLen int
	secret []byte
	aead   cipher.AEAD
	iv     [12]byte
	nonce  [12]byte // scratch: a nonce passed to the AEAD would escape from the stack
	seq    uint64
}

func newTrafficKeys(suite uint16, secret []byte) (*trafficKeys, error) {
	k := &trafficKeys{}
	switch suite {
	case tls.TLS_AES_128_GCM_SHA256:
		k.hash, k.keyLen = sha256.New, 16
	case tls.TLS_AES_256_GCM_SHA384:
		k.hash, k.keyLen = sha512.New384, 32
	default:
		return nil, errRecordSuite
	}
	if len(secret) != k.hash().Size() {
		return nil, fmt.Errorf("hbone: record layer: traffic secret of %d bytes", len(secret))
	}
	return k, k.set(secret)
}

// set installs secret and restarts the sequence at zero.
func (k *trafficKeys) set(secret []byte) error {
	key, err := expandLabel(k.hash, secret, "key", k.keyLen)
	if err != nil {
		return err
	}
	iv, err := expandLabel(k.hash, secret, "iv", len(k.iv))
	if err != nil {
		return err
	}
	aead, err := aesgcm.New(key)
	if err != nil {
		return fmt.Errorf("hbone: record layer: %w", err)
	}
	k.secret, k.aead, k.seq = secret, aead, 0
	copy(k.iv[:], iv)
	return nil
}

// update moves to the next generation of keys (a KeyUpdate).
func (k *trafficKeys) update() error {
	next, err := expandLabel(k.hash, k.secret, "traffic upd", len(k.secret))
	if err != nil {
		return err
	}
	return k.set(next)
}

// nextNonce returns the per-record nonce (the IV XOR the sequence number)
// and advances the sequence. The slice is valid until the next call.
func (k *trafficKeys) nextNonce() []byte {
	k.nonce = k.iv
	for i := range 8 {
		k.nonce[4+i] ^= byte(k.seq >> (56 - 8*i))
	}
	k.seq++
	return k.nonce[:]
}

// expandLabel is HKDF-Expand-Label with an empty context (RFC 8446
// section 7.1).
func expandLabel(h func() hash.Hash, secret []byte, label string, length int) ([]byte, error) {
	full := "tls13 " + label
	info := make([]byte, 0, 4+len(full))
	info = append(info, byte(length>>8), byte(length), byte(len(full)))
	info = append(info, full...)
	info = append(info, 0)
	out, err := hkdf.Expand(h, secret, string(info), length)
	if err != nil {
		return nil, fmt.Errorf("hbone: record layer: expand %q: %w", label, err)
	}
	return out, nil
}
