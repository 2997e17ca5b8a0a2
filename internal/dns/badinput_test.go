package dns

import (
	"bytes"
	"context"
	"encoding/binary"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	mdns "github.com/miekg/dns"
)

func packed(t testing.TB, edit func(m *mdns.Msg)) []byte {
	t.Helper()
	m := new(mdns.Msg)
	m.SetQuestion("shop.default.svc.cluster.local.", mdns.TypeA)
	edit(m)
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestBadInput sends packets a DNS server must survive, over UDP and TCP:
// each gets its error counter and the answer (or silence) it should, and
// the server answers a good query right after.
func TestBadInput(t *testing.T) {
	var logs syncBuffer
	s := startServer(t, ResolverOptions{Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))})
	header := func(qd uint16) []byte {
		h := make([]byte, 12)
		binary.BigEndian.PutUint16(h[0:], 0x1234)
		binary.BigEndian.PutUint16(h[4:], qd)
		return h
	}
	// A query header, then 10000 bytes of 63-byte labels: longer than any
	// name may be, and than the server reads over UDP.
	oversized := append(header(1), bytes.Repeat([]byte{63}, 10000)...)
	for _, tc := range []struct {
		name   string
		pkt    []byte
		reason Reason
		rcode  int // -1: no answer expected
	}{
		{"shorter than a header", []byte{1, 2, 3, 4, 5}, ReasonShort, -1},
		{"header promising a question that is not there", header(1), ReasonQuestions, mdns.RcodeFormatError},
		{"oversized garbage", oversized, ReasonMalformed, mdns.RcodeFormatError},
		{"500 questions", packed(t, func(m *mdns.Msg) {
			for i := 1; i < 500; i++ {
				m.Question = append(m.Question, m.Question[0])
			}
		}), ReasonQuestions, mdns.RcodeFormatError},
		{"no question", packed(t, func(m *mdns.Msg) { m.Question = nil }), ReasonQuestions, mdns.RcodeFormatError},
		{"a response", packed(t, func(m *mdns.Msg) { m.Response = true }), ReasonNotRequest, -1},
		{"UPDATE opcode", packed(t, func(m *mdns.Msg) { m.Opcode = mdns.OpcodeUpdate }), ReasonOpcode, mdns.RcodeNotImplemented},
		{"NOTIFY opcode", packed(t, func(m *mdns.Msg) { m.Opcode = mdns.OpcodeNotify }), ReasonOpcode, mdns.RcodeNotImplemented},
		{"records in the answer section", packed(t, func(m *mdns.Msg) {
			for range 3 {
				m.Answer = append(m.Answer, mustRR(t, "x. 1 IN A 192.0.2.1"))
			}
		}), ReasonSections, mdns.RcodeFormatError},
	} {
		for _, proto := range []string{"udp", "tcp"} {
			t.Run(proto+"/"+tc.name, func(t *testing.T) {
				if proto == "tcp" && len(tc.pkt) > 65535 {
					t.Skip("does not fit a TCP length prefix")
				}
				before := counter(t, s.reg, "ztunnel_dns_errors_total", map[string]string{"reason": string(tc.reason)})
				resp := rawExchange(t, proto, s.addr(proto), tc.pkt)
				switch {
				case tc.rcode == -1 && resp != nil:
					t.Errorf("answered %s, want no answer", mdns.RcodeToString[resp.Rcode])
				case tc.rcode >= 0 && resp == nil:
					t.Errorf("no answer, want %s", mdns.RcodeToString[tc.rcode])
				case tc.rcode >= 0 && resp.Rcode != tc.rcode:
					t.Errorf("rcode %s, want %s", mdns.RcodeToString[resp.Rcode], mdns.RcodeToString[tc.rcode])
				}
				waitFor(t, func() bool {
					return counter(t, s.reg, "ztunnel_dns_errors_total", map[string]string{"reason": string(tc.reason)}) == before+1
				})
				if line := logs.take(); !strings.Contains(line, "level=DEBUG") || !strings.Contains(line, "reason="+string(tc.reason)) {
					t.Errorf("log %q, want a debug line with reason=%s", line, tc.reason)
				}
				if got := query(t, proto, s.addr(proto), "shop.", mdns.TypeA, 0); len(got.Answer) != 1 {
					t.Errorf("good query after bad input: %v", got)
				}
			})
		}
	}
}

// TestStalledTCP: a TCP client that sends half a message and stalls does
// not stop others from being answered, and is cut off by the read timeout.
func TestStalledTCP(t *testing.T) {
	s := startServer(t, ResolverOptions{})
	c, err := net.Dial("tcp", s.tcp)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.Write([]byte{0xff, 0xff, 1, 2, 3}) // promises 65535 bytes
	for _, proto := range []string{"udp", "tcp"} {
		if got := query(t, proto, s.addr(proto), "shop.", mdns.TypeA, 0); len(got.Answer) != 1 {
			t.Errorf("%s query with a stalled TCP client: %v", proto, got)
		}
	}
	c.SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Error("stalled connection got data, want it closed")
	} else if time.Since(start) > 4*time.Second {
		t.Errorf("stalled connection still open after %v", time.Since(start))
	}
}

// rawExchange sends pkt as is and returns the parsed answer, or nil when
// none comes within 300 ms (or the server closed a TCP connection).
func rawExchange(t testing.TB, proto, addr string, pkt []byte) *mdns.Msg {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, proto, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if proto == "tcp" {
		pkt = append(binary.BigEndian.AppendUint16(nil, uint16(len(pkt))), pkt...)
	}
	if _, err := c.Write(pkt); err != nil {
		t.Fatal(err)
	}
	c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
	buf := make([]byte, 65535)
	var n int
	if proto == "tcp" {
		co := &mdns.Conn{Conn: c}
		b, err := co.ReadMsgHeader(nil)
		if err != nil {
			return nil
		}
		buf, n = b, len(b)
	} else if n, err = c.Read(buf); err != nil {
		return nil
	}
	m := new(mdns.Msg)
	if err := m.Unpack(buf[:n]); err != nil {
		t.Fatalf("answer does not parse: %v", err)
	}
	return m
}

// syncBuffer is a log sink safe for the server's goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

// take returns what was logged so far and empties the buffer.
func (b *syncBuffer) take() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := b.buf.String()
	b.buf.Reset()
	return s
}
