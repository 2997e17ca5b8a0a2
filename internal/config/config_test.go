package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestDefaults(t *testing.T) {
	c, err := Parse(nil)
	if err != nil {
		t.Fatal(err)
	}
	checks := []struct {
		name      string
		got, want any
	}{
		{"ProxyMode", c.ProxyMode, ProxyModeShared},
		{"XDSAddress", c.XDSAddress, "https://localhost:15012"},
		{"CAAddress", c.CAAddress, "https://localhost:15012"},
		{"InpodUDS", c.InpodUDS, "/var/run/ztunnel/ztunnel.sock"},
		{"PacketMark", c.PacketMark, uint32(0x539)},
		{"ClusterID", c.ClusterID, "Kubernetes"},
		{"ClusterDomain", c.ClusterDomain, "cluster.local"},
		{"PoolMaxStreamsPerConn", c.PoolMaxStreamsPerConn, 100},
		{"PoolUnusedRelease", c.PoolUnusedRelease, 5 * time.Minute},
		{"StreamWindowSize", c.StreamWindowSize, uint32(4 << 20)},
		{"ConnWindowSize", c.ConnWindowSize, uint32(16 << 20)},
		{"FrameSize", c.FrameSize, uint32(1 << 20)},
		{"AESGCMAssembly", c.AESGCMAssembly, true},
		{"TimerSlack", c.TimerSlack, time.Millisecond},
		{"TerminationDeadline", c.TerminationDeadline, 5 * time.Second},
		{"AdminAddr", c.AdminAddr, "127.0.0.1:15000"},
		{"StatsAddr", c.StatsAddr, "[::]:15020"},
		{"ReadinessAddr", c.ReadinessAddr, "[::]:15021"},
		{"SecretTTL", c.SecretTTL, 24 * time.Hour},
		{"InpodPortReuse", c.InpodPortReuse, true},
	}
	for _, ch := range checks {
		if ch.got != ch.want {
			t.Errorf("%s = %v, want %v", ch.name, ch.got, ch.want)
		}
	}
}

func TestValues(t *testing.T) {
	dir := t.TempDir()
	root := filepath.Join(dir, "root.pem")
	if err := os.WriteFile(root, []byte("pem"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Parse([]string{
		"PROXY_MODE=dedicated",
		"PROXY_WORKLOAD_INFO=ns1/pod1/sa1",
		"XDS_ADDRESS=",
		"FAKE_CA=true",
		"CA_ROOT_CA=" + root,
		"XDS_ROOT_CA=SYSTEM",
		"LOCAL_XDS_PATH=/tmp/x.yaml",
		"KUBERNETES_SERVICE_HOST=10.0.0.1",
		"ZTUNNEL_AES_GCM=go",
		"ZTUNNEL_TIMER_SLACK=250us",
		"ISTIO_META_CLUSTER_ID=c2",
		"ISTIO_META_FOO=bar",
		"XDS_HEADER_X_A=1",
		"TERMINATION_GRACE_PERIOD_SECONDS=30",
		"POOL_UNUSED_RELEASE_TIMEOUT=90",
		"POOL_MAX_STREAMS_PER_CONNECTION=7",
		"AUTH_TOKEN=static-token",
	})
	if err != nil {
		t.Fatal(err)
	}
	if c.WorkloadInfo == nil || *c.WorkloadInfo != (WorkloadInfo{"ns1", "pod1", "sa1"}) {
		t.Errorf("WorkloadInfo = %+v", c.WorkloadInfo)
	}
	if c.XDSAddress != "" || c.CAAddress != "" {
		t.Errorf("XDS/CA address = %q/%q, want both empty", c.XDSAddress, c.CAAddress)
	}
	if c.PacketMark != 0 {
		t.Errorf("PacketMark = %d, dedicated mode must not mark by default", c.PacketMark)
	}
	if c.CARootCA.File != root || !c.XDSRootCA.System {
		t.Errorf("roots = %+v %+v", c.CARootCA, c.XDSRootCA)
	}
	if c.ClusterID != "c2" || c.Metadata["FOO"] != "bar" || c.Metadata["CLUSTER_ID"] != "c2" || c.XDSHeaders["X_A"] != "1" {
		t.Errorf("cluster/metadata/headers = %q %v %v", c.ClusterID, c.Metadata, c.XDSHeaders)
	}
	if c.TerminationDeadline != 25*time.Second || c.PoolUnusedRelease != 90*time.Second || c.PoolMaxStreamsPerConn != 7 {
		t.Errorf("deadline/idle/streams = %v %v %d", c.TerminationDeadline, c.PoolUnusedRelease, c.PoolMaxStreamsPerConn)
	}
	if c.AESGCMAssembly {
		t.Error("ZTUNNEL_AES_GCM=go left AESGCMAssembly on")
	}
	if c.TimerSlack != 250*time.Microsecond {
		t.Errorf("TimerSlack = %v, want 250µs", c.TimerSlack)
	}
	if c, err := Parse([]string{"ZTUNNEL_TIMER_SLACK=0"}); err != nil || c.TimerSlack != 0 {
		t.Errorf("ZTUNNEL_TIMER_SLACK=0: %v (%v), want 0: keep the inherited slack", c.TimerSlack, err)
	}
	if c.AuthToken.Static != "static-token" {
		t.Errorf("AuthToken = %+v", c.AuthToken)
	}
	c, err = Parse([]string{"XDS_ADDRESS=istiod.istio-system.svc:15012"})
	if err != nil || c.XDSAddress != "https://istiod.istio-system.svc:15012" {
		t.Errorf("schemeless XDS_ADDRESS = %q (%v), want https:// added as upstream", c.XDSAddress, err)
	}
	c, err = Parse([]string{"KUBERNETES_SERVICE_HOST=10.0.0.1"})
	if err != nil || c.XDSAddress != "https://istiod.istio-system.svc:15012" {
		t.Errorf("in-cluster default XDS address = %q (%v)", c.XDSAddress, err)
	}
}

func TestBadValues(t *testing.T) {
	cases := []struct {
		name string
		env  []string
		want string
	}{
		{"proxy mode", []string{"PROXY_MODE=sidecar"}, `config: PROXY_MODE="sidecar": must be one of shared, dedicated`},
		{"dedicated without info", []string{"PROXY_MODE=dedicated"}, `config: PROXY_MODE=dedicated requires PROXY_WORKLOAD_INFO to be set (namespace/name/service-account)`},
		{"workload info shape", []string{"PROXY_MODE=dedicated", "PROXY_WORKLOAD_INFO=ns/name"}, `config: PROXY_WORKLOAD_INFO="ns/name": want namespace/name/service-account`},
		{"fake ca bool", []string{"FAKE_CA=yes please"}, `config: FAKE_CA="yes please": must be true or false`},
		{"orig src bool", []string{"ENABLE_ORIG_SRC=sometimes"}, `config: ENABLE_ORIG_SRC="sometimes": must be true or false`},
		{"xds address scheme", []string{"XDS_ADDRESS=ftp://istiod:15012"}, `config: XDS_ADDRESS="ftp://istiod:15012": must be empty or a URL of the form https://host:port (http:// for plaintext)`},
		{"ca address no port", []string{"CA_ADDRESS=https://istiod"}, `config: CA_ADDRESS="https://istiod": must be empty or a URL of the form https://host:port (http:// for plaintext)`},
		{"max streams zero", []string{"POOL_MAX_STREAMS_PER_CONNECTION=0"}, `config: POOL_MAX_STREAMS_PER_CONNECTION="0": must be an integer from 1 to 65535`},
		{"max streams text", []string{"POOL_MAX_STREAMS_PER_CONNECTION=many"}, `config: POOL_MAX_STREAMS_PER_CONNECTION="many": must be an integer from 1 to 65535`},
		{"worker threads zero", []string{"ZTUNNEL_WORKER_THREADS=0"}, `config: ZTUNNEL_WORKER_THREADS="0": must be an integer of at least 1 or a percentage such as 50%`},
		{"worker threads percent", []string{"ZTUNNEL_WORKER_THREADS=150%"}, `config: ZTUNNEL_WORKER_THREADS="150%": a percentage must be above 0 and at most 100`},
		{"aes gcm", []string{"ZTUNNEL_AES_GCM=off"}, `config: ZTUNNEL_AES_GCM="off": must be one of auto, go`},
		{"timer slack unit", []string{"ZTUNNEL_TIMER_SLACK=1"}, `config: ZTUNNEL_TIMER_SLACK="1": must be a duration from 0 to 10ms, such as "1ms" or "50us"`},
		{"timer slack large", []string{"ZTUNNEL_TIMER_SLACK=1s"}, `config: ZTUNNEL_TIMER_SLACK="1s": must be a duration from 0 to 10ms, such as "1ms" or "50us"`},
		{"cpu limit", []string{"ZTUNNEL_WORKER_THREADS=50%", "ZTUNNEL_CPU_LIMIT=none"}, `config: ZTUNNEL_CPU_LIMIT="none": must be an integer from 1 to 65536`},
		{"idle timeout", []string{"POOL_UNUSED_RELEASE_TIMEOUT=-1s"}, `config: POOL_UNUSED_RELEASE_TIMEOUT="-1s": must be a positive duration such as "30s" or "5m"`},
		{"grace period", []string{"TERMINATION_GRACE_PERIOD_SECONDS=soon"}, `config: TERMINATION_GRACE_PERIOD_SECONDS="soon": must be a whole number of seconds`},
		{"packet mark", []string{"PACKET_MARK=0x1ffffffff"}, `config: PACKET_MARK="0x1ffffffff": must be an integer from 0 to 4294967295`},
		{"both local sources", []string{"LOCAL_XDS_PATH=/a", "LOCAL_XDS=workloads: []"}, `config: only one of LOCAL_XDS_PATH or LOCAL_XDS may be set`},
		{"local ca without fake", []string{"LOCAL_CA_DIR=/etc/cacerts"}, `config: LOCAL_CA_DIR="/etc/cacerts": only used by the built-in CA; set FAKE_CA=true as well`},
		{"admin addr", []string{"ADMIN_ADDR=15000"}, `config: ADMIN_ADDR="15000": must be host:port, e.g. 127.0.0.1:15000`},
		{"root ca garbage", []string{"CA_ROOT_CA=/nonexistent/root.pem"}, `config: CA_ROOT_CA="/nonexistent/root.pem": must be a readable PEM file path, inline PEM, or SYSTEM`},
		{"log level", []string{"LOG_LEVEL=trace"}, `config: LOG_LEVEL="trace": must be one of debug, info, warn, error`},
		{"frame size", []string{"HTTP2_FRAME_SIZE=100"}, `config: HTTP2_FRAME_SIZE="100": must be an integer from 16384 to 16777215`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse(tc.env)
			if err == nil {
				t.Fatalf("Parse(%v) succeeded, want error %q", tc.env, tc.want)
			}
			if err.Error() != tc.want {
				t.Fatalf("error:\n got %q\nwant %q", err.Error(), tc.want)
			}
		})
	}
}

func TestSeveralErrorsReportedTogether(t *testing.T) {
	_, err := Parse([]string{"FAKE_CA=maybe", "PROXY_MODE=x"})
	want := "config: PROXY_MODE=\"x\": must be one of shared, dedicated\nconfig: FAKE_CA=\"maybe\": must be true or false"
	if err == nil || err.Error() != want {
		t.Fatalf("error = %v, want %q", err, want)
	}
}

func TestDNS(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     []string
		capture bool
		addr    string
		resolv  string
		err     string
	}{
		{"defaults: on, localhost:15053", nil, true, "localhost:15053", "/etc/resolv.conf", ""},
		{"capture true in any case", []string{"ISTIO_META_DNS_CAPTURE=TRUE"}, true, "localhost:15053", "/etc/resolv.conf", ""},
		{"capture false", []string{"ISTIO_META_DNS_CAPTURE=false"}, false, "localhost:15053", "/etc/resolv.conf", ""},
		{"capture other value is off, as upstream", []string{"ISTIO_META_DNS_CAPTURE=no"}, false, "localhost:15053", "/etc/resolv.conf", ""},
		{"address moved", []string{"ISTIO_META_DNS_PROXY_ADDR=127.0.0.1:5353", "DNS_RESOLV_CONF=/tmp/r.conf"}, true, "127.0.0.1:5353", "/tmp/r.conf", ""},
		{"IPv6 address", []string{"ISTIO_META_DNS_PROXY_ADDR=[::1]:15053"}, true, "[::1]:15053", "/etc/resolv.conf", ""},
		{"bad address", []string{"ISTIO_META_DNS_PROXY_ADDR=not-an-address"}, false, "", "", `ISTIO_META_DNS_PROXY_ADDR="not-an-address": must be localhost:PORT or IP:PORT`},
		{"hostname other than localhost", []string{"ISTIO_META_DNS_PROXY_ADDR=dns.local:53"}, false, "", "", "ISTIO_META_DNS_PROXY_ADDR"},
		{"port out of range", []string{"ISTIO_META_DNS_PROXY_ADDR=localhost:70000"}, false, "", "", "ISTIO_META_DNS_PROXY_ADDR"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse(tc.env)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("err %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if c.DNSCapture != tc.capture || c.DNSProxyAddr != tc.addr || c.DNSResolvConf != tc.resolv {
				t.Errorf("got capture %v addr %q resolv %q, want %v %q %q", c.DNSCapture, c.DNSProxyAddr, c.DNSResolvConf, tc.capture, tc.addr, tc.resolv)
			}
		})
	}
}

func TestWorkerThreads(t *testing.T) {
	cases := []struct {
		name string
		env  []string
		want int
	}{
		{"unset: upstream's default applies later", nil, 0},
		{"count", []string{"ZTUNNEL_WORKER_THREADS=4"}, 4},
		{"percent of the CPU limit, rounded up", []string{"ZTUNNEL_WORKER_THREADS=25%", "ZTUNNEL_CPU_LIMIT=10"}, 3},
		{"percent, at least one", []string{"ZTUNNEL_WORKER_THREADS=1%", "ZTUNNEL_CPU_LIMIT=2"}, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := Parse(append([]string{"XDS_ADDRESS=", "FAKE_CA=true"}, tc.env...))
			if err != nil {
				t.Fatal(err)
			}
			if c.WorkerThreads != tc.want {
				t.Errorf("WorkerThreads = %d, want %d", c.WorkerThreads, tc.want)
			}
		})
	}
}
