// Package daemonset holds the Kubernetes manifests that run this ztunnel as
// the node proxy of an Istio ambient install, in place of upstream's ztunnel
// DaemonSet, and a Dockerfile for the image they name. See README.md.
//
// The package has no code of its own; manifests_test.go decodes every
// manifest strictly into the Kubernetes API types and checks them against
// the binary: every environment variable the DaemonSet sets is one
// internal/config reads and config.Parse accepts, the ZDS socket directory
// is the host path istio-cni serves on, the token and root-certificate
// volumes land where ztunnel's default paths point, and the probe, metric
// and port declarations match what internal/admin serves.
package daemonset
