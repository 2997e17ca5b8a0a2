package daemonset

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/goleak"
	corev1 "k8s.io/api/core/v1"

	"github.com/ztunnel-go/ztunnel/internal/admin"
	"github.com/ztunnel-go/ztunnel/internal/config"
)

const (
	// istioCNISockDir is the host directory istio-cni's node agent serves
	// ZDS in (its chart's cni-ztunnel-sock-dir hostPath volume).
	istioCNISockDir = "/var/run/ztunnel"
	// tokenAudience is the only audience istiod accepts on the istio-token.
	tokenAudience = "istio-ca"
	// minTokenSeconds is the shortest expirationSeconds the API server
	// accepts for a projected token.
	minTokenSeconds = 600
	containerName   = "istio-proxy" // what `kubectl set image` and istioctl name
	statsPortName   = "ztunnel-stats"
	readinessPath   = "/healthz/ready"
	rootCertOrigin  = "configMap istio-ca-root-cert key root-cert.pem"
)

// wantCaps is exactly what the container may add after dropping ALL; see
// README.md for what each is used for.
var wantCaps = []corev1.Capability{"NET_ADMIN", "NET_RAW", "SYS_ADMIN"}

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fixture is everything the checks look at, built once per test.
type fixture struct {
	srcDir   string // this package's directory (the test chdirs away from it)
	b        *bundle
	pod      *corev1.PodSpec
	c        *corev1.Container
	env      []string
	fs       *rootfs
	cfg      *config.Config
	parseErr error
}

// load decodes the manifests, builds the container's filesystem in a
// temporary directory and, from inside it (the image's WORKDIR), runs
// config.Parse on the container's environment. A Parse error is kept for
// the config_parse subtest to report.
func load(t *testing.T) *fixture {
	t.Helper()
	src, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	b, err := loadBundle(src)
	if err != nil {
		t.Fatalf("decoding the manifests: %v", err)
	}
	f := &fixture{srcDir: src, b: b, pod: &b.ds.Spec.Template.Spec}
	if n := len(f.pod.Containers); n != 1 || f.pod.Containers[0].Name != containerName {
		t.Fatalf("want exactly one container named %q, have %d", containerName, n)
	}
	f.c = &f.pod.Containers[0]
	if f.env, err = resolveEnv(b.ds, f.c); err != nil {
		t.Fatalf("resolving env: %v", err)
	}
	if f.fs, err = buildRootfs(t.TempDir(), f.pod, f.c); err != nil {
		t.Fatalf("building the container filesystem: %v", err)
	}
	t.Chdir(f.fs.dir)
	f.cfg, f.parseErr = config.Parse(f.env)
	return f
}

// config returns the parsed Config, or stops a check that needs it.
func (f *fixture) config(t *testing.T) *config.Config {
	t.Helper()
	if f.parseErr != nil {
		t.Fatalf("config.Parse failed (see config_parse): %v", f.parseErr)
	}
	return f.cfg
}

func TestManifests(t *testing.T) {
	f := load(t)
	ds, pod, c := f.b.ds, f.pod, f.c

	t.Run("service_account", func(t *testing.T) {
		sa := f.b.sa
		if sa.Name != "ztunnel" || sa.Namespace != "istio-system" {
			t.Errorf("ServiceAccount %s/%s: istiod trusts istio-system/ztunnel by default", sa.Namespace, sa.Name)
		}
		if pod.ServiceAccountName != sa.Name || ds.Namespace != sa.Namespace {
			t.Errorf("pod runs as %s/%s, want %s/%s", ds.Namespace, pod.ServiceAccountName, sa.Namespace, sa.Name)
		}
	})

	t.Run("labels_and_selector", func(t *testing.T) {
		labels := ds.Spec.Template.Labels
		if ds.Spec.Selector == nil || len(ds.Spec.Selector.MatchLabels) == 0 {
			t.Fatal("no selector")
		}
		for k, v := range ds.Spec.Selector.MatchLabels {
			if labels[k] != v {
				t.Errorf("selector %s=%s does not match the pod template (%q)", k, v, labels[k])
			}
		}
		for k, v := range map[string]string{
			"app":                     "ztunnel", // istioctl ztunnel-config finds pods by it
			"istio.io/dataplane-mode": "none",    // never capture ztunnel itself
			"sidecar.istio.io/inject": "false",
		} {
			if labels[k] != v {
				t.Errorf("pod label %s=%q, want %q", k, labels[k], v)
			}
		}
	})

	t.Run("pod_network", func(t *testing.T) {
		// In-pod mode: listeners live in each pod's netns, not the node's.
		if pod.HostNetwork {
			t.Error("hostNetwork is on; upstream's in-pod mode runs ztunnel in its own pod netns (README.md)")
		}
		if pod.DNSPolicy != "" && pod.DNSPolicy != corev1.DNSClusterFirst {
			t.Errorf("dnsPolicy %s: istiod's service name needs cluster DNS", pod.DNSPolicy)
		}
	})

	t.Run("security_context", func(t *testing.T) {
		sc := c.SecurityContext
		if sc == nil || sc.Capabilities == nil {
			t.Fatal("no securityContext.capabilities")
		}
		if sc.Privileged == nil || *sc.Privileged {
			t.Error("privileged must be set to false")
		}
		if !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
			t.Errorf("drop = %v, want [ALL]", sc.Capabilities.Drop)
		}
		add := slices.Clone(sc.Capabilities.Add)
		slices.Sort(add)
		if !slices.Equal(add, wantCaps) {
			t.Errorf("add = %v, want exactly %v", sc.Capabilities.Add, wantCaps)
		}
		if sc.RunAsUser == nil || *sc.RunAsUser != 0 {
			t.Error("runAsUser must be 0: added capabilities are effective only for root")
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Error("readOnlyRootFilesystem must be true")
		}
	})

	t.Run("schedules_on_every_node", func(t *testing.T) {
		if pod.PriorityClassName != "system-node-critical" {
			t.Errorf("priorityClassName %q, want system-node-critical", pod.PriorityClassName)
		}
		if len(pod.NodeSelector) != 1 || pod.NodeSelector["kubernetes.io/os"] != "linux" {
			t.Errorf("nodeSelector %v, want only kubernetes.io/os=linux", pod.NodeSelector)
		}
		for _, taint := range []corev1.Taint{
			{Key: "node-role.kubernetes.io/control-plane", Effect: corev1.TaintEffectNoSchedule},
			{Key: "dedicated", Value: "gpu", Effect: corev1.TaintEffectNoSchedule},
			{Key: "CriticalAddonsOnly", Value: "true", Effect: corev1.TaintEffectNoSchedule},
			{Key: "node.kubernetes.io/not-ready", Effect: corev1.TaintEffectNoExecute},
			{Key: "node.kubernetes.io/unreachable", Effect: corev1.TaintEffectNoExecute},
		} {
			if !tolerates(pod.Tolerations, taint) {
				t.Errorf("taint %s=%s:%s is not tolerated", taint.Key, taint.Value, taint.Effect)
			}
		}
	})

	t.Run("stats_port_and_annotations", func(t *testing.T) {
		cfg := f.config(t)
		want := listenPort(t, "STATS_ADDR", cfg.StatsAddr)
		got, err := resolvePort(c, statsPortName)
		if err != nil {
			t.Fatal(err)
		}
		if got != want {
			t.Errorf("port %s = %d, the binary's stats server listens on %d", statsPortName, got, want)
		}
		ann := ds.Spec.Template.Annotations
		if ann["prometheus.io/scrape"] != "true" {
			t.Errorf("prometheus.io/scrape = %q", ann["prometheus.io/scrape"])
		}
		if ann["prometheus.io/port"] != strconv.Itoa(want) {
			t.Errorf("prometheus.io/port = %q, want %d", ann["prometheus.io/port"], want)
		}
		if p := ann["prometheus.io/path"]; p != "/stats/prometheus" {
			t.Errorf("prometheus.io/path = %q, want /stats/prometheus", p)
		}
	})

	t.Run("readiness_probe", func(t *testing.T) {
		cfg := f.config(t)
		p := c.ReadinessProbe
		if p == nil || p.HTTPGet == nil {
			t.Fatal("no httpGet readinessProbe")
		}
		if p.HTTPGet.Path != readinessPath {
			t.Errorf("probe path %q, want %s", p.HTTPGet.Path, readinessPath)
		}
		if p.HTTPGet.Scheme != "" && p.HTTPGet.Scheme != corev1.URISchemeHTTP {
			t.Errorf("probe scheme %s; the readiness server is plain HTTP", p.HTTPGet.Scheme)
		}
		got, err := resolvePort(c, p.HTTPGet.Port.String())
		if err != nil {
			t.Fatal(err)
		}
		if want := listenPort(t, "READINESS_ADDR", cfg.ReadinessAddr); got != want {
			t.Errorf("probe port %d, the readiness server listens on %d", got, want)
		}
	})

	t.Run("env_names_are_read", func(t *testing.T) {
		names, err := readNames(filepath.Join(f.srcDir, "../../internal/config"))
		if err != nil {
			t.Fatal(err)
		}
		checkEnvNames(t, c, names, "internal/config reads")
	})

	t.Run("env_names_are_documented", func(t *testing.T) {
		names, err := documentedNames(filepath.Join(f.srcDir, "../../internal/config/doc.go"))
		if err != nil {
			t.Fatal(err)
		}
		checkEnvNames(t, c, names, "internal/config/doc.go lists")
	})

	t.Run("config_parse", func(t *testing.T) {
		if f.parseErr != nil {
			t.Fatalf("config.Parse(%q): %v", f.env, f.parseErr)
		}
		cfg := f.cfg
		istiod := "istiod." + ds.Namespace + ".svc:15012"
		for name, got := range map[string]string{"XDS_ADDRESS": cfg.XDSAddress, "CA_ADDRESS": cfg.CAAddress} {
			u, err := url.Parse(got)
			if err != nil || u.Scheme != "https" || u.Host != istiod {
				t.Errorf("%s → %q, want https://%s", name, got, istiod)
			}
		}
		for _, chk := range []struct{ what, got, want string }{
			{"ProxyMode", string(cfg.ProxyMode), string(config.ProxyModeShared)},
			{"ClusterID", cfg.ClusterID, "Kubernetes"},
			{"NodeName", cfg.NodeName, "node-a"},
			{"SelfNamespace", cfg.SelfNamespace, ds.Namespace},
			{"SelfServiceAccount", cfg.SelfServiceAccount, f.b.sa.Name},
			{"Metadata[ENABLE_HBONE]", cfg.Metadata["ENABLE_HBONE"], "true"},
		} {
			if chk.got != chk.want {
				t.Errorf("%s = %q, want %q", chk.what, chk.got, chk.want)
			}
		}
		if cfg.FakeCA || cfg.LocalXDSPath != "" {
			t.Error("the DaemonSet must use istiod, not the built-in CA or local config")
		}
	})

	t.Run("zds_socket_host_path", func(t *testing.T) {
		cfg := f.config(t)
		dir := path.Dir(cfg.InpodUDS)
		m, rel, ok := mountFor(c, dir)
		if !ok {
			t.Fatalf("INPOD_UDS %s: no volume is mounted at %s", cfg.InpodUDS, dir)
		}
		v := volumeNamed(pod, m.Name)
		if v == nil || v.HostPath == nil {
			t.Fatalf("%s is mounted from %q, which is not a hostPath volume", dir, m.Name)
		}
		if host := path.Join(v.HostPath.Path, rel); host != istioCNISockDir {
			t.Errorf("INPOD_UDS's directory is host path %s; istio-cni serves in %s", host, istioCNISockDir)
		}
		if v.HostPath.Type == nil || *v.HostPath.Type != corev1.HostPathDirectoryOrCreate {
			t.Error("hostPath type must be DirectoryOrCreate: istio-cni may start after ztunnel")
		}
	})

	t.Run("token_volume", func(t *testing.T) {
		cfg := f.config(t)
		if cfg.AuthToken.File == "" {
			t.Fatalf("no token file at the path ztunnel reads (AUTH_TOKEN or its default); mounted files: %v", f.fs.origin)
		}
		p := containerPath(cfg.AuthToken.File)
		if got, want := f.fs.origin[p], "serviceAccountToken audience="+tokenAudience; got != want {
			t.Errorf("%s comes from %q, want %q", p, got, want)
		}
		for _, v := range pod.Volumes {
			if v.Projected == nil {
				continue
			}
			for _, s := range v.Projected.Sources {
				if tok := s.ServiceAccountToken; tok != nil && (tok.ExpirationSeconds == nil || *tok.ExpirationSeconds < minTokenSeconds) {
					t.Errorf("volume %s: expirationSeconds must be set and at least %d", v.Name, minTokenSeconds)
				}
			}
		}
	})

	t.Run("root_cert_volume", func(t *testing.T) {
		cfg := f.config(t)
		for name, rc := range map[string]config.RootCert{"XDS_ROOT_CA": cfg.XDSRootCA, "CA_ROOT_CA": cfg.CARootCA} {
			if rc.File == "" {
				t.Errorf("%s is not a file (%+v)", name, rc)
				continue
			}
			p := containerPath(rc.File)
			if got := f.fs.origin[p]; got != rootCertOrigin {
				t.Errorf("%s = %s comes from %q, want %q", name, p, got, rootCertOrigin)
			}
		}
	})

	t.Run("termination_grace", func(t *testing.T) {
		cfg := f.config(t)
		if pod.TerminationGracePeriodSeconds == nil {
			t.Fatal("terminationGracePeriodSeconds not set")
		}
		grace := *pod.TerminationGracePeriodSeconds
		if got := envValue(c, "TERMINATION_GRACE_PERIOD_SECONDS"); got != strconv.FormatInt(grace, 10) {
			t.Errorf("TERMINATION_GRACE_PERIOD_SECONDS=%q, terminationGracePeriodSeconds=%d", got, grace)
		}
		// ztunnel must finish its forced close before the kubelet's SIGKILL.
		if d := cfg.TerminationDeadline; d <= 0 || d > time.Duration(grace-1)*time.Second {
			t.Errorf("drain deadline %v leaves no margin inside the %ds grace period", d, grace)
		}
	})

	t.Run("image_entrypoint", func(t *testing.T) {
		data, err := os.ReadFile(filepath.Join(f.srcDir, "Dockerfile"))
		if err != nil {
			t.Fatal(err)
		}
		st, err := parseDockerfile(data)
		if err != nil {
			t.Fatal(err)
		}
		if st.workdir != imageWorkdir {
			t.Errorf("WORKDIR %s; ztunnel's relative default paths assume %s", st.workdir, imageWorkdir)
		}
		if len(st.entrypoint) == 0 || !slices.Contains(st.copyDests, st.entrypoint[0]) {
			t.Errorf("ENTRYPOINT %v is not a file the final stage copies (%v)", st.entrypoint, st.copyDests)
		}
		// The image's ENTRYPOINT must run, so upstream's pod spec (args
		// only) works unchanged with this image.
		if len(c.Command) > 0 {
			t.Errorf("command %v overrides the image ENTRYPOINT", c.Command)
		}
		if len(c.Args) == 0 || c.Args[0] != "proxy" || !slices.Equal(c.Args, st.cmd) {
			t.Errorf("args %v, want [proxy ...] equal to the image CMD %v", c.Args, st.cmd)
		}
	})
}

// TestServedPaths starts the binary's stats and readiness servers and
// fetches the paths the manifest points Prometheus and the kubelet at.
func TestServedPaths(t *testing.T) {
	f := load(t)
	stats := admin.NewStats("127.0.0.1:0", prometheus.NewRegistry(), nil)
	ready := admin.NewReadiness("127.0.0.1:0", nil)
	for _, s := range []interface {
		Start() error
		Addr() net.Addr
	}{stats, ready} {
		if err := s.Start(); err != nil {
			t.Fatal(err)
		}
	}
	t.Cleanup(func() {
		// Not t.Context(): it is already cancelled when cleanups run.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = stats.Shutdown(ctx)
		_ = ready.Shutdown(ctx)
	})
	var probePath string
	if p := f.c.ReadinessProbe; p != nil && p.HTTPGet != nil {
		probePath = p.HTTPGet.Path
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	for _, tc := range []struct {
		name string
		addr net.Addr
		path string
		want int
	}{
		{"prometheus_path", stats.Addr(), f.b.ds.Spec.Template.Annotations["prometheus.io/path"], http.StatusOK},
		{"readiness_probe_path", ready.Addr(), probePath, http.StatusOK},
		{"unknown_path_is_404", stats.Addr(), "/no-such-path", http.StatusNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if !strings.HasPrefix(tc.path, "/") {
				t.Fatalf("path %q", tc.path)
			}
			resp, err := client.Get(fmt.Sprintf("http://%s%s", tc.addr, tc.path))
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != tc.want {
				t.Errorf("GET %s: %s, want %d", tc.path, resp.Status, tc.want)
			}
		})
	}
}

// TestDecodeStrict shows that the decoder rejects what a typo would produce.
func TestDecodeStrict(t *testing.T) {
	const ds = "apiVersion: apps/v1\nkind: DaemonSet\nmetadata:\n  name: z\nspec:\n  template:\n    spec:\n"
	for _, tc := range []struct {
		name, doc string
		ok        bool
	}{
		{"valid", ds + "      hostNetwork: false\n", true},
		{"valid_with_comment_only_document", "# nothing\n---\n" + ds, true},
		{"unknown_field", ds + "      hostNetwrok: false\n", false},
		{"wrong_type", ds + "      terminationGracePeriodSeconds: \"30\"\n", false},
		{"duplicate_key", ds + "      hostNetwork: false\n      hostNetwork: true\n", false},
		{"unsupported_kind", "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: z\n", false},
		{"missing_kind", "apiVersion: v1\nmetadata:\n  name: z\n", false},
		{"wrong_api_version", "apiVersion: apps/v1beta2\nkind: DaemonSet\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := decodeDocuments(tc.name, []byte(tc.doc))
			if (err == nil) != tc.ok {
				t.Errorf("err = %v, want ok=%v", err, tc.ok)
			}
		})
	}
}

// TestUpstreamChartEnv runs config.Parse on the environment upstream's
// ztunnel chart renders by default for an ambient install, so that
// swapping only the image of an existing DaemonSet works. The chart writes
// the istiod addresses without a scheme; upstream's binary adds https://.
func TestUpstreamChartEnv(t *testing.T) {
	base := []string{
		"RUST_LOG=info", "RUST_BACKTRACE=1", "ISTIO_META_CLUSTER_ID=Kubernetes", "INPOD_ENABLED=true",
		"TERMINATION_GRACE_PERIOD_SECONDS=30", "POD_NAME=ztunnel-x7k2p", "POD_NAMESPACE=istio-system",
		"NODE_NAME=node-a", "INSTANCE_IP=10.244.1.5", "SERVICE_ACCOUNT=ztunnel", "ISTIO_META_ENABLE_HBONE=true",
		"ZTUNNEL_CPU_LIMIT=4", "ZTUNNEL_RESOURCE_CPU_REQUEST=1", "KUBERNETES_SERVICE_HOST=10.96.0.1",
	}
	for _, tc := range []struct{ name, addr, want string }{
		{"chart_default_no_scheme", "istiod.istio-system.svc:15012", "https://istiod.istio-system.svc:15012"},
		{"revisioned_no_scheme", "istiod-canary.istio-system.svc:15012", "https://istiod-canary.istio-system.svc:15012"},
		{"explicit_https", "https://istiod.istio-system.svc:15012", "https://istiod.istio-system.svc:15012"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			env := append(slices.Clone(base), "XDS_ADDRESS="+tc.addr, "CA_ADDRESS="+tc.addr)
			cfg, err := config.Parse(env)
			if err != nil {
				t.Fatalf("config.Parse: %v", err)
			}
			if cfg.XDSAddress != tc.want || cfg.CAAddress != tc.want {
				t.Errorf("XDSAddress %q, CAAddress %q, want %q", cfg.XDSAddress, cfg.CAAddress, tc.want)
			}
		})
	}
}

func checkEnvNames(t *testing.T, c *corev1.Container, names envNames, what string) {
	t.Helper()
	if !names.has("XDS_ADDRESS") || !names.has("ISTIO_META_CLUSTER_ID") {
		t.Fatalf("found no variable names where %s them; has the source's shape changed?", what)
	}
	seen := map[string]bool{}
	for _, e := range c.Env {
		if seen[e.Name] {
			t.Errorf("%s is set twice", e.Name)
		}
		seen[e.Name] = true
		if !names.has(e.Name) {
			t.Errorf("%s is set but not among the variables %s", e.Name, what)
		}
	}
}

func tolerates(tols []corev1.Toleration, taint corev1.Taint) bool {
	for _, tol := range tols {
		if tol.Effect != "" && tol.Effect != taint.Effect {
			continue
		}
		if tol.Key == "" && tol.Operator == corev1.TolerationOpExists {
			return true
		}
		if tol.Key != taint.Key {
			continue
		}
		if tol.Operator == corev1.TolerationOpExists || tol.Value == taint.Value {
			return true
		}
	}
	return false
}

// resolvePort turns a probe or port reference (number or name) into the
// container port number.
func resolvePort(c *corev1.Container, ref string) (int, error) {
	if n, err := strconv.Atoi(ref); err == nil {
		return n, nil
	}
	for _, p := range c.Ports {
		if p.Name == ref {
			return int(p.ContainerPort), nil
		}
	}
	return 0, fmt.Errorf("no container port named %q", ref)
}

// listenPort is the port of a listen address, which must be a wildcard:
// Prometheus and the kubelet connect to the pod IP.
func listenPort(t *testing.T, name, addr string) int {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, addr, err)
	}
	if host != "" && host != "::" && host != "0.0.0.0" {
		t.Errorf("%s=%q listens on %s only; the kubelet and Prometheus use the pod IP", name, addr, host)
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, addr, err)
	}
	return n
}

func envValue(c *corev1.Container, name string) string {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value
		}
	}
	return ""
}
