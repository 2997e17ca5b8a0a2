package xds

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/types/known/structpb"
)

func TestNodeID(t *testing.T) {
	tests := []struct {
		name string
		node NodeInfo
		want string
	}{
		{name: "full", node: NodeInfo{IP: "10.244.0.5", PodName: "ztunnel-x7", PodNamespace: "istio-system"},
			want: "ztunnel~10.244.0.5~ztunnel-x7.istio-system~istio-system.svc.cluster.local"},
		{name: "no ip uses upstream placeholder", node: NodeInfo{PodName: "p", PodNamespace: "ns"},
			want: "ztunnel~1.1.1.1~p.ns~ns.svc.cluster.local"},
		{name: "custom domain", node: NodeInfo{IP: "fd00::5", PodName: "p", PodNamespace: "ns", Domain: "corp.example"},
			want: "ztunnel~fd00::5~p.ns~ns.svc.corp.example"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.node.ID(); got != tt.want {
				t.Fatalf("ID %q, want %q", got, tt.want)
			}
		})
	}
}

func TestNodeMetadata(t *testing.T) {
	n := NodeInfo{
		IP: "10.0.0.1", PodName: "zt", PodNamespace: "istio-system", NodeName: "worker-2",
		Metadata: map[string]string{"NAME": "override", "ENABLE_HBONE": "true"},
		JSONMetadata: map[string]string{
			"LABELS":  `{"app":"ztunnel","tier":1}`,
			"NAME":    `"json-wins"`,
			"BROKEN":  `{"a":`,
			"TRAILER": `1 2`,
		},
	}
	node, err := n.node()
	if err == nil || !strings.Contains(err.Error(), "ISTIO_METAJSON_BROKEN") || !strings.Contains(err.Error(), "ISTIO_METAJSON_TRAILER") {
		t.Fatalf("err %v, want both bad JSON entries named", err)
	}
	f := node.GetMetadata().GetFields()
	for k, want := range map[string]string{"NAMESPACE": "istio-system", "INSTANCE_IPS": "10.0.0.1", "NODE_NAME": "worker-2",
		"ENABLE_HBONE": "true", "NAME": "json-wins"} {
		if got := f[k].GetStringValue(); got != want {
			t.Errorf("%s = %q, want %q", k, got, want)
		}
	}
	labels := f["LABELS"].GetStructValue().GetFields()
	if labels["app"].GetStringValue() != "ztunnel" || labels["tier"].GetNumberValue() != 1 {
		t.Errorf("LABELS = %v", f["LABELS"])
	}
	for _, k := range []string{"BROKEN", "TRAILER"} {
		if _, ok := f[k]; ok {
			t.Errorf("invalid %s was sent", k)
		}
	}
	if _, ok := f["LABELS"].GetKind().(*structpb.Value_StructValue); !ok {
		t.Errorf("LABELS is not a struct")
	}
}

func TestStreamMetadata(t *testing.T) {
	tests := []struct {
		name    string
		opts    Options
		want    map[string][]string
		wantErr string
	}{
		{name: "no token, headers only", opts: Options{Headers: map[string]string{"X-Tenant": "a"}},
			want: map[string][]string{"x-tenant": {"a"}}},
		{name: "token and cluster id",
			opts: Options{Token: func() (string, error) { return " tok\n", nil }, Node: NodeInfo{ClusterID: "c1"}},
			want: map[string][]string{"authorization": {"Bearer tok"}, "clusterid": {"c1"}}},
		{name: "token overrides a header of the same name",
			opts: Options{Token: func() (string, error) { return "tok", nil }, Headers: map[string]string{"Authorization": "Basic x"}},
			want: map[string][]string{"authorization": {"Bearer tok"}}},
		{name: "token error", opts: Options{Token: func() (string, error) { return "", errors.New("no such file") }},
			wantErr: "xds: read token: no such file"},
		{name: "empty token", opts: Options{Token: func() (string, error) { return "\n", nil }},
			wantErr: "token is empty"},
		{name: "pseudo header", opts: Options{Headers: map[string]string{":authority": "x"}},
			wantErr: "not a valid gRPC metadata key"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := &Client{opts: tt.opts}
			md, err := c.streamMetadata()
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("err %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(md) != len(tt.want) {
				t.Fatalf("metadata %v, want %v", md, tt.want)
			}
			for k, v := range tt.want {
				if !slices.Equal(md.Get(k), v) {
					t.Errorf("%s = %q, want %q", k, md.Get(k), v)
				}
			}
		})
	}
}
