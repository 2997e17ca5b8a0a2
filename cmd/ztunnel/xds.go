package main

import "context"

// startXDS connects to istiod.
func (a *app) startXDS(ctx context.Context) error {
	a.log.Warn("xDS client is not wired yet", "address", a.cfg.XDSAddress)
	return nil
}
