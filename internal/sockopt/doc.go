// Package sockopt owns the socket options ztunnel depends on for in-pod
// redirection: SO_MARK on upstream sockets (so the pod's iptables rules do
// not capture ztunnel's own traffic again), SO_ORIGINAL_DST on accepted
// outbound connections (where the app meant to go before REDIRECT), and the
// listener options IP_TRANSPARENT, SO_REUSEPORT and keep-alive.
//
// Everything here is Linux-only; the package exposes net.Dialer and
// net.ListenConfig Control functions so callers keep using the standard
// library's sockets.
package sockopt
