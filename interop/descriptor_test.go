package interop

import (
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"google.golang.org/protobuf/types/descriptorpb"

	istioworkload "istio.io/istio/pkg/workloadapi"
	istiosecurity "istio.io/istio/pkg/workloadapi/security"
	istiozds "istio.io/istio/pkg/zdsapi"

	"github.com/ztunnel-go/ztunnel/internal/inpod/zdspb"
	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
	"github.com/ztunnel-go/ztunnel/internal/xds/workloadpb"
)

// filePair is one upstream proto file and the file of ours that mirrors it.
// The descriptors come from the generated Go packages, not from the global
// registry (which holds only one of each conflicting pair; see doc.go).
type filePair struct {
	name     string
	upstream protoreflect.FileDescriptor
	ours     protoreflect.FileDescriptor
}

func filePairs() []filePair {
	return []filePair{
		{"workload.proto", istioworkload.File_workloadapi_workload_proto, workloadpb.File_workload_proto},
		{"authorization.proto", istiosecurity.File_workloadapi_security_authorization_proto, securitypb.File_authorization_proto},
		{"zds.proto", istiozds.File_zdsapi_zds_proto, zdspb.File_zds_proto},
	}
}

// knownRenames maps upstream full names (messages and fields) to ours where
// the two differ on purpose. istio/istio's Go copy of authorization.proto
// names the nesting of a policy's rules Group/Rules (field "groups"), while
// upstream ztunnel's own proto/authorization.proto, which ours follows, names
// the same messages Rule/Clause (field "rules", "clauses"). Numbers, kinds
// and structure are identical, so the wire is too; diffFiles still compares
// everything else about the renamed pairs. A rename that no longer applies
// fails the test, so that this table cannot go stale.
var knownRenames = map[protoreflect.FullName]protoreflect.FullName{
	"istio.security.Group":                "istio.security.Rule",
	"istio.security.Rules":                "istio.security.Clause",
	"istio.security.Authorization.groups": "istio.security.Authorization.rules",
	"istio.security.Group.rules":          "istio.security.Rule.clauses",
}

func TestDescriptorsMatchUpstream(t *testing.T) {
	applied := make(map[protoreflect.FullName]bool)
	for _, p := range filePairs() {
		t.Run(p.name, func(t *testing.T) {
			r := diffFiles(p.upstream, p.ours, knownRenames)
			for _, d := range r.diffs {
				t.Error(d)
			}
			for _, n := range r.renamed {
				applied[n] = true
				t.Logf("known rename (same wire): upstream %s is our %s", n, knownRenames[n])
			}
			if len(r.diffs) == 0 {
				msgs, enums := collect(p.upstream)
				t.Logf("%s: %d messages and %d enums match upstream %s",
					p.ours.Path(), len(msgs), len(enums), p.upstream.Path())
			}
		})
	}
	for _, n := range slices.Sorted(maps.Keys(knownRenames)) {
		if !applied[n] {
			t.Errorf("knownRenames: upstream %s → ours %s no longer applies; remove it", n, knownRenames[n])
		}
	}
}

// collect returns every message (nested ones and map entries included) and
// every enum declared in fd, by full name.
func collect(fd protoreflect.FileDescriptor) (map[protoreflect.FullName]protoreflect.MessageDescriptor, map[protoreflect.FullName]protoreflect.EnumDescriptor) {
	msgs := make(map[protoreflect.FullName]protoreflect.MessageDescriptor)
	enums := make(map[protoreflect.FullName]protoreflect.EnumDescriptor)
	addEnums := func(es protoreflect.EnumDescriptors) {
		for i := range es.Len() {
			enums[es.Get(i).FullName()] = es.Get(i)
		}
	}
	var addMsgs func(ms protoreflect.MessageDescriptors)
	addMsgs = func(ms protoreflect.MessageDescriptors) {
		for i := range ms.Len() {
			m := ms.Get(i)
			msgs[m.FullName()] = m
			addEnums(m.Enums())
			addMsgs(m.Messages())
		}
	}
	addEnums(fd.Enums())
	addMsgs(fd.Messages())
	return msgs, enums
}

// diffResult is what diffFiles found.
type diffResult struct {
	diffs   []string                // one sentence per difference, stable order
	renamed []protoreflect.FullName // renames keys that were used
}

// differ compares one upstream file with ours under a rename table.
type differ struct {
	renames map[protoreflect.FullName]protoreflect.FullName
	res     diffResult
}

func (x *differ) errorf(format string, args ...any) {
	x.res.diffs = append(x.res.diffs, fmt.Sprintf(format, args...))
}

// ours maps an upstream full name to the name ours uses for it.
func (x *differ) ours(n protoreflect.FullName) protoreflect.FullName {
	if r, ok := x.renames[n]; ok {
		if !slices.Contains(x.res.renamed, n) {
			x.res.renamed = append(x.res.renamed, n)
		}
		return r
	}
	return n
}

// diffFiles lists every difference between an upstream file and ours.
// Things present on one side only are differences in both directions: ours
// claims to mirror upstream exactly. renames (may be nil) lists the
// upstream names that ours spells differently on purpose.
func diffFiles(up, ours protoreflect.FileDescriptor, renames map[protoreflect.FullName]protoreflect.FullName) diffResult {
	x := &differ{renames: renames}
	if up.Package() != ours.Package() {
		x.errorf("package: upstream %q, ours %q", up.Package(), ours.Package())
	}
	if up.Syntax() != ours.Syntax() {
		x.errorf("syntax: upstream %v, ours %v", up.Syntax(), ours.Syntax())
	}
	upMsgs, upEnums := collect(up)
	ourMsgs, ourEnums := collect(ours)
	matched := make(map[protoreflect.FullName]bool)
	for _, n := range slices.Sorted(maps.Keys(upMsgs)) {
		on := x.ours(n)
		o := ourMsgs[on]
		if o == nil {
			x.errorf("message %s: upstream has it (fields %s), ours does not", n, fieldList(upMsgs[n]))
			continue
		}
		matched[on] = true
		x.diffMessage(upMsgs[n], o)
	}
	for _, n := range slices.Sorted(maps.Keys(ourMsgs)) {
		if !matched[n] {
			x.errorf("message %s: ours has it (fields %s), upstream does not", n, fieldList(ourMsgs[n]))
		}
	}
	for _, n := range unionKeys(upEnums, ourEnums) {
		u, o := upEnums[n], ourEnums[n]
		switch {
		case o == nil:
			x.errorf("enum %s: upstream has it, ours does not", n)
		case u == nil:
			x.errorf("enum %s: ours has it, upstream does not", n)
		default:
			x.diffEnum(u, o)
		}
	}
	return x.res
}

func unionKeys[V any](a, b map[protoreflect.FullName]V) []protoreflect.FullName {
	keys := slices.Collect(maps.Keys(a))
	for k := range b {
		if _, ok := a[k]; !ok {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

// fieldList renders a message's fields as "name=number, ..." for messages
// that exist on one side only.
func fieldList(m protoreflect.MessageDescriptor) string {
	s := "["
	for i := range m.Fields().Len() {
		f := m.Fields().Get(i)
		if i > 0 {
			s += ", "
		}
		s += fmt.Sprintf("%s=%d", f.Name(), f.Number())
	}
	return s + "]"
}

func (x *differ) diffMessage(up, ours protoreflect.MessageDescriptor) {
	if up.IsMapEntry() != ours.IsMapEntry() {
		x.errorf("message %s: map entry upstream %v, ours %v", up.FullName(), up.IsMapEntry(), ours.IsMapEntry())
	}
	uf, of := up.Fields(), ours.Fields()
	for i := range uf.Len() {
		u := uf.Get(i)
		o := of.ByNumber(u.Number())
		if o == nil {
			x.errorf("field %s = %d (%s): upstream has it, ours has no field %d", u.FullName(), u.Number(), describeField(u), u.Number())
			continue
		}
		x.diffField(u, o)
	}
	for i := range of.Len() {
		o := of.Get(i)
		if uf.ByNumber(o.Number()) == nil {
			x.errorf("field %s = %d (%s): ours has it, upstream has no field %d", o.FullName(), o.Number(), describeField(o), o.Number())
		}
	}
	// Oneofs are compared through their fields above; a oneof with no
	// fields cannot exist, so only the names are left to compare.
	uo, oo := oneofNames(up), oneofNames(ours)
	if !slices.Equal(uo, oo) {
		x.errorf("message %s: oneofs upstream %q, ours %q", up.FullName(), uo, oo)
	}
	// Reserved numbers and names do not change the wire, but keeping them
	// stops a later edit of ours from reusing a number upstream retired.
	if u, o := reservedOf(up), reservedOf(ours); u != o {
		x.errorf("message %s: reserved upstream %s, ours %s", up.FullName(), u, o)
	}
}

// reservedOf renders a message's reserved ranges and names.
func reservedOf(m protoreflect.MessageDescriptor) string {
	var s []string
	for i := range m.ReservedRanges().Len() {
		r := m.ReservedRanges().Get(i)
		s = append(s, fmt.Sprintf("%d-%d", r[0], r[1]-1))
	}
	for i := range m.ReservedNames().Len() {
		s = append(s, strconv.Quote(string(m.ReservedNames().Get(i))))
	}
	return "[" + strings.Join(s, " ") + "]"
}

func oneofNames(m protoreflect.MessageDescriptor) []string {
	var s []string
	for i := range m.Oneofs().Len() {
		o := m.Oneofs().Get(i)
		name := string(o.Name())
		if o.IsSynthetic() {
			name += " (synthetic)"
		}
		s = append(s, name)
	}
	slices.Sort(s)
	return s
}

// describeField is a one-line rendering of everything diffField compares.
func describeField(f protoreflect.FieldDescriptor) string {
	s := fmt.Sprintf("%s %s %s", f.Cardinality(), f.Kind(), f.Name())
	if t := typeName(f); t != "" {
		s += " of " + string(t)
	}
	if o := oneofOf(f); o != "" {
		s += " in oneof " + o
	}
	return s
}

// typeName is the message or enum type a field refers to, "" for scalars.
func typeName(f protoreflect.FieldDescriptor) protoreflect.FullName {
	switch {
	case f.Message() != nil:
		return f.Message().FullName()
	case f.Enum() != nil:
		return f.Enum().FullName()
	}
	return ""
}

// oneofOf names the oneof holding f, marking proto3 optional's synthetic
// oneofs, or "" if none.
func oneofOf(f protoreflect.FieldDescriptor) string {
	o := f.ContainingOneof()
	if o == nil {
		return ""
	}
	if o.IsSynthetic() {
		return string(o.Name()) + " (synthetic: proto3 optional)"
	}
	return string(o.Name())
}

func (x *differ) diffField(up, ours protoreflect.FieldDescriptor) {
	cmp := func(what string, u, o any) {
		if u != o {
			x.errorf("field %s = %d: %s upstream %v, ours %v", up.FullName(), up.Number(), what, u, o)
		}
	}
	wantName, wantJSON := up.Name(), up.JSONName()
	if r := x.ours(up.FullName()); r != up.FullName() {
		wantName, wantJSON = r.Name(), jsonCamel(string(r.Name()))
	}
	var wantType protoreflect.FullName
	if t := typeName(up); t != "" {
		wantType = x.ours(t)
	}
	cmp("name", wantName, ours.Name())
	cmp("JSON name", wantJSON, ours.JSONName())
	cmp("kind", up.Kind(), ours.Kind())
	cmp("cardinality", up.Cardinality(), ours.Cardinality())
	cmp("type", wantType, typeName(ours))
	cmp("oneof", oneofOf(up), oneofOf(ours))
	cmp("presence", up.HasPresence(), ours.HasPresence())
	cmp("packed", up.IsPacked(), ours.IsPacked())
	cmp("map", up.IsMap(), ours.IsMap())
}

// jsonCamel is protoc's default JSON name of a field name (only used for
// renamed fields, whose JSON name upstream cannot tell us).
func jsonCamel(s string) string {
	var b strings.Builder
	up := false
	for _, c := range s {
		switch {
		case c == '_':
			up = true
		case up && 'a' <= c && c <= 'z':
			b.WriteRune(c - 'a' + 'A')
			up = false
		default:
			b.WriteRune(c)
			up = false
		}
	}
	return b.String()
}

func (x *differ) diffEnum(up, ours protoreflect.EnumDescriptor) {
	uv, ov := up.Values(), ours.Values()
	for i := range uv.Len() {
		u := uv.Get(i)
		switch o := ov.ByName(u.Name()); {
		case o == nil:
			x.errorf("enum value %s = %d: upstream has it, ours does not", u.FullName(), u.Number())
		case o.Number() != u.Number():
			x.errorf("enum value %s: upstream %d, ours %d", u.FullName(), u.Number(), o.Number())
		}
	}
	for i := range ov.Len() {
		o := ov.Get(i)
		if uv.ByName(o.Name()) == nil {
			x.errorf("enum value %s = %d: ours has it, upstream does not", o.FullName(), o.Number())
		}
	}
}

// TestDiffFilesDetects shows that diffFiles can fail: each case changes one
// thing in a copy of Istio's zds.proto descriptor and expects it reported.
func TestDiffFilesDetects(t *testing.T) {
	msg := func(fdp *descriptorpb.FileDescriptorProto, name string) *descriptorpb.DescriptorProto {
		for _, m := range fdp.GetMessageType() {
			if m.GetName() == name {
				return m
			}
		}
		t.Fatalf("no message %s in %s", name, fdp.GetName())
		return nil
	}
	field := func(m *descriptorpb.DescriptorProto, name string) *descriptorpb.FieldDescriptorProto {
		for _, f := range m.GetField() {
			if f.GetName() == name {
				return f
			}
		}
		t.Fatalf("no field %s in %s", name, m.GetName())
		return nil
	}
	tests := []struct {
		name    string
		mutate  func(*descriptorpb.FileDescriptorProto)
		renames map[protoreflect.FullName]protoreflect.FullName
		want    []string // substrings, each of which some reported difference must contain
	}{
		{"unchanged", func(*descriptorpb.FileDescriptorProto) {}, nil, nil},
		{"field renumbered", func(f *descriptorpb.FileDescriptorProto) {
			field(msg(f, "AddWorkload"), "uid").Number = proto.Int32(7)
		}, nil, []string{"AddWorkload.uid = 1 (optional string uid): upstream has it, ours has no field 1",
			"AddWorkload.uid = 7 (optional string uid): ours has it, upstream has no field 7"}},
		{"field renamed", func(f *descriptorpb.FileDescriptorProto) {
			field(msg(f, "WorkloadInfo"), "name").Name = proto.String("nom")
		}, nil, []string{"WorkloadInfo.name = 1: name upstream name, ours nom"}},
		{"JSON name changed", func(f *descriptorpb.FileDescriptorProto) {
			field(msg(f, "WorkloadInfo"), "service_account").JsonName = proto.String("sa")
		}, nil, []string{"WorkloadInfo.service_account = 3: JSON name upstream serviceAccount, ours sa"}},
		{"kind changed", func(f *descriptorpb.FileDescriptorProto) {
			field(msg(f, "Ack"), "error").Type = descriptorpb.FieldDescriptorProto_TYPE_BYTES.Enum()
		}, nil, []string{"Ack.error = 1: kind upstream string, ours bytes"}},
		{"made repeated", func(f *descriptorpb.FileDescriptorProto) {
			field(msg(f, "KeepWorkload"), "uid").Label = descriptorpb.FieldDescriptorProto_LABEL_REPEATED.Enum()
		}, nil, []string{"KeepWorkload.uid = 1: cardinality upstream optional, ours repeated"}},
		{"moved out of oneof", func(f *descriptorpb.FileDescriptorProto) {
			// The last declared member: oneof members must stay consecutive.
			field(msg(f, "WorkloadRequest"), "snapshot_sent").OneofIndex = nil
		}, nil, []string{"WorkloadRequest.snapshot_sent = 3: oneof upstream payload, ours "}},
		{"other message type", func(f *descriptorpb.FileDescriptorProto) {
			field(msg(f, "WorkloadRequest"), "keep").TypeName = proto.String(".istio.workload.zds.DelWorkload")
		}, nil, []string{"WorkloadRequest.keep = 5: type upstream istio.workload.zds.KeepWorkload, ours istio.workload.zds.DelWorkload"}},
		{"enum value renumbered", func(f *descriptorpb.FileDescriptorProto) {
			f.GetEnumType()[0].GetValue()[1].Number = proto.Int32(2)
		}, nil, []string{"enum value istio.workload.zds.V1: upstream 1, ours 2"}},
		{"enum value added", func(f *descriptorpb.FileDescriptorProto) {
			e := f.GetEnumType()[0]
			e.Value = append(e.Value, &descriptorpb.EnumValueDescriptorProto{Name: proto.String("V9"), Number: proto.Int32(9)})
		}, nil, []string{"enum value istio.workload.zds.V9 = 9: ours has it, upstream does not"}},
		{"message missing", func(f *descriptorpb.FileDescriptorProto) {
			f.MessageType = slices.DeleteFunc(f.MessageType, func(m *descriptorpb.DescriptorProto) bool { return m.GetName() == "ZdsHello" })
		}, nil, []string{"message istio.workload.zds.ZdsHello: upstream has it (fields [version=1]), ours does not"}},
		{"message added", func(f *descriptorpb.FileDescriptorProto) {
			f.MessageType = append(f.MessageType, &descriptorpb.DescriptorProto{Name: proto.String("Extra")})
		}, nil, []string{"message istio.workload.zds.Extra: ours has it (fields []), upstream does not"}},
		{"package changed", func(f *descriptorpb.FileDescriptorProto) {
			f.Package = proto.String("istio.zds")
			for _, m := range f.GetMessageType() {
				for _, fl := range m.GetField() {
					if fl.TypeName != nil {
						fl.TypeName = proto.String(strings.Replace(fl.GetTypeName(), ".istio.workload.zds.", ".istio.zds.", 1))
					}
				}
			}
		}, nil, []string{`package: upstream "istio.workload.zds", ours "istio.zds"`,
			"message istio.workload.zds.Ack: upstream has it"}},
		{"reserved dropped", func(f *descriptorpb.FileDescriptorProto) {
			m := msg(f, "WorkloadInfo")
			m.ReservedName, m.ReservedRange = nil, nil
		}, nil, []string{`message istio.workload.zds.WorkloadInfo: reserved upstream [4-4 "trust_domain"], ours []`}},
		{"renamed message and field, declared", renameAck, map[protoreflect.FullName]protoreflect.FullName{
			"istio.workload.zds.Ack":                  "istio.workload.zds.Reply",
			"istio.workload.zds.WorkloadResponse.ack": "istio.workload.zds.WorkloadResponse.reply",
		}, nil},
		{"renamed message and field, undeclared", renameAck, nil, []string{
			"WorkloadResponse.ack = 1: name upstream ack, ours reply",
			"WorkloadResponse.ack = 1: type upstream istio.workload.zds.Ack, ours istio.workload.zds.Reply",
			"message istio.workload.zds.Ack: upstream has it",
			"message istio.workload.zds.Reply: ours has it"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			fdp := protodesc.ToFileDescriptorProto(istiozds.File_zdsapi_zds_proto)
			tc.mutate(fdp)
			mutated, err := protodesc.NewFile(fdp, protoregistry.GlobalFiles)
			if err != nil {
				t.Fatalf("build mutated descriptor: %v", err)
			}
			diffs := diffFiles(istiozds.File_zdsapi_zds_proto, mutated, tc.renames).diffs
			if len(tc.want) == 0 && len(diffs) != 0 {
				t.Fatalf("unexpected differences: %q", diffs)
			}
			for _, w := range tc.want {
				if !slices.ContainsFunc(diffs, func(d string) bool { return strings.Contains(d, w) }) {
					t.Errorf("no difference contains %q; got %q", w, diffs)
				}
			}
		})
	}
}

// renameAck renames zds Ack to Reply and WorkloadResponse.ack to reply.
func renameAck(f *descriptorpb.FileDescriptorProto) {
	for _, m := range f.GetMessageType() {
		if m.GetName() == "Ack" {
			m.Name = proto.String("Reply")
		}
		for _, fl := range m.GetField() {
			if fl.GetTypeName() == ".istio.workload.zds.Ack" {
				fl.TypeName = proto.String(".istio.workload.zds.Reply")
				fl.Name, fl.JsonName = proto.String("reply"), proto.String("reply")
			}
		}
	}
}
