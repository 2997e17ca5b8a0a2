package main

// startXDS connects to istiod.
func (a *app) startXDS(ready func()) error {
	a.log.Warn("xDS client is not wired yet", "address", a.cfg.XDSAddress)
	return nil
}
