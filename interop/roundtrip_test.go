package interop

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/prototext"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"

	istioworkload "istio.io/istio/pkg/workloadapi"
	istiosecurity "istio.io/istio/pkg/workloadapi/security"
	istiozds "istio.io/istio/pkg/zdsapi"

	"github.com/ztunnel-go/ztunnel/internal/inpod/zdspb"
	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
	"github.com/ztunnel-go/ztunnel/internal/xds/workloadpb"
)

// rootType is a top-level message exchanged on the wire: its Istio Go type
// and ours.
type rootType struct {
	upstream func() proto.Message
	ours     func() proto.Message
	// vt: Istio generates vtprotobuf code for this file (workload and
	// authorization; not zds), which istiod uses to encode pushes.
	vt bool
}

// rootTypes are the messages that cross the wire: xDS resources from istiod
// and the ZDS messages of the CNI agent and ztunnel. Together they reach
// every message of the three files (TestRoundTripCoversEveryMessage).
func rootTypes() []rootType {
	return []rootType{
		{func() proto.Message { return &istioworkload.Address{} }, func() proto.Message { return &workloadpb.Address{} }, true},
		{func() proto.Message { return &istiosecurity.Authorization{} }, func() proto.Message { return &securitypb.Authorization{} }, true},
		{func() proto.Message { return &istiozds.ZdsHello{} }, func() proto.Message { return &zdspb.ZdsHello{} }, false},
		{func() proto.Message { return &istiozds.WorkloadRequest{} }, func() proto.Message { return &zdspb.WorkloadRequest{} }, false},
		{func() proto.Message { return &istiozds.WorkloadResponse{} }, func() proto.Message { return &zdspb.WorkloadResponse{} }, false},
	}
}

// vtStrictMarshaler is implemented by Istio's types when built with
// -tags=vtprotobuf, as istiod is (Makefile.core.mk STANDARD_TAGS).
type vtStrictMarshaler interface {
	MarshalVTStrict() ([]byte, error)
}

// encoder is one way Istio's Go code turns a message into bytes.
type encoder struct {
	name    string
	marshal func(proto.Message) ([]byte, error)
}

var (
	// encodeProto is istiod's fallback (protoconv with vtprotobuf off) and,
	// without Deterministic, what the CNI agent uses for ZDS.
	encodeProto = encoder{"proto", func(m proto.Message) ([]byte, error) {
		return proto.MarshalOptions{Deterministic: true}.Marshal(m)
	}}
	// encodeVTStrict is what istiod uses for pushes by default
	// (ENABLE_VTPROTOBUF=true).
	encodeVTStrict = encoder{"vtproto_strict", func(m proto.Message) ([]byte, error) {
		vt, ok := m.(vtStrictMarshaler)
		if !ok {
			return nil, fmt.Errorf("%T has no MarshalVTStrict: build with -tags=vtprotobuf (run.sh does)", m)
		}
		return vt.MarshalVTStrict()
	}}
)

// TestRoundTripThroughOurTypes sends fully populated Istio messages through
// our types and back (Istio encodes, as istiod and the CNI agent do), and
// fully populated messages of ours through Istio's types and back (what
// the CNI agent and istiod tooling would read from us).
func TestRoundTripThroughOurTypes(t *testing.T) {
	for _, rt := range rootTypes() {
		name := rt.upstream().ProtoReflect().Descriptor().Name()
		for variant, members := 0, 1; variant < members; variant++ {
			f := newFiller(variant)
			up := rt.upstream()
			f.fill(up.ProtoReflect())
			members = f.maxMembers
			for _, tb := range f.tooDeep {
				t.Errorf("%s: field %s not filled: deeper than %d levels", name, tb, maxFillDepth)
			}
			ours := rt.ours()
			newFiller(variant).fill(ours.ProtoReflect())

			caseName := fmt.Sprintf("%s/variant%d", name, variant)
			if len(f.branches) > 0 {
				caseName = fmt.Sprintf("%s/%s", name, strings.Join(f.branches, ","))
			}
			tests := []struct {
				name               string
				first, mid, second func() proto.Message
				enc                encoder
			}{
				{"istio_proto", func() proto.Message { return up }, rt.ours, rt.upstream, encodeProto},
				{"istio_vtproto_strict", func() proto.Message { return up }, rt.ours, rt.upstream, encodeVTStrict},
				{"ours_proto", func() proto.Message { return ours }, rt.upstream, rt.ours, encodeProto},
			}
			for _, tc := range tests {
				if tc.enc.name == encodeVTStrict.name && !rt.vt {
					continue // Istio has no vtprotobuf code for this file
				}
				t.Run(caseName+"/"+tc.name, func(t *testing.T) {
					roundTrip(t, tc.first(), tc.mid(), tc.second(), tc.enc)
				})
			}
		}
	}
}

// roundTrip encodes first with enc, decodes into mid (the other side's
// type), checks mid kept every field, re-encodes mid and decodes into back
// (a fresh message of first's type), which must equal first.
func roundTrip(t *testing.T, first, mid, back proto.Message, enc encoder) {
	t.Helper()
	wire, err := enc.marshal(first)
	if err != nil {
		t.Fatalf("%T %s marshal: %v", first, enc.name, err)
	}
	if err := proto.Unmarshal(wire, mid); err != nil {
		t.Fatalf("unmarshal %T's bytes into %T: %v", first, mid, err)
	}
	for _, u := range unknownFields(mid.ProtoReflect(), string(mid.ProtoReflect().Descriptor().Name())) {
		t.Errorf("%T kept unknown fields: %s", mid, u)
	}
	again, err := proto.MarshalOptions{Deterministic: true}.Marshal(mid)
	if err != nil {
		t.Fatalf("marshal %T: %v", mid, err)
	}
	if err := proto.Unmarshal(again, back); err != nil {
		t.Fatalf("unmarshal %T's bytes into %T: %v", mid, back, err)
	}
	if !proto.Equal(first, back) {
		t.Errorf("%T → %T → %T changed the message\noriginal: %s\nback:     %s",
			first, mid, back, prototext.Format(first), prototext.Format(back))
	}
	// Same schema, same deterministic encoder: the bytes must agree too
	// (this also catches kind mismatches that happen to round-trip, such as
	// int32 read as uint32).
	if want, err := encodeProto.marshal(first); err != nil {
		t.Fatalf("%T proto marshal: %v", first, err)
	} else if !bytes.Equal(want, again) {
		t.Errorf("%T's encoding differs from %T's of the same message\n%T: %x\n%T: %x", mid, first, first, want, mid, again)
	}
}

// unknownFields walks m and describes every unknown field it holds, with
// the path to it and the unknown field numbers.
func unknownFields(m protoreflect.Message, path string) []string {
	var out []string
	if u := m.GetUnknown(); len(u) > 0 {
		out = append(out, fmt.Sprintf("%s: field numbers %v (%d bytes)", path, unknownNumbers(u), len(u)))
	}
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		p := path + "." + string(fd.Name())
		switch {
		case fd.IsMap():
			if fd.MapValue().Message() != nil {
				v.Map().Range(func(k protoreflect.MapKey, mv protoreflect.Value) bool {
					out = append(out, unknownFields(mv.Message(), fmt.Sprintf("%s[%v]", p, k.Interface()))...)
					return true
				})
			}
		case fd.IsList():
			if fd.Message() != nil {
				for i := range v.List().Len() {
					out = append(out, unknownFields(v.List().Get(i).Message(), fmt.Sprintf("%s[%d]", p, i))...)
				}
			}
		case fd.Message() != nil:
			out = append(out, unknownFields(v.Message(), p)...)
		}
		return true
	})
	return out
}

// unknownNumbers lists the field numbers in raw unknown-field bytes.
func unknownNumbers(b []byte) []protowire.Number {
	var nums []protowire.Number
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return append(nums, -1)
		}
		b = b[n:]
		m := protowire.ConsumeFieldValue(num, typ, b)
		if m < 0 {
			return append(nums, -1)
		}
		b = b[m:]
		if !slices.Contains(nums, num) {
			nums = append(nums, num)
		}
	}
	return nums
}

// TestRoundTripCoversEveryMessage makes the round-trip test's claim
// checkable: the variants of the root types set every field of every
// message declared in Istio's three files.
func TestRoundTripCoversEveryMessage(t *testing.T) {
	want := make(map[protoreflect.FullName]bool)
	for _, p := range filePairs() {
		msgs, _ := collect(p.upstream)
		for _, md := range msgs {
			if md.IsMapEntry() {
				continue // its key and value are filled through the map field
			}
			for i := range md.Fields().Len() {
				want[md.Fields().Get(i).FullName()] = true
			}
		}
	}
	got := make(map[protoreflect.FullName]bool)
	for _, rt := range rootTypes() {
		md := rt.upstream().ProtoReflect().Descriptor()
		for variant, members := 0, 1; variant < members; variant++ {
			f := newFiller(variant)
			f.fill(rt.upstream().ProtoReflect())
			members = f.maxMembers
			maps.Copy(got, f.set)
		}
		for fd := range reachable(md) {
			if !got[fd] {
				t.Errorf("root %s: field %s is reachable but no variant sets it", md.FullName(), fd)
			}
		}
	}
	for _, fd := range slices.Sorted(maps.Keys(want)) {
		if !got[fd] {
			t.Errorf("field %s of Istio's protos is not covered by any root type; add a root", fd)
		}
	}
	t.Logf("%d fields of Istio's workload, authorization and zds protos set by the round-trip variants", len(want))
}

// TestUnknownFieldsDetected shows the unknown-field check can fail: Istio's
// bytes with an extra field appended, nested and at the top, are reported.
func TestUnknownFieldsDetected(t *testing.T) {
	up := &istioworkload.Address{Type: &istioworkload.Address_Workload{Workload: &istioworkload.Workload{Uid: "u"}}}
	wire, err := proto.Marshal(up)
	if err != nil {
		t.Fatal(err)
	}
	// Field 999 (varint 1) at the top level, and inside the workload.
	extra := protowire.AppendVarint(protowire.AppendTag(nil, 999, protowire.VarintType), 1)
	nested := protowire.AppendBytes(protowire.AppendTag(nil, 1, protowire.BytesType),
		append(protowire.AppendString(protowire.AppendTag(nil, 20, protowire.BytesType), "u"), extra...))
	tests := []struct {
		name string
		wire []byte
		want []string
	}{
		{"none", wire, nil},
		{"top level", append(slices.Clone(wire), extra...), []string{"Address: field numbers [999] (3 bytes)"}},
		{"nested", nested, []string{"Address.workload: field numbers [999] (3 bytes)"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var ours workloadpb.Address
			if err := proto.Unmarshal(tc.wire, &ours); err != nil {
				t.Fatal(err)
			}
			if got := unknownFields(ours.ProtoReflect(), "Address"); !slices.Equal(got, tc.want) {
				t.Errorf("unknownFields = %q, want %q", got, tc.want)
			}
		})
	}
}
