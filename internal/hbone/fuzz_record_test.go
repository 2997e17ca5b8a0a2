package hbone

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"testing"
)

// fuzzSecret keys both fuzz targets, so that seeds sealed with it open.
var fuzzSecret = testSecret(bytes.Repeat([]byte{7}, 32))

// chunkReader returns at most n bytes per Read, so records arrive split
// at every offset.
type chunkReader struct {
	r io.Reader
	n int
}

func (c *chunkReader) Read(p []byte) (int, error) { return c.r.Read(p[:min(len(p), c.n)]) }

// drainRecords reads c to its end with reads of size buf and checks what
// any Read must hold: never more than asked, no data beside an error,
// the same error again once it ended, and no more data than arrived.
func drainRecords(t *testing.T, c *recordConn, buf, arrived int) {
	p := make([]byte, buf)
	got := 0
	for range 1 << 16 {
		n, err := c.Read(p)
		if n < 0 || n > len(p) || (n > 0 && err != nil) {
			t.Fatalf("Read = %d, %v with a %d-byte buffer", n, err, len(p))
		}
		got += n
		if err != nil {
			if n2, err2 := c.Read(p); n2 != 0 || !errors.Is(err2, err) {
				t.Fatalf("after %v, Read = %d, %v", err, n2, err2)
			}
			if got > arrived {
				t.Fatalf("read %d bytes of application data from %d bytes of records", got, arrived)
			}
			return
		}
	}
	t.Fatal("Read never ended")
}

// FuzzRecordRead feeds arbitrary bytes to the record layer's reader: record
// headers, lengths and ciphertext that mostly fail authentication. The
// first two bytes pick the read size and how the bytes arrive.
func FuzzRecordRead(f *testing.F) {
	w := &recordConn{out: fuzzSecret.keys(f)}
	var seed []byte
	seed = w.seal(seed, recordTypeHandshake, []byte{msgNewSessionTicket, 0, 0, 2, 1, 2})
	seed = w.seal(seed, recordTypeAppData, bytes.Repeat([]byte("a"), 3000))
	seed = w.seal(seed, recordTypeHandshake, []byte{msgKeyUpdate, 0, 0, 1, 0})
	f.Add(append([]byte{200, 7}, seed...))
	f.Add(append([]byte{1, 1}, w.seal(nil, recordTypeAlert, []byte{2, alertCloseNotify})...))
	f.Add([]byte{10, 10, recordTypeAppData, 3, 3, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 2 {
			return
		}
		buf, chunk := int(data[0])*64+1, int(data[1])*8+1
		in := data[2:]
		c := memRecordConn(t, fuzzSecret, nil)
		c.raw = &memConn{r: &chunkReader{r: bytes.NewReader(in), n: chunk}}
		drainRecords(t, c, buf, len(in))
	})
}

// FuzzRecordInner seals arbitrary inner plaintexts (content, type byte,
// padding) as records, so that they pass authentication and reach what
// follows it: content types, padding, alerts, post-handshake messages split
// across records, KeyUpdates. Each record is a two-byte length and that
// many bytes.
func FuzzRecordInner(f *testing.F) {
	rec := func(inner ...byte) []byte {
		return append([]byte{byte(len(inner) >> 8), byte(len(inner))}, inner...)
	}
	f.Add(bytes.Join([][]byte{
		rec('h', 'i', recordTypeAppData, 0, 0),
		rec(msgNewSessionTicket, 0, 0, recordTypeHandshake),
		rec(4, 1, 2, 3, recordTypeHandshake),
		rec(msgKeyUpdate, 0, 0, 1, 1, recordTypeHandshake),
		rec('x', recordTypeAppData),
		rec(1, alertUserCanceled, recordTypeAlert),
		rec(1, alertCloseNotify, recordTypeAlert),
	}, nil))
	f.Add(rec(0, 0, 0))
	f.Add(rec(2, 40, recordTypeAlert))
	f.Fuzz(func(t *testing.T, data []byte) {
		// The writer's keys follow the reader's KeyUpdates, as a peer's
		// would, so records after one still open.
		w := &recordConn{out: fuzzSecret.keys(t)}
		var wire []byte
		arrived := 0
		for len(data) >= 2 {
			n := min(int(binary.BigEndian.Uint16(data))%(maxInnerLen+64), len(data)-2)
			inner := data[2 : 2+n]
			data = data[2+n:]
			if n == 0 {
				continue
			}
			wire = w.seal(wire, inner[n-1], inner[:n-1])
			arrived += n
			if keyUpdateAt(inner) {
				if err := w.out.update(); err != nil {
					t.Fatal(err)
				}
			}
		}
		drainRecords(t, memRecordConn(t, fuzzSecret, wire), 4096, arrived)
	})
}

// keyUpdateAt reports whether inner is a handshake record that is exactly
// one KeyUpdate, the only way the reader moves its keys.
func keyUpdateAt(inner []byte) bool {
	i := len(inner) - 1
	for i >= 0 && inner[i] == 0 {
		i--
	}
	return i == 5 && inner[i] == recordTypeHandshake && inner[0] == msgKeyUpdate &&
		inner[1] == 0 && inner[2] == 0 && inner[3] == 1 && inner[4] <= 1
}
