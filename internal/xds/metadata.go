package xds

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/types/known/structpb"
)

// Node metadata keys ztunnel always sends (upstream's names). istiod reads
// NAMESPACE and NODE_NAME to decide which workloads this ztunnel serves.
const (
	metaName        = "NAME"
	metaNamespace   = "NAMESPACE"
	metaInstanceIPs = "INSTANCE_IPS"
	metaNodeName    = "NODE_NAME"
)

const (
	// defaultInstanceIP is what upstream puts in the node id and
	// INSTANCE_IPS when INSTANCE_IP is unset; istiod only needs it to parse.
	defaultInstanceIP = "1.1.1.1"
	// defaultNodeDomain is the last part of the node id. Upstream always
	// sends "cluster.local" there whatever CLUSTER_DOMAIN says.
	defaultNodeDomain = "cluster.local"

	// headerAuthorization and headerClusterID are the gRPC metadata istiod's
	// JWT authenticator reads (upstream identity/auth.rs sends both, and
	// only when a token is configured).
	headerAuthorization = "authorization"
	headerClusterID     = "clusterid"
)

// NodeInfo describes this ztunnel to the control plane. Every field may be
// empty.
type NodeInfo struct {
	// IP is INSTANCE_IP; "" means upstream's placeholder "1.1.1.1".
	IP string
	// PodName and PodNamespace are POD_NAME and POD_NAMESPACE of the
	// ztunnel pod itself.
	PodName      string
	PodNamespace string
	// NodeName is NODE_NAME, the Kubernetes node this ztunnel serves.
	NodeName string
	// ClusterID (ISTIO_META_CLUSTER_ID or CLUSTER_ID) is sent as the
	// "clusterid" gRPC header together with the token, as upstream does.
	// It is not added to the node metadata (only ISTIO_META_CLUSTER_ID
	// itself puts it there, through Metadata).
	ClusterID string
	// Domain is the last part of the node id; "" means "cluster.local",
	// which is what upstream always sends.
	Domain string
	// Metadata holds the ISTIO_META_* variables with the prefix removed.
	// They are sent as string values and override the built-in keys.
	Metadata map[string]string
	// JSONMetadata holds the ISTIO_METAJSON_* variables with the prefix
	// removed; each value is JSON text sent as a structured value. A value
	// that is not valid JSON is left out and reported by New.
	JSONMetadata map[string]string
}

// ID is the xDS node id in the form istiod parses:
// "ztunnel~<ip>~<pod>.<namespace>~<namespace>.svc.<domain>".
func (n NodeInfo) ID() string {
	ip := n.IP
	if ip == "" {
		ip = defaultInstanceIP
	}
	domain := n.Domain
	if domain == "" {
		domain = defaultNodeDomain
	}
	return fmt.Sprintf("ztunnel~%s~%s.%s~%s.svc.%s", ip, n.PodName, n.PodNamespace, n.PodNamespace, domain)
}

// node builds the Node sent on the first request of each type. The error,
// if any, names the JSONMetadata entries that were left out; the node is
// usable either way.
func (n NodeInfo) node() (*corev3.Node, error) {
	ip := n.IP
	if ip == "" {
		ip = defaultInstanceIP
	}
	fields := map[string]*structpb.Value{
		metaName:        structpb.NewStringValue(n.PodName),
		metaNamespace:   structpb.NewStringValue(n.PodNamespace),
		metaInstanceIPs: structpb.NewStringValue(ip),
		metaNodeName:    structpb.NewStringValue(n.NodeName),
	}
	for k, v := range n.Metadata {
		fields[k] = structpb.NewStringValue(v)
	}
	var errs []error
	for _, k := range slices.Sorted(maps.Keys(n.JSONMetadata)) {
		v, err := jsonValue(n.JSONMetadata[k])
		if err != nil {
			errs = append(errs, fmt.Errorf("xds: ISTIO_METAJSON_%s: %w", k, err))
			continue
		}
		fields[k] = v
	}
	return &corev3.Node{
		Id:       n.ID(),
		Metadata: &structpb.Struct{Fields: fields},
	}, errors.Join(errs...)
}

// jsonValue turns JSON text into a protobuf Value (numbers become doubles,
// as in upstream and in structpb).
func jsonValue(text string) (*structpb.Value, error) {
	var v any
	dec := json.NewDecoder(strings.NewReader(text))
	if err := dec.Decode(&v); err != nil {
		return nil, fmt.Errorf("invalid JSON: %w", err)
	}
	if dec.More() {
		return nil, errors.New("invalid JSON: trailing data after the value")
	}
	return structpb.NewValue(v)
}

// streamMetadata is the gRPC metadata for one stream: the XDS_HEADER_*
// headers, then the bearer token (read now, so that a rotated token file is
// picked up on every reconnect) and the cluster id.
func (c *Client) streamMetadata() (metadata.MD, error) {
	md := metadata.MD{}
	for k, v := range c.opts.Headers {
		k = strings.ToLower(k)
		if k == "" || strings.HasPrefix(k, ":") {
			return nil, fmt.Errorf("xds: header %q: not a valid gRPC metadata key", k)
		}
		md.Set(k, v)
	}
	if c.opts.Token == nil {
		return md, nil
	}
	tok, err := c.opts.Token()
	if err != nil {
		return nil, fmt.Errorf("xds: read token: %w", err)
	}
	tok = strings.TrimSpace(tok)
	if tok == "" {
		return nil, errors.New("xds: read token: token is empty")
	}
	md.Set(headerAuthorization, "Bearer "+tok)
	if c.opts.Node.ClusterID != "" {
		md.Set(headerClusterID, c.opts.Node.ClusterID)
	}
	return md, nil
}
