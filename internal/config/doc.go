// Package config turns the process environment into a typed Config.
//
// Variable names, accepted values and defaults follow upstream ztunnel so an
// existing DaemonSet's env works unchanged. A bad value is a start-up error
// that names the variable, the value and what is accepted; nothing is
// silently defaulted.
//
// Read (upstream names): XDS_ADDRESS, XDS_ROOT_CA, CA_ADDRESS, CA_ROOT_CA,
// AUTH_TOKEN, FAKE_CA, LOCAL_XDS_PATH, LOCAL_XDS, XDS_ON_DEMAND, PROXY_MODE,
// PROXY_WORKLOAD_INFO, INPOD_UDS, INPOD_PORT_REUSE, ENABLE_ORIG_SRC, PACKET_MARK, NODE_NAME,
// CLUSTER_ID (or ISTIO_META_CLUSTER_ID), CLUSTER_DOMAIN, NETWORK,
// POOL_MAX_STREAMS_PER_CONNECTION, POOL_UNUSED_RELEASE_TIMEOUT,
// ZTUNNEL_WORKER_THREADS and ZTUNNEL_CPU_LIMIT (threads running the proxy
// at most: GOMAXPROCS; default 2 as upstream, never more than the runtime's
// own default, which follows the container's CPU limit; fewer while the
// proxy's goroutines do not queue for them; an explicit GOMAXPROCS wins and is kept), HTTP2_STREAM_WINDOW_SIZE, HTTP2_CONNECTION_WINDOW_SIZE, HTTP2_FRAME_SIZE,
// SECRET_TTL, TERMINATION_GRACE_PERIOD_SECONDS,
// CONNECTION_TERMINATION_DEADLINE, INSTANCE_IP, POD_NAMESPACE, POD_NAME, SERVICE_ACCOUNT,
// TRUST_DOMAIN, ISTIO_META_* (ISTIO_META_DNS_CAPTURE: DNS proxy on unless
// set to something other than "true"; ISTIO_META_DNS_PROXY_ADDR: its
// address, default localhost:15053), ISTIO_METAJSON_*, XDS_HEADER_*, CA_HEADER_*,
// ALT_XDS_HOSTNAME, ALT_CA_HOSTNAME, KUBERNETES_SERVICE_HOST.
//
// Read (this project's extensions): LOCAL_CA_DIR (Istio plug-in CA files for
// the built-in CA), DNS_RESOLV_CONF (the resolvers the DNS proxy forwards
// names outside the mesh to; default /etc/resolv.conf), ADMIN_ADDR, STATS_ADDR, READINESS_ADDR (listen
// addresses; defaults 127.0.0.1:15000, [::]:15020, [::]:15021), LOG_LEVEL,
// LOG_FORMAT, ZTUNNEL_AES_GCM (auto, the default: HBONE records sealed with
// package aesgcm's VAES assembly where the CPU has it; go: Go's AES-GCM
// always), ZTUNNEL_TIMER_SLACK (the kernel timer slack of every thread,
// applied by one re-exec at start-up; default 1ms, 0 keeps the inherited
// one; see cmd/ztunnel/timerslack.go).
package config
