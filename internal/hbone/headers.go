package hbone

import (
	"encoding/hex"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
)

// Header names on the CONNECT request and its response, as upstream
// ztunnel sends and reads them. HTTP/2 sends header names in lower case;
// net/http canonicalizes them in http.Header, and Get/Set are
// case-insensitive.
const (
	// HeaderBaggage carries W3C-style workload metadata of the sender
	// (request) or of the destination workload (200 response, upstream's
	// "enhanced baggage"). See FormatBaggage.
	HeaderBaggage = "baggage"
	// HeaderTraceparent carries the W3C trace context of the connection.
	HeaderTraceparent = "traceparent"
	// HeaderForwarded carries the original client address and, when known,
	// the service hostname the client meant: for="ip:port";host=svc.
	HeaderForwarded = "forwarded"
	// HeaderForwardedNetwork carries the origin network on the inner
	// CONNECT of double HBONE.
	HeaderForwardedNetwork = "x-forwarded-network"
)

// ConnectHeader is what a CONNECT carries besides :method and :authority.
// The proxy sends a fixed set of fields, so they are plain strings: a new
// connection builds no header map (and no slice per value) for them.
type ConnectHeader struct {
	Forwarded   string // HeaderForwarded; "" leaves the field out, as for the others
	Traceparent string // HeaderTraceparent
	Baggage     string // HeaderBaggage
	// Extra holds further fields, keyed as in http.Header; the proxy
	// leaves it nil.
	Extra http.Header
	// Early, if set, are the tunnelled stream's first bytes. They go in
	// a DATA frame right behind the HEADERS, in the same write, so the
	// server can hand them to the destination as soon as it connected to
	// it instead of a round trip after its 200 (HTTP/2 lets a CONNECT's
	// DATA follow its HEADERS at once: RFC 9113 §8.5). When the
	// flow-control windows cannot take them yet they are sent once the
	// 200 arrived. Either way Connect returns only after they went out;
	// on an error they were not delivered. Connect does not keep Early.
	Early []byte
}

// ParseAuthority parses a CONNECT :authority that must be a literal
// ip:port, as ztunnel peers send for workload destinations. IPv4-mapped
// IPv6 addresses are unmapped; zones and port 0 are rejected.
func ParseAuthority(s string) (netip.AddrPort, error) {
	ap, err := netip.ParseAddrPort(s)
	if err != nil {
		return netip.AddrPort{}, fmt.Errorf("hbone: authority %q: want ip:port", s)
	}
	if ap.Addr().Zone() != "" {
		return netip.AddrPort{}, fmt.Errorf("hbone: authority %q: zone not allowed", s)
	}
	if ap.Port() == 0 {
		return netip.AddrPort{}, fmt.Errorf("hbone: authority %q: port 0", s)
	}
	return netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port()), nil
}

// checkClientAuthority checks the authority a client puts on a CONNECT:
// ip:port or, for service hostnames through a waypoint or gateway,
// host:port. The port must be 1-65535.
func checkClientAuthority(s string) error {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return fmt.Errorf("hbone: authority %q: %w", s, err)
	}
	if host == "" {
		return fmt.Errorf("hbone: authority %q: empty host", s)
	}
	if p, err := strconv.ParseUint(port, 10, 16); err != nil || p == 0 {
		return fmt.Errorf("hbone: authority %q: bad port", s)
	}
	for i := 0; i < len(host); i++ {
		if c := host[i]; c <= ' ' || c >= 0x7f || c == '/' || c == '@' {
			return fmt.Errorf("hbone: authority %q: bad character in host", s)
		}
	}
	return nil
}

// FormatForwarded builds the Forwarded header value upstream sends:
// for="<client ip:port>", plus ;host=<hostname> when the client addressed
// a service.
func FormatForwarded(client netip.AddrPort, serviceHost string) string {
	v := `for="` + client.String() + `"`
	if serviceHost != "" {
		v += ";host=" + serviceHost
	}
	return v
}

// ParseForwardedHost returns the host= element of a Forwarded header value,
// with surrounding quotes removed, as upstream reads it to learn which
// service the client addressed. Non-ASCII values and empty hosts yield
// ok=false.
func ParseForwardedHost(v string) (host string, ok bool) {
	for i := 0; i < len(v); i++ {
		if v[i] >= 0x80 {
			return "", false
		}
	}
	for part := range strings.SplitSeq(v, ";") {
		h, found := strings.CutPrefix(strings.TrimSpace(part), "host=")
		if !found {
			continue
		}
		h = strings.TrimPrefix(h, `"`)
		h = strings.TrimSuffix(h, `"`)
		return h, h != ""
	}
	return "", false
}

// Baggage is the workload metadata carried in the baggage header. Empty
// fields are omitted when formatting.
type Baggage struct {
	ClusterID    string // k8s.cluster.name
	Namespace    string // k8s.namespace.name
	WorkloadName string // k8s.<workload type>.name
	ServiceName  string // service.name
	Revision     string // service.version
	Region       string // cloud.region
	Zone         string // cloud.availability_zone
}

// FormatBaggage builds a baggage header value. workloadType is the
// Kubernetes kind in lower case ("deployment", "pod", "job", "cronjob",
// ...) and names the workload key, k8s.<workloadType>.name.
func FormatBaggage(b Baggage, workloadType string) string {
	var sb strings.Builder
	add := func(k, v string) {
		if v == "" {
			return
		}
		if sb.Len() > 0 {
			sb.WriteByte(',')
		}
		sb.WriteString(k)
		sb.WriteByte('=')
		sb.WriteString(v)
	}
	add("k8s.cluster.name", b.ClusterID)
	add("k8s.namespace.name", b.Namespace)
	if workloadType != "" {
		add("k8s."+workloadType+".name", b.WorkloadName)
	}
	add("service.name", b.ServiceName)
	add("service.version", b.Revision)
	add("cloud.region", b.Region)
	add("cloud.availability_zone", b.Zone)
	return sb.String()
}

// ParseBaggage reads baggage header values the way upstream does:
// comma-separated key=value members, unknown keys ignored, the value ends
// at the next '='. A value with bytes outside visible ASCII (and tab)
// makes the whole header unusable: ok=false.
func ParseBaggage(values []string) (b Baggage, ok bool) {
	for _, v := range values {
		for i := 0; i < len(v); i++ {
			if c := v[i]; (c < ' ' && c != '\t') || c >= 0x7f {
				return Baggage{}, false
			}
		}
	}
	for _, v := range values {
		for member := range strings.SplitSeq(v, ",") {
			key, val, found := strings.Cut(member, "=")
			if !found {
				continue
			}
			val, _, _ = strings.Cut(val, "=")
			switch key {
			case "k8s.cluster.name":
				b.ClusterID = val
			case "k8s.namespace.name":
				b.Namespace = val
			case "k8s.deployment.name", "k8s.cronjob.name", "k8s.pod.name", "k8s.job.name":
				b.WorkloadName = val
			case "service.name":
				b.ServiceName = val
			case "service.version":
				b.Revision = val
			case "cloud.region":
				b.Region = val
			case "cloud.availability_zone":
				b.Zone = val
			}
		}
	}
	return b, true
}

// TraceParent is a W3C trace context (https://www.w3.org/TR/trace-context/).
type TraceParent struct {
	Version  uint8
	TraceID  [16]byte
	ParentID [8]byte
	Flags    uint8
}

// NewTraceParent returns a random trace context, version 0, no flags, as
// upstream creates one per outbound connection. It is an identifier for
// logs, not a secret, so math/rand is enough.
func NewTraceParent() TraceParent {
	var t TraceParent
	for i := 0; i < 16; i += 8 {
		putUint64(t.TraceID[i:], rand.Uint64())
	}
	putUint64(t.ParentID[:], rand.Uint64())
	return t
}

func putUint64(b []byte, v uint64) {
	for i := 7; i >= 0; i-- {
		b[i] = byte(v)
		v >>= 8
	}
}

// String returns the header form, vv-<32 hex trace id>-<16 hex parent>-ff.
func (t TraceParent) String() string {
	var buf [55]byte
	hex.Encode(buf[0:2], []byte{t.Version})
	buf[2] = '-'
	hex.Encode(buf[3:35], t.TraceID[:])
	buf[35] = '-'
	hex.Encode(buf[36:52], t.ParentID[:])
	buf[52] = '-'
	hex.Encode(buf[53:55], []byte{t.Flags})
	return string(buf[:])
}

// TraceIDString returns the trace id as 32 hex digits, the form upstream logs.
func (t TraceParent) TraceIDString() string { return hex.EncodeToString(t.TraceID[:]) }

var errTraceParent = errors.New("want vv-<32 hex>-<16 hex>-ff")

// ParseTraceParent parses a traceparent header value. Fields must have
// exactly 2, 32, 16 and 2 hex digits.
func ParseTraceParent(s string) (TraceParent, error) {
	var t TraceParent
	if len(s) != 55 || s[2] != '-' || s[35] != '-' || s[52] != '-' {
		return t, fmt.Errorf("hbone: traceparent %q: %w", s, errTraceParent)
	}
	var v, f [1]byte
	if _, err := hex.Decode(v[:], []byte(s[0:2])); err != nil {
		return TraceParent{}, fmt.Errorf("hbone: traceparent %q: %w", s, errTraceParent)
	}
	if _, err := hex.Decode(t.TraceID[:], []byte(s[3:35])); err != nil {
		return TraceParent{}, fmt.Errorf("hbone: traceparent %q: %w", s, errTraceParent)
	}
	if _, err := hex.Decode(t.ParentID[:], []byte(s[36:52])); err != nil {
		return TraceParent{}, fmt.Errorf("hbone: traceparent %q: %w", s, errTraceParent)
	}
	if _, err := hex.Decode(f[:], []byte(s[53:55])); err != nil {
		return TraceParent{}, fmt.Errorf("hbone: traceparent %q: %w", s, errTraceParent)
	}
	t.Version, t.Flags = v[0], f[0]
	return t, nil
}
