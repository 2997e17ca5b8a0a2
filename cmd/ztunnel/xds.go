package main

import (
	"context"
	"os"
	"strings"

	"github.com/ztunnel-go/ztunnel/internal/config"
	"github.com/ztunnel-go/ztunnel/internal/xds"
)

// startXDS connects to istiod (XDS_ADDRESS) and feeds the store; ready is
// called once both Address and Authorization have arrived.
func (a *app) startXDS(ready func()) error {
	cfg := a.cfg
	opts := xds.Options{
		Address:     cfg.XDSAddress,
		AltHostname: cfg.AltXDSHostname,
		Headers:     cfg.XDSHeaders,
		Node: xds.NodeInfo{
			IP:           cfg.InstanceIP,
			PodName:      cfg.SelfName,
			PodNamespace: cfg.SelfNamespace,
			NodeName:     cfg.NodeName,
			ClusterID:    cfg.ClusterID,
			Metadata:     cfg.Metadata,
			JSONMetadata: cfg.JSONMetadata,
		},
		Handler:    a.store,
		Logger:     a.levels.Logger("xds"),
		Registerer: a.reg,
		// Readiness names why config is still missing: the last stream error.
		OnStreamEnd: func(reason string, err error) {
			if err != nil {
				a.ready.SetDetail("config", "xds "+reason+": "+err.Error())
			}
		},
	}
	switch r := cfg.XDSRootCA; {
	case r.Static != nil:
		opts.RootCAPEM = r.Static
	case r.File != "" && !r.System:
		opts.RootCAFile = r.File
	}
	if tok := tokenSource(cfg.AuthToken); tok != nil {
		opts.Token = tok
	}
	c, err := xds.New(opts)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		c.Run(ctx)
	}()
	go func() {
		select {
		case <-c.Ready():
			ready()
		case <-ctx.Done():
		}
	}()
	a.stoppers = append(a.stoppers, func(context.Context) { cancel(); <-done })
	return nil
}

// tokenSource reads the istiod token per connection (the kubelet rotates
// the projected token file).
func tokenSource(t config.AuthToken) func() (string, error) {
	switch {
	case t.File != "":
		return func() (string, error) {
			b, err := os.ReadFile(t.File)
			return strings.TrimSpace(string(b)), err
		}
	case t.Static != "":
		return func() (string, error) { return t.Static, nil }
	}
	return nil
}
