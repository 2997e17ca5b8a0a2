package interop

import (
	"fmt"
	"slices"

	"google.golang.org/protobuf/reflect/protoreflect"
)

// maxFillDepth stops the filler in a recursive message type. None of the
// three files has one today (the deepest path is about 5 levels), so reaching
// it is reported as an error rather than silently cutting the tree.
const maxFillDepth = 12

// filler sets every field of a message tree to deterministic, non-default
// values, using only the message's own reflection (so it fills Istio's Go
// types through Istio's generated code). For a real oneof it sets one
// member: member (variant mod members). Running variants 0..maxMembers-1
// therefore sets every member of every oneof at least once.
type filler struct {
	variant int
	n       int // bumped for every value, so no two values are equal

	// Filled by fill.
	set        map[protoreflect.FullName]bool // fields set in this variant
	branches   []string                       // "oneof=member" chosen, each once
	maxMembers int                            // largest real oneof seen
	tooDeep    []protoreflect.FullName        // fields skipped at maxFillDepth
}

func newFiller(variant int) *filler {
	return &filler{variant: variant, set: make(map[protoreflect.FullName]bool), maxMembers: 1}
}

// fill populates m (which must be empty).
func (f *filler) fill(m protoreflect.Message) { f.fillAt(m, 0) }

func (f *filler) fillAt(m protoreflect.Message, depth int) {
	md := m.Descriptor()
	for i := range md.Oneofs().Len() {
		o := md.Oneofs().Get(i)
		if !o.IsSynthetic() {
			f.maxMembers = max(f.maxMembers, o.Fields().Len())
			if b := fmt.Sprintf("%s=%s", o.Name(), f.member(o).Name()); !slices.Contains(f.branches, b) {
				f.branches = append(f.branches, b)
			}
		}
	}
	for i := range md.Fields().Len() {
		fd := md.Fields().Get(i)
		if o := fd.ContainingOneof(); o != nil && !o.IsSynthetic() && f.member(o) != fd {
			continue
		}
		if fd.Message() != nil && !fd.IsMap() && depth >= maxFillDepth {
			f.tooDeep = append(f.tooDeep, fd.FullName())
			continue
		}
		f.set[fd.FullName()] = true
		switch {
		case fd.IsMap():
			mp := m.Mutable(fd).Map()
			for range 2 {
				k := f.scalar(fd.MapKey()).MapKey()
				if fd.MapValue().Message() != nil {
					v := mp.NewValue()
					f.fillAt(v.Message(), depth+1)
					mp.Set(k, v)
				} else {
					mp.Set(k, f.scalar(fd.MapValue()))
				}
			}
		case fd.IsList():
			l := m.Mutable(fd).List()
			for range 2 {
				if fd.Message() != nil {
					v := l.NewElement()
					f.fillAt(v.Message(), depth+1)
					l.Append(v)
				} else {
					l.Append(f.scalar(fd))
				}
			}
		case fd.Message() != nil:
			// Mutable makes the field present even for a message with no
			// fields (SnapshotSent, google.protobuf.Empty).
			f.fillAt(m.Mutable(fd).Message(), depth+1)
		default:
			m.Set(fd, f.scalar(fd))
		}
	}
}

// member is the oneof member this variant sets.
func (f *filler) member(o protoreflect.OneofDescriptor) protoreflect.FieldDescriptor {
	return o.Fields().Get(f.variant % o.Fields().Len())
}

// scalar returns a fresh non-default value for a scalar field, map key or
// map value. Signed kinds get negative values so that 10-byte varints and
// zigzag encoding are exercised; unsigned ones get multi-byte varints.
func (f *filler) scalar(fd protoreflect.FieldDescriptor) protoreflect.Value {
	f.n++
	n := f.n
	switch fd.Kind() {
	case protoreflect.BoolKind:
		return protoreflect.ValueOfBool(true)
	case protoreflect.EnumKind:
		// A non-zero value when the enum has one (proto3 drops zero).
		vals := fd.Enum().Values()
		if vals.Len() == 1 {
			return protoreflect.ValueOfEnum(vals.Get(0).Number())
		}
		return protoreflect.ValueOfEnum(vals.Get(1 + n%(vals.Len()-1)).Number())
	case protoreflect.Int32Kind, protoreflect.Sint32Kind, protoreflect.Sfixed32Kind:
		return protoreflect.ValueOfInt32(int32(-1000 * n))
	case protoreflect.Int64Kind, protoreflect.Sint64Kind, protoreflect.Sfixed64Kind:
		return protoreflect.ValueOfInt64(int64(-1000000000000 * n))
	case protoreflect.Uint32Kind, protoreflect.Fixed32Kind:
		return protoreflect.ValueOfUint32(uint32(100000 + n))
	case protoreflect.Uint64Kind, protoreflect.Fixed64Kind:
		return protoreflect.ValueOfUint64(uint64(10000000000 + n))
	case protoreflect.FloatKind:
		return protoreflect.ValueOfFloat32(float32(n) + 0.5)
	case protoreflect.DoubleKind:
		return protoreflect.ValueOfFloat64(float64(n) + 0.25)
	case protoreflect.StringKind:
		return protoreflect.ValueOfString(fmt.Sprintf("%s-%d", fd.Name(), n))
	case protoreflect.BytesKind:
		// 4 bytes, the size of an IPv4 address, with a high byte set.
		return protoreflect.ValueOfBytes([]byte{10, byte(n >> 8), byte(n), 0xff})
	}
	panic(fmt.Sprintf("filler: field %s: kind %v not handled", fd.FullName(), fd.Kind()))
}

// reachable lists every field of every message type reachable from md,
// which is what the variants of a root must together set.
func reachable(md protoreflect.MessageDescriptor) map[protoreflect.FullName]bool {
	fields := make(map[protoreflect.FullName]bool)
	seen := make(map[protoreflect.FullName]bool)
	var walk func(protoreflect.MessageDescriptor)
	walk = func(md protoreflect.MessageDescriptor) {
		if seen[md.FullName()] {
			return
		}
		seen[md.FullName()] = true
		for i := range md.Fields().Len() {
			fd := md.Fields().Get(i)
			fields[fd.FullName()] = true
			if fd.IsMap() {
				if v := fd.MapValue().Message(); v != nil {
					walk(v)
				}
			} else if fd.Message() != nil {
				walk(fd.Message())
			}
		}
	}
	walk(md)
	return fields
}
