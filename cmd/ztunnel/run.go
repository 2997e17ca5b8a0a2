package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/ztunnel-go/ztunnel/internal/admin"
	"github.com/ztunnel-go/ztunnel/internal/aesgcm"
	"github.com/ztunnel-go/ztunnel/internal/config"
	"github.com/ztunnel-go/ztunnel/internal/dns"
	"github.com/ztunnel-go/ztunnel/internal/identity"
	"github.com/ztunnel-go/ztunnel/internal/identity/caclient"
	"github.com/ztunnel-go/ztunnel/internal/proxy"
	"github.com/ztunnel-go/ztunnel/internal/state"
	"github.com/ztunnel-go/ztunnel/internal/workers"
	"github.com/ztunnel-go/ztunnel/internal/xds"
)

// app is one running ztunnel: everything run() starts, for shutdown.
type app struct {
	cfg    *config.Config
	levels *admin.Levels
	log    *slog.Logger
	reg    *prometheus.Registry
	store  *state.Store
	certs  *identity.Manager
	admin  *admin.Server
	stats  *admin.Stats
	ready  *admin.Readiness

	trimmer *textTrimmer   // drops cold text pages (memory.go)
	metrics *proxy.Metrics // shared by every proxy (one per pod in shared mode) and read by procScaler
	dns     *dns.Resolver  // nil when ISTIO_META_DNS_CAPTURE is off
	quitCh  chan struct{}
	// runCtx ends when shutdown starts; background work started by the
	// app (cert fetches for readiness) watches it.
	runCtx    context.Context
	runCancel context.CancelFunc
	// setup runs every pod's connection and stream set-up (package
	// workers); its kept goroutines end with runCtx.
	setup *workers.Pool

	// stoppers run in reverse order on shutdown, each given the drain ctx.
	stoppers []func(context.Context)
}

// run starts ztunnel and blocks until ctx ends (SIGTERM/SIGINT) or
// /quitquitquit, then drains for up to TerminationDeadline.
func run(ctx context.Context, environ []string, logOut io.Writer) error {
	cfg, err := config.Parse(environ)
	if err != nil {
		return err
	}
	// Before anything starts: on success it does not return (timerslack.go).
	slackErr := applyTimerSlack(cfg.TimerSlack, environ)
	lw := newLogWriter(logOut)
	// Runs before main prints run's error, so the lines leading up to it
	// come first.
	defer lw.Flush()
	a, err := start(ctx, cfg, lw)
	if err != nil {
		return err
	}
	if slackErr != nil {
		a.log.Warn("kept the inherited timer slack", "error", slackErr)
	}
	setMemoryLimit(environ, a.log)
	if n, scaled := setWorkerThreads(environ, cfg.WorkerThreads, a.log); scaled {
		go newProcScaler(n, a.metrics.Live, a.log).run(a.runCtx)
	}
	// Start-up is done: drop the code pages only it needed (memory.go).
	a.trimmer.trim()
	<-a.quit(ctx)
	a.log.Info("shutting down", "deadline", cfg.TerminationDeadline)
	a.shutdown()
	return nil
}

func newLevels(cfg *config.Config, out io.Writer) (*admin.Levels, error) {
	lvl, err := admin.ParseLevel(cfg.LogLevel)
	if err != nil {
		return nil, err
	}
	opts := &slog.HandlerOptions{Level: slog.LevelDebug - 4}
	var h slog.Handler = slog.NewTextHandler(out, opts)
	if cfg.LogFormat == "json" {
		h = slog.NewJSONHandler(out, opts)
	}
	if f, ok := out.(flusher); ok {
		h = flushOnWarn{h, f}
	}
	return admin.NewLevels(h, lvl), nil
}

// keptSetupWorkers bounds the goroutines kept for connection set-up
// (package workers). Set-up blocks only briefly (a dial to a pod on this
// node, a policy check), so a few per CPU cover a burst; past that a
// connection gets a fresh goroutine, as every one did before. Kept ones
// cost a parked goroutine each with its stack, and end once the node has
// gone the pool's idle timeout without a connection.
const keptSetupWorkers = 16

// start brings ztunnel up in dependency order: config sources, then
// certificates, then the admin endpoints, then the data path.
func start(ctx context.Context, cfg *config.Config, logOut io.Writer) (*app, error) {
	levels, err := newLevels(cfg, logOut)
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	a := &app{cfg: cfg, levels: levels, log: levels.Logger("ztunnel"), reg: reg, metrics: proxy.NewMetrics(reg)}
	a.runCtx, a.runCancel = context.WithCancel(context.Background())
	a.setup = workers.New(a.runCtx, keptSetupWorkers)
	a.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	aesgcm.UseAssembly(cfg.AESGCMAssembly)
	a.log.Info("starting", "version", buildVersion(), "mode", cfg.ProxyMode, "node", cfg.NodeName, "aesGcmAssembly", aesgcm.Accelerated(),
		"timerSlack", timerSlack().String())
	fail := func(err error) (*app, error) {
		a.shutdownNow()
		return nil, err
	}

	a.store, err = state.New(state.Options{Logger: levels.Logger("state"), Registerer: a.reg})
	if err != nil {
		return fail(err)
	}
	a.ready = admin.NewReadiness(cfg.ReadinessAddr, levels.Logger("readiness"))
	configReady := a.ready.Register("config")
	if err := a.loadLocalConfig(); err != nil {
		return fail(err)
	}
	if cfg.XDSAddress != "" {
		if err := a.startXDS(configReady); err != nil {
			return fail(err)
		}
	} else {
		if cfg.LocalXDSPath == "" && cfg.LocalXDS == nil {
			a.log.Warn("no configuration source: XDS_ADDRESS and LOCAL_XDS_PATH are both empty")
		}
		configReady()
	}
	if err := a.startCerts(ctx); err != nil {
		return fail(err)
	}

	a.quitCh = make(chan struct{})
	a.admin = admin.New(admin.Options{Addr: cfg.AdminAddr, Levels: levels, Quit: func() { close(a.quitCh) }, Logger: levels.Logger("admin"), Registerer: a.reg})
	a.trimmer = newTextTrimmer(levels.Logger("ztunnel"))
	a.registerDump()
	a.stats = admin.NewStats(cfg.StatsAddr, a.reg, levels.Logger("stats"))
	a.stats.OnScrape(a.trimmer.trim)
	// Stoppers run newest first: admin goes last, after the data path drained.
	a.stoppers = append(a.stoppers, func(ctx context.Context) {
		a.trimmer.stop()
		a.admin.Shutdown(ctx)
		a.stats.Shutdown(ctx)
		a.ready.Shutdown(ctx)
	})

	switch cfg.ProxyMode {
	case config.ProxyModeDedicated:
		err = a.startDedicated(ctx)
	default:
		err = a.startShared(ctx)
	}
	if err != nil {
		return fail(err)
	}
	// Serve admin only once every config_dump section and readiness
	// condition is registered, so the first scrape sees them all.
	for _, s := range []interface{ Start() error }{a.admin, a.stats, a.ready} {
		if err := s.Start(); err != nil {
			return fail(err)
		}
	}
	return a, nil
}

// quit returns a channel closed on the first of ctx ending or /quitquitquit.
func (a *app) quit(ctx context.Context) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		select {
		case <-ctx.Done():
		case <-a.quitCh:
		}
		close(done)
	}()
	return done
}

// shutdown drains: stoppers run newest first (data path before config
// before admin), sharing one deadline.
func (a *app) shutdown() {
	// Readiness answers 503 from now on: this ztunnel is going away.
	a.ready.Register("draining")
	a.runCancel()
	ctx, cancel := context.WithTimeout(context.Background(), a.cfg.TerminationDeadline)
	defer cancel()
	for i := len(a.stoppers) - 1; i >= 0; i-- {
		a.stoppers[i](ctx)
	}
	a.stoppers = nil
}

func (a *app) shutdownNow() {
	a.runCancel()
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	for i := len(a.stoppers) - 1; i >= 0; i-- {
		a.stoppers[i](ctx)
	}
	a.stoppers = nil
}

func (a *app) loadLocalConfig() error {
	switch {
	case a.cfg.LocalXDSPath != "":
		if err := xds.LoadFile(a.cfg.LocalXDSPath, a.store); err != nil {
			return err
		}
	case a.cfg.LocalXDS != nil:
		if err := xds.Load("LOCAL_XDS", a.cfg.LocalXDS, a.store); err != nil {
			return err
		}
	default:
		return nil
	}
	w, s, p := a.store.Snapshot().Counts()
	a.log.Info("loaded local config", "workloads", w, "services", s, "policies", p)
	return nil
}

// startCerts picks the CA: the built-in one (FAKE_CA, optionally with
// LOCAL_CA_DIR plug-in files) or the Istio CA at CA_ADDRESS.
func (a *app) startCerts(ctx context.Context) error {
	var ca identity.CA
	switch {
	case a.cfg.FakeCA && a.cfg.LocalCADir != "":
		lca, err := identity.LoadLocalCA(a.cfg.LocalCADir)
		if err != nil {
			return err
		}
		ca = lca
	case a.cfg.FakeCA:
		lca, err := identity.NewLocalCA(a.cfg.TrustDomain)
		if err != nil {
			return err
		}
		ca = lca
	case a.cfg.CAAddress != "":
		opts := caclient.Options{
			Address:     a.cfg.CAAddress,
			RootCA:      rootCASetting(a.cfg.CARootCA),
			AltHostname: a.cfg.AltCAHostname,
			TokenFile:   a.cfg.AuthToken.File,
			StaticToken: a.cfg.AuthToken.Static,
			ClusterID:   a.cfg.ClusterID,
			Impersonate: a.cfg.ProxyMode == config.ProxyModeShared,
			Headers:     a.cfg.CAHeaders,
			Logger:      a.levels.Logger("ca"),
		}
		c, err := caclient.New(opts)
		if err != nil {
			return err
		}
		a.stoppers = append(a.stoppers, func(context.Context) { c.Close() })
		ca = c
	default:
		return errors.New("ztunnel: no certificate authority: set CA_ADDRESS or FAKE_CA=true")
	}
	m, err := identity.NewManager(identity.ManagerOptions{CA: ca, TTL: a.cfg.SecretTTL, Logger: a.levels.Logger("identity"), Registerer: a.reg})
	if err != nil {
		return err
	}
	a.certs = m
	// Not the signal ctx: the manager must keep serving certificates while
	// the data path drains (a connection accepted just before SIGTERM still
	// handshakes); its stopper runs after the data path's.
	mctx, mcancel := context.WithCancel(context.Background())
	go m.Run(mctx)
	a.stoppers = append(a.stoppers, func(context.Context) { mcancel(); m.Close() })
	return nil
}

func rootCASetting(r config.RootCert) string {
	switch {
	case r.System:
		return caclient.RootSystem
	case r.Static != nil:
		return string(r.Static)
	}
	return r.File
}

// registerDump wires the /config_dump sections, upstream's keys.
func (a *app) registerDump() {
	snap := func() *state.Snapshot { return a.store.Snapshot() }
	a.admin.Register("workloads", func() (any, error) { return snap().DumpWorkloads(), nil })
	a.admin.Register("services", func() (any, error) { return snap().DumpServices(), nil })
	a.admin.Register("policies", func() (any, error) { return snap().DumpPolicies(), nil })
	a.admin.Register("certificates", func() (any, error) { return a.certs.Dump(), nil })
	a.admin.Register("version", func() (any, error) {
		return map[string]string{"version": buildVersion(), "goVersion": goVersion(), "buildProfile": "release"}, nil
	})
	a.admin.Register("config", func() (any, error) {
		a.trimmer.soon() // a dump walks cold code: give its pages back after
		return configDump(a.cfg), nil
	})
}

// configDump is the effective configuration without secrets.
func configDump(c *config.Config) map[string]any {
	token := "none"
	switch {
	case c.AuthToken.File != "":
		token = "file:" + c.AuthToken.File
	case c.AuthToken.Static != "":
		token = "static (redacted)"
	}
	wi := ""
	if c.WorkloadInfo != nil {
		wi = c.WorkloadInfo.Namespace + "/" + c.WorkloadInfo.Name + "/" + c.WorkloadInfo.ServiceAccount
	}
	return map[string]any{
		"proxyMode":                c.ProxyMode,
		"proxyWorkloadInformation": wi,
		"xdsAddress":               c.XDSAddress,
		"caAddress":                c.CAAddress,
		"fakeCa":                   c.FakeCA,
		"localCaDir":               c.LocalCADir,
		"localXdsPath":             c.LocalXDSPath,
		"xdsOnDemand":              c.XDSOnDemand,
		"authToken":                token,
		"inpodUds":                 c.InpodUDS,
		"inpodPortReuse":           c.InpodPortReuse,
		"packetMark":               c.PacketMark,
		"dnsProxy":                 c.DNSCapture,
		"dnsProxyAddr":             c.DNSProxyAddr,
		"dnsResolvConf":            c.DNSResolvConf,
		"nodeName":                 c.NodeName,
		"clusterId":                c.ClusterID,
		"clusterDomain":            c.ClusterDomain,
		"network":                  c.Network,
		"trustDomain":              c.TrustDomain,
		"poolMaxStreamsPerConn":    c.PoolMaxStreamsPerConn,
		"poolUnusedReleaseTimeout": c.PoolUnusedRelease.String(),
		"windowSize":               c.StreamWindowSize,
		"connectionWindowSize":     c.ConnWindowSize,
		"frameSize":                c.FrameSize,
		"aesGcmAssembly":           aesgcm.Accelerated(),
		"timerSlack":               timerSlack().String(),
		"secretTtl":                c.SecretTTL.String(),
		"selfTerminationDeadline":  c.TerminationDeadline.String(),
		"adminAddr":                c.AdminAddr,
		"statsAddr":                c.StatsAddr,
		"readinessAddr":            c.ReadinessAddr,
		"proxyMetadata":            c.Metadata,
	}
}

// listenTCP opens a listener on all addresses at port, in the current netns.
func listenTCP(port int) (net.Listener, error) {
	ln, err := net.Listen("tcp", fmt.Sprintf(":%d", port))
	if err != nil {
		return nil, fmt.Errorf("ztunnel: listen :%d: %w", port, err)
	}
	return ln, nil
}
