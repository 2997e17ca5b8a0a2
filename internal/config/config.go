package config

import (
	"errors"
	"fmt"
	"math"
	"net"
	"net/url"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// ProxyMode says whether ztunnel serves many pods from their own network
// namespaces (shared, the node proxy) or one workload from its own namespace.
type ProxyMode string

const (
	ProxyModeShared    ProxyMode = "shared"
	ProxyModeDedicated ProxyMode = "dedicated"
)

// Upstream's defaults; each is what an Istio install expects when the
// variable is unset.
const (
	defaultClusterID        = "Kubernetes"
	defaultClusterDomain    = "cluster.local"
	defaultInpodUDS         = "/var/run/ztunnel/ztunnel.sock"
	defaultRootCertPath     = "./var/run/secrets/istio/root-cert.pem"
	defaultTokenPath        = "./var/run/secrets/tokens/istio-token"
	defaultPoolMaxStreams   = 100 // Go's and the HTTP/2 spec's recommended minimum
	defaultPoolIdle         = 5 * time.Minute
	defaultStreamWindow     = 4 << 20  // bulk tunnels need more than HTTP/2's 64 KiB
	defaultConnWindow       = 16 << 20 // room for several bulk streams per connection
	defaultFrameSize        = 1 << 20
	defaultSecretTTL        = 24 * time.Hour
	defaultTerminationGrace = 5 * time.Second
	// The in-pod iptables rules skip packets with this mark, so ztunnel's own
	// upstream sockets are not captured again (0x539).
	defaultInpodMark = 1337
	// Upstream's DNS proxy address; istio-cni redirects port 53 to 15053.
	defaultDNSProxyAddr = "localhost:15053"
	defaultResolvConf   = "/etc/resolv.conf"

	// SYSTEM as a root-CA setting means the system trust store.
	rootCertSystem = "SYSTEM"
)

// WorkloadInfo names the one workload served in dedicated mode.
type WorkloadInfo struct {
	Namespace      string
	Name           string
	ServiceAccount string
}

// RootCert says where a TLS trust root comes from: a PEM file, inline PEM,
// or the system store.
type RootCert struct {
	File   string
	Static []byte
	System bool
}

// AuthToken is the bearer token sent to istiod: re-read from File on every
// use (the kubelet rotates it), or a fixed Static value.
type AuthToken struct {
	File   string
	Static string
}

// Config is ztunnel's whole start-up configuration.
type Config struct {
	ProxyMode    ProxyMode
	WorkloadInfo *WorkloadInfo // set only in dedicated mode

	XDSAddress  string // "" disables the xDS client
	XDSRootCA   RootCert
	XDSOnDemand bool
	XDSHeaders  map[string]string
	// AltXDSHostname and AltCAHostname are extra names accepted in the
	// server certificates (ALT_XDS_HOSTNAME, ALT_CA_HOSTNAME).
	AltXDSHostname string
	AltCAHostname  string
	CAAddress      string // "" when FAKE_CA is on
	CARootCA       RootCert
	CAHeaders      map[string]string
	AuthToken      AuthToken
	FakeCA         bool
	LocalCADir     string
	SecretTTL      time.Duration

	LocalXDSPath string
	LocalXDS     []byte // inline local config (LOCAL_XDS)

	InpodUDS       string
	InpodPortReuse bool
	// OriginalSource (ENABLE_ORIG_SRC): deliver inbound connections from the
	// client's own address (IP_TRANSPARENT). nil means best effort, as
	// upstream; false never; true required.
	OriginalSource *bool
	PacketMark     uint32 // 0 means do not mark

	// DNSCapture runs the DNS proxy (ISTIO_META_DNS_CAPTURE unset or "true",
	// as upstream: any other value turns it off).
	DNSCapture bool
	// DNSProxyAddr is where it listens (ISTIO_META_DNS_PROXY_ADDR):
	// "localhost:PORT" (127.0.0.1 and, if present, ::1) or "IP:PORT"; in
	// each pod's netns in shared mode.
	DNSProxyAddr string
	// DNSResolvConf lists the resolvers names outside the mesh go to
	// (DNS_RESOLV_CONF, this project's; default /etc/resolv.conf).
	DNSResolvConf string

	NodeName      string
	ClusterID     string
	ClusterDomain string
	Network       string
	TrustDomain   string
	Metadata      map[string]string // ISTIO_META_* with the prefix removed
	JSONMetadata  map[string]string // ISTIO_METAJSON_* (JSON text values)

	// InstanceIP is the ztunnel pod's IP (INSTANCE_IP), sent in the xDS node id.
	InstanceIP string
	// Identity of the ztunnel pod itself (downward API), if known.
	SelfNamespace      string
	SelfName           string
	SelfServiceAccount string

	// WorkerThreads is how many threads run the proxy at once
	// (ZTUNNEL_WORKER_THREADS: a count, or "N%" of ZTUNNEL_CPU_LIMIT or
	// of the logical CPUs); 0 when unset, meaning upstream's default of 2.
	WorkerThreads int

	// AESGCMAssembly: HBONE records are sealed with package aesgcm's
	// VAES/AVX-512 assembly where the CPU has it (ZTUNNEL_AES_GCM=auto,
	// the default) or always with Go's crypto/cipher (ZTUNNEL_AES_GCM=go).
	AESGCMAssembly bool

	// TimerSlack is the kernel timer slack ztunnel runs its threads with
	// (ZTUNNEL_TIMER_SLACK, a duration from 0 to 10ms; default 1ms; 0
	// keeps the one it was started with). See cmd/ztunnel/timerslack.go.
	TimerSlack time.Duration

	PoolMaxStreamsPerConn int
	PoolUnusedRelease     time.Duration
	StreamWindowSize      uint32
	ConnWindowSize        uint32
	FrameSize             uint32

	// TerminationDeadline is how long a drain may take before remaining
	// connections are closed.
	TerminationDeadline time.Duration

	AdminAddr     string
	StatsAddr     string
	ReadinessAddr string
	LogLevel      string
	LogFormat     string
}

// FromEnv reads the process environment.
func FromEnv() (*Config, error) { return Parse(os.Environ()) }

// Parse builds a Config from environ ("NAME=value" entries, as os.Environ
// returns). Unset and empty variables take their defaults, except that an
// empty XDS_ADDRESS or CA_ADDRESS turns that client off, as upstream.
func Parse(environ []string) (*Config, error) {
	env := make(map[string]string, len(environ))
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	p := parser{env: env}
	c := &Config{}

	c.ProxyMode = ProxyMode(p.oneOf("PROXY_MODE", string(ProxyModeShared), string(ProxyModeShared), string(ProxyModeDedicated)))
	if c.ProxyMode == ProxyModeDedicated {
		raw, ok := p.get("PROXY_WORKLOAD_INFO")
		if !ok {
			p.fail("PROXY_MODE=dedicated requires PROXY_WORKLOAD_INFO to be set (namespace/name/service-account)")
		} else if wi, err := parseWorkloadInfo(raw); err != nil {
			p.failVar("PROXY_WORKLOAD_INFO", raw, err.Error())
		} else {
			c.WorkloadInfo = wi
		}
	}

	defaultIstiod := "https://localhost:15012"
	if _, ok := p.get("KUBERNETES_SERVICE_HOST"); ok {
		defaultIstiod = "https://istiod.istio-system.svc:15012"
	}
	c.XDSAddress = p.uri("XDS_ADDRESS", defaultIstiod)
	c.XDSRootCA = p.rootCert("XDS_ROOT_CA")
	c.XDSOnDemand = p.boolean("XDS_ON_DEMAND", false)
	c.XDSHeaders = p.prefixed("XDS_HEADER_")
	c.AltXDSHostname = p.str("ALT_XDS_HOSTNAME", "")
	c.AltCAHostname = p.str("ALT_CA_HOSTNAME", "")
	c.FakeCA = p.boolean("FAKE_CA", false)
	if !c.FakeCA {
		c.CAAddress = p.uri("CA_ADDRESS", defaultIstiod)
	}
	c.CARootCA = p.rootCert("CA_ROOT_CA")
	c.CAHeaders = p.prefixed("CA_HEADER_")
	c.AuthToken = p.token()
	c.LocalCADir = p.str("LOCAL_CA_DIR", "")
	if c.LocalCADir != "" && !c.FakeCA {
		p.failVar("LOCAL_CA_DIR", c.LocalCADir, "only used by the built-in CA; set FAKE_CA=true as well")
	}
	c.SecretTTL = p.duration("SECRET_TTL", defaultSecretTTL)

	c.LocalXDSPath = p.str("LOCAL_XDS_PATH", "")
	if inline := p.str("LOCAL_XDS", ""); inline != "" {
		if c.LocalXDSPath != "" {
			p.fail("only one of LOCAL_XDS_PATH or LOCAL_XDS may be set")
		}
		c.LocalXDS = []byte(inline)
	}

	c.InpodUDS = p.str("INPOD_UDS", defaultInpodUDS)
	c.InpodPortReuse = p.boolean("INPOD_PORT_REUSE", true)
	if _, ok := p.get("ENABLE_ORIG_SRC"); ok {
		v := p.boolean("ENABLE_ORIG_SRC", false)
		c.OriginalSource = &v
	}
	markDefault := uint64(0)
	if c.ProxyMode == ProxyModeShared {
		markDefault = defaultInpodMark
	}
	c.PacketMark = uint32(p.uint("PACKET_MARK", markDefault, 0, 1<<32-1))
	c.DNSCapture, c.DNSProxyAddr = p.dns()
	c.DNSResolvConf = p.str("DNS_RESOLV_CONF", defaultResolvConf)

	c.NodeName = p.str("NODE_NAME", "")
	c.ClusterID = p.str("ISTIO_META_CLUSTER_ID", "")
	if c.ClusterID == "" {
		c.ClusterID = p.str("CLUSTER_ID", defaultClusterID)
	}
	c.ClusterDomain = p.str("CLUSTER_DOMAIN", defaultClusterDomain)
	c.Network = p.str("NETWORK", "")
	c.TrustDomain = p.str("TRUST_DOMAIN", defaultClusterDomain)
	c.Metadata = p.prefixed("ISTIO_META_")
	c.JSONMetadata = p.prefixed("ISTIO_METAJSON_")
	c.InstanceIP = p.str("INSTANCE_IP", "")
	c.SelfNamespace = p.str("POD_NAMESPACE", "")
	c.SelfName = p.str("POD_NAME", "")
	c.SelfServiceAccount = p.str("SERVICE_ACCOUNT", "")

	c.WorkerThreads = p.workerThreads()
	c.AESGCMAssembly = p.oneOf("ZTUNNEL_AES_GCM", "auto", "auto", "go") == "auto"
	c.TimerSlack = p.timerSlack()
	c.PoolMaxStreamsPerConn = int(p.uint("POOL_MAX_STREAMS_PER_CONNECTION", defaultPoolMaxStreams, 1, 1<<16-1))
	c.PoolUnusedRelease = p.duration("POOL_UNUSED_RELEASE_TIMEOUT", defaultPoolIdle)
	c.StreamWindowSize = uint32(p.uint("HTTP2_STREAM_WINDOW_SIZE", defaultStreamWindow, 1<<16-1, 1<<31-1))
	c.ConnWindowSize = uint32(p.uint("HTTP2_CONNECTION_WINDOW_SIZE", defaultConnWindow, 1<<16-1, 1<<31-1))
	c.FrameSize = uint32(p.uint("HTTP2_FRAME_SIZE", defaultFrameSize, 1<<14, 1<<24-1))

	c.TerminationDeadline = p.terminationDeadline()

	c.AdminAddr = p.hostPort("ADMIN_ADDR", "127.0.0.1:15000")
	c.StatsAddr = p.hostPort("STATS_ADDR", "[::]:15020")
	c.ReadinessAddr = p.hostPort("READINESS_ADDR", "[::]:15021")
	c.LogLevel = p.oneOf("LOG_LEVEL", "info", "debug", "info", "warn", "error")
	c.LogFormat = p.oneOf("LOG_FORMAT", "text", "text", "json")

	if len(p.errs) > 0 {
		return nil, errors.Join(p.errs...)
	}
	return c, nil
}

func parseWorkloadInfo(raw string) (*WorkloadInfo, error) {
	parts := strings.Split(raw, "/")
	if len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return nil, errors.New("want namespace/name/service-account")
	}
	return &WorkloadInfo{Namespace: parts[0], Name: parts[1], ServiceAccount: parts[2]}, nil
}

// parser collects every bad variable so one start-up reports them all.
type parser struct {
	env  map[string]string
	errs []error
}

func (p *parser) lookup(name string) (string, bool) {
	v, ok := p.env[name]
	return v, ok
}

func (p *parser) get(name string) (string, bool) {
	v, ok := p.lookup(name)
	if !ok || v == "" {
		return "", false
	}
	return v, true
}

func (p *parser) fail(msg string) { p.errs = append(p.errs, errors.New("config: "+msg)) }

func (p *parser) failVar(name, value, accepted string) {
	p.errs = append(p.errs, fmt.Errorf("config: %s=%q: %s", name, value, accepted))
}

func (p *parser) str(name, def string) string {
	if v, ok := p.get(name); ok {
		return v
	}
	return def
}

func (p *parser) oneOf(name, def string, accepted ...string) string {
	v, ok := p.get(name)
	if !ok {
		return def
	}
	for _, a := range accepted {
		if v == a {
			return v
		}
	}
	p.failVar(name, v, "must be one of "+strings.Join(accepted, ", "))
	return def
}

func (p *parser) boolean(name string, def bool) bool {
	v, ok := p.get(name)
	if !ok {
		return def
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		p.failVar(name, v, "must be true or false")
		return def
	}
	return b
}

func (p *parser) uint(name string, def, min, max uint64) uint64 {
	v, ok := p.get(name)
	if !ok {
		return def
	}
	n, err := strconv.ParseUint(v, 0, 64)
	if err != nil || n < min || n > max {
		p.failVar(name, v, fmt.Sprintf("must be an integer from %d to %d", min, max))
		return def
	}
	return n
}

// workerThreads reads ZTUNNEL_WORKER_THREADS as upstream does: a count
// (≥ 1), or a percentage (0 < N ≤ 100, rounded up, at least 1) of
// ZTUNNEL_CPU_LIMIT or, without it, the logical CPUs.
func (p *parser) workerThreads() int {
	const name = "ZTUNNEL_WORKER_THREADS"
	v, ok := p.get(name)
	if !ok {
		return 0
	}
	if pct, isPct := strings.CutSuffix(v, "%"); isPct {
		f, err := strconv.ParseFloat(pct, 64)
		if err != nil || !(f > 0 && f <= 100) {
			p.failVar(name, v, "a percentage must be above 0 and at most 100")
			return 0
		}
		cpus := int(p.uint("ZTUNNEL_CPU_LIMIT", uint64(runtime.NumCPU()), 1, 1<<16))
		return max(1, int(math.Ceil(float64(cpus)*f/100)))
	}
	n, err := strconv.ParseUint(v, 10, 16)
	if err != nil || n < 1 {
		p.failVar(name, v, "must be an integer of at least 1 or a percentage such as 50%")
		return 0
	}
	return int(n)
}

// duration accepts Go durations ("90s", "5m") and, as upstream's parser
// does, a bare number of seconds.
func (p *parser) duration(name string, def time.Duration) time.Duration {
	v, ok := p.get(name)
	if !ok {
		return def
	}
	if d, ok := parseDuration(v); ok {
		return d
	}
	p.failVar(name, v, `must be a positive duration such as "30s" or "5m"`)
	return def
}

// Timer slack bounds: above maxTimerSlack the runtime's own short sleeps
// (sysmon's, a spinning thread's before it steals work) would stretch
// into whole scheduler time slices.
const (
	defaultTimerSlack = time.Millisecond
	maxTimerSlack     = 10 * time.Millisecond
)

func (p *parser) timerSlack() time.Duration {
	v, ok := p.get("ZTUNNEL_TIMER_SLACK")
	if !ok {
		return defaultTimerSlack
	}
	if v == "0" {
		return 0
	}
	if d, err := time.ParseDuration(v); err == nil && d >= 0 && d <= maxTimerSlack {
		return d
	}
	p.failVar("ZTUNNEL_TIMER_SLACK", v, `must be a duration from 0 to 10ms, such as "1ms" or "50us"`)
	return defaultTimerSlack
}

func parseDuration(v string) (time.Duration, bool) {
	if n, err := strconv.ParseUint(v, 10, 32); err == nil {
		return time.Duration(n) * time.Second, true
	}
	d, err := time.ParseDuration(v)
	return d, err == nil && d > 0
}

// uri accepts "" (disabled) or an http(s) URL with a host and port.
func (p *parser) uri(name, def string) string {
	v, ok := p.lookup(name)
	if !ok {
		return def
	}
	if v == "" {
		return ""
	}
	if !strings.Contains(v, "://") {
		// Upstream's chart sets istiod.istio-system.svc:15012 without a
		// scheme and upstream assumes TLS; do the same.
		v = "https://" + v
	}
	u, err := url.Parse(v)
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.Port() == "" {
		p.failVar(name, v, "must be empty or a URL of the form https://host:port (http:// for plaintext)")
		return def
	}
	return v
}

func (p *parser) hostPort(name, def string) string {
	v, ok := p.get(name)
	if !ok {
		return def
	}
	if _, port, err := net.SplitHostPort(v); err != nil || port == "" {
		p.failVar(name, v, "must be host:port, e.g. 127.0.0.1:15000")
		return def
	}
	return v
}

// rootCert follows upstream: an existing file path, the word SYSTEM, or
// otherwise the value itself as PEM.
func (p *parser) rootCert(name string) RootCert {
	v := p.str(name, defaultRootCertPath)
	if v == rootCertSystem {
		return RootCert{System: true}
	}
	if _, err := os.Stat(v); err == nil {
		return RootCert{File: v}
	}
	if v == defaultRootCertPath {
		// The default file is absent off-cluster; the client reports it
		// only if it is actually needed.
		return RootCert{File: v}
	}
	if !strings.Contains(v, "-----BEGIN") {
		p.failVar(name, v, "must be a readable PEM file path, inline PEM, or SYSTEM")
		return RootCert{}
	}
	return RootCert{Static: []byte(v)}
}

// dns reads ISTIO_META_DNS_CAPTURE and ISTIO_META_DNS_PROXY_ADDR as
// upstream does (proxy metadata): capture is on unless set to something
// other than "true" (any case); the address is localhost:PORT or IP:PORT.
func (p *parser) dns() (bool, string) {
	capture := true
	if v, ok := p.get("ISTIO_META_DNS_CAPTURE"); ok {
		capture = strings.EqualFold(v, "true")
	}
	addr, ok := p.get("ISTIO_META_DNS_PROXY_ADDR")
	if !ok {
		return capture, defaultDNSProxyAddr
	}
	host, port, err := net.SplitHostPort(addr)
	_, perr := strconv.ParseUint(port, 10, 16)
	if err != nil || perr != nil || (host != "localhost" && net.ParseIP(host) == nil) {
		p.failVar("ISTIO_META_DNS_PROXY_ADDR", addr, "must be localhost:PORT or IP:PORT, e.g. 127.0.0.1:15053")
		return capture, defaultDNSProxyAddr
	}
	return capture, addr
}

func (p *parser) token() AuthToken {
	v, ok := p.get("AUTH_TOKEN")
	if !ok {
		if _, err := os.Stat(defaultTokenPath); err == nil {
			return AuthToken{File: defaultTokenPath}
		}
		return AuthToken{}
	}
	if _, err := os.Stat(v); err == nil {
		return AuthToken{File: v}
	}
	return AuthToken{Static: v}
}

func (p *parser) prefixed(prefix string) map[string]string {
	out := map[string]string{}
	for k, v := range p.env {
		if rest, ok := strings.CutPrefix(k, prefix); ok && rest != "" {
			out[rest] = v
		}
	}
	return out
}

// terminationDeadline leaves Kubernetes a few seconds between our forced
// close and its SIGKILL, so peers see a clean close rather than a reset.
func (p *parser) terminationDeadline() time.Duration {
	if _, ok := p.get("CONNECTION_TERMINATION_DEADLINE"); ok {
		return p.duration("CONNECTION_TERMINATION_DEADLINE", defaultTerminationGrace)
	}
	v, ok := p.get("TERMINATION_GRACE_PERIOD_SECONDS")
	if !ok {
		return defaultTerminationGrace
	}
	secs, err := strconv.ParseUint(v, 10, 32)
	if err != nil {
		p.failVar("TERMINATION_GRACE_PERIOD_SECONDS", v, "must be a whole number of seconds")
		return defaultTerminationGrace
	}
	switch {
	case secs > 10:
		secs -= 5
	case secs > 1:
		secs--
	default:
		secs = 1
	}
	return time.Duration(secs) * time.Second
}
