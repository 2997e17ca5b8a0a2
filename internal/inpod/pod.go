package inpod

import (
	"context"

	"github.com/ztunnel-go/ztunnel/internal/inpod/zdspb"
)

// WorkloadInfo is what the node agent says about a pod. JSON names are
// upstream's (the workloadState dump shows them).
type WorkloadInfo struct {
	Name           string `json:"name"`
	Namespace      string `json:"namespace"`
	ServiceAccount string `json:"serviceAccount"`
}

func workloadInfoFrom(p *zdspb.WorkloadInfo) WorkloadInfo {
	return WorkloadInfo{Name: p.GetName(), Namespace: p.GetNamespace(), ServiceAccount: p.GetServiceAccount()}
}

// PodServer starts the per-pod proxy. It is implemented by the proxy wiring
// in cmd/ztunnel.
type PodServer interface {
	// StartPod opens the pod's 15001/15006/15008 listeners and, with the
	// DNS proxy on, UDP and TCP localhost:15053 inside ns (via its Listen and
	// ListenPacket, so they carry the mark and SO_REUSEPORT) and serves them.
	// It must return quickly: the agent waits at most 5 s for the Ack, and
	// ctx carries a deadline below that. ns belongs to the caller, who closes
	// it after the Pod is drained; the Pod may use it (Dial) until then.
	StartPod(ctx context.Context, uid string, info WorkloadInfo, ns *Netns) (Pod, error)
}

// Pod is one running per-pod proxy.
type Pod interface {
	// Drain stops accepting, lets open connections finish until ctx is done,
	// then force-closes them, and returns when all are gone. A ctx that is
	// already done asks for an immediate close (the pod was deleted).
	Drain(ctx context.Context) error
}

// ConnectionDumper is optionally implemented by a Pod to show its open
// connections under "connections" in the workloadState dump (upstream:
// {"inbound": [...], "outbound": [...]}).
type ConnectionDumper interface {
	DumpConnections() any
}
