package xds

// The LOCAL_XDS_PATH loader: a YAML file in upstream ztunnel's LocalConfig
// shape (top-level workloads, services, policies) converted into the same
// protos istiod would send and handed to a Handler with Replace*, so that
// validation happens once, in the state package.

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"

	"gopkg.in/yaml.v3"

	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
	"github.com/ztunnel-go/ztunnel/internal/xds/workloadpb"
)

// maxLocalNodes bounds how many YAML nodes a local config may expand to, so
// that a file of nested aliases cannot make loading take unbounded time.
const maxLocalNodes = 1 << 20

// LoadError is one problem in a local config file. Error() reads
//
//	local config /path/x.yaml:12: workloads[0].workloadIps[1]: "1.2.3": not an IP address
type LoadError struct {
	File string
	// Line is 1-based; 0 when the problem concerns the whole file.
	Line int
	// Path locates the value, e.g. workloads[0].workloadIps[1]; "" for the
	// whole file.
	Path string
	Msg  string
	// Err is the underlying error when the Handler rejected the resource
	// (a *state.RejectError from the state package).
	Err error
}

func (e *LoadError) Error() string {
	loc := e.File
	if e.Line > 0 {
		loc += ":" + strconv.Itoa(e.Line)
	}
	if e.Path == "" {
		return "local config " + loc + ": " + e.Msg
	}
	return "local config " + loc + ": " + e.Path + ": " + e.Msg
}

func (e *LoadError) Unwrap() error { return e.Err }

// LoadFile reads the local config at path and applies it to h; see Load.
func LoadFile(path string, h Handler) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("local config: read: %w", err)
	}
	return Load(path, data, h)
}

// Load parses data (named name in errors) and, if it is well formed, makes
// it h's whole state with ReplaceAddresses and ReplaceAuthorizations. A
// structural problem (unknown field, bad IP, port out of range, unknown
// enum name, duplicate resource) is returned before h is called. Resources
// h rejects are returned as LoadErrors joined in file order; the rest were
// applied.
func Load(name string, data []byte, h Handler) error {
	cfg, err := parseLocal(name, data)
	if err != nil {
		return err
	}
	var errs []*LoadError
	for res, err := range h.ReplaceAddresses(cfg.addresses) {
		errs = append(errs, cfg.rejected(cfg.addressAt, res, err))
	}
	for res, err := range h.ReplaceAuthorizations(cfg.policies) {
		errs = append(errs, cfg.rejected(cfg.policyAt, res, err))
	}
	slices.SortFunc(errs, func(a, b *LoadError) int {
		return cmp.Or(cmp.Compare(a.Line, b.Line), cmp.Compare(a.Path, b.Path))
	})
	joined := make([]error, len(errs))
	for i, e := range errs {
		joined[i] = e
	}
	return errors.Join(joined...)
}

// localConfig is a parsed file: the resources by xDS name, and where each
// was defined so that a rejection can point at it.
type localConfig struct {
	file      string
	addresses map[string]*workloadpb.Address
	policies  map[string]*securitypb.Authorization
	addressAt map[string]position
	policyAt  map[string]position
}

type position struct {
	line int
	path string
}

func (c *localConfig) rejected(at map[string]position, name string, err error) *LoadError {
	p, ok := at[name]
	if !ok {
		p.path = strconv.Quote(name)
	}
	return &LoadError{File: c.file, Line: p.line, Path: p.path, Msg: err.Error(), Err: err}
}

func parseLocal(name string, data []byte) (*localConfig, error) {
	cfg := &localConfig{
		file:      name,
		addresses: map[string]*workloadpb.Address{},
		policies:  map[string]*securitypb.Authorization{},
		addressAt: map[string]position{},
		policyAt:  map[string]position{},
	}
	var doc, extra yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&doc); err != nil && err != io.EOF {
		return nil, &LoadError{File: name, Msg: err.Error()}
	}
	// Like upstream (serde_yaml), refuse a second document rather than
	// silently ignoring part of the file.
	if err := dec.Decode(&extra); err != io.EOF {
		return nil, &LoadError{File: name, Line: extra.Line, Msg: "more than one YAML document"}
	}
	if doc.Kind == 0 {
		return cfg, nil // empty file: empty state
	}
	d := &decoder{file: name, budget: maxLocalNodes}
	root := &doc
	if root.Kind == yaml.DocumentNode && len(root.Content) == 1 {
		root = root.Content[0]
	}
	err := d.mapping(root, "", func(key string, v *yaml.Node, path string) error {
		switch key {
		case "workloads":
			return d.seq(v, path, func(item *yaml.Node, p string) error {
				w, err := d.workload(item, p)
				if err != nil {
					return err
				}
				return cfg.addAddress(d, item, p, w.GetUid(), &workloadpb.Address{Type: &workloadpb.Address_Workload{Workload: w}})
			})
		case "services":
			return d.seq(v, path, func(item *yaml.Node, p string) error {
				s, err := d.service(item, p)
				if err != nil {
					return err
				}
				key := s.GetNamespace() + "/" + s.GetHostname()
				return cfg.addAddress(d, item, p, key, &workloadpb.Address{Type: &workloadpb.Address_Service{Service: s}})
			})
		case "policies":
			return d.seq(v, path, func(item *yaml.Node, p string) error {
				a, err := d.policy(item, p)
				if err != nil {
					return err
				}
				key := a.GetNamespace() + "/" + a.GetName()
				if prev, dup := cfg.policyAt[key]; dup {
					return d.errf(item, p, "duplicate policy %q (first at line %d)", key, prev.line)
				}
				cfg.policies[key] = a
				cfg.policyAt[key] = position{line: item.Line, path: p}
				return nil
			})
		}
		return errUnknownField
	})
	if err != nil {
		return nil, err
	}
	return cfg, nil
}

// addAddress records one workload or service; their names share one xDS
// namespace, so a uid equal to a service's "namespace/hostname" collides.
func (c *localConfig) addAddress(d *decoder, n *yaml.Node, path, name string, a *workloadpb.Address) error {
	if prev, dup := c.addressAt[name]; dup {
		return d.errf(n, path, "duplicate resource name %q (first at line %d)", name, prev.line)
	}
	c.addresses[name] = a
	c.addressAt[name] = position{line: n.Line, path: path}
	return nil
}

// decoder walks yaml.Nodes, reporting problems with file, line and path.
type decoder struct {
	file   string
	budget int
}

// errUnknownField is returned by a mapping callback for a key it does not
// know; mapping turns it into an error at the key.
var errUnknownField = errors.New("unknown field")

func (d *decoder) errf(n *yaml.Node, path, format string, args ...any) error {
	line := 0
	if n != nil {
		line = n.Line
	}
	return &LoadError{File: d.file, Line: line, Path: path, Msg: fmt.Sprintf(format, args...)}
}

// resolve follows aliases and charges the node budget.
func (d *decoder) resolve(n *yaml.Node, path string) (*yaml.Node, error) {
	for hops := 0; n.Kind == yaml.AliasNode; hops++ {
		if n.Alias == nil || hops > 100 {
			return nil, d.errf(n, path, "unresolvable alias")
		}
		n = n.Alias
	}
	if d.budget--; d.budget < 0 {
		return nil, d.errf(n, path, "config too large (more than %d nodes after alias expansion)", maxLocalNodes)
	}
	return n, nil
}

func isNull(n *yaml.Node) bool { return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" }

// describe names what a node is, for "want X, got Y" messages.
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a sequence"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!str":
			return "string " + strconv.Quote(n.Value)
		case "!!null":
			return "null"
		case "!!int", "!!float", "!!bool":
			return n.Value
		}
		return n.ShortTag() + " " + strconv.Quote(n.Value)
	}
	return "a " + n.ShortTag()
}

// mapping calls fn for each key of the mapping n (null counts as empty), with
// the value and its path. fn returns errUnknownField to reject a key.
func (d *decoder) mapping(n *yaml.Node, path string, fn func(key string, v *yaml.Node, path string) error) error {
	n, err := d.resolve(n, path)
	if err != nil {
		return err
	}
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		return d.errf(n, orRoot(path), "want a mapping, got %s", describe(n))
	}
	seen := make(map[string]bool, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, err := d.resolve(n.Content[i], path)
		if err != nil {
			return err
		}
		if k.Kind != yaml.ScalarNode {
			return d.errf(k, orRoot(path), "want a field name, got %s", describe(k))
		}
		if seen[k.Value] {
			return d.errf(k, orRoot(path), "duplicate field %q", k.Value)
		}
		seen[k.Value] = true
		if err := fn(k.Value, n.Content[i+1], join(path, k.Value)); err != nil {
			if errors.Is(err, errUnknownField) {
				return d.errf(k, orRoot(path), "unknown field %q", k.Value)
			}
			return err
		}
	}
	return nil
}

// entries is mapping for maps with arbitrary keys (ports, services): fn gets
// the key node too, and paths are path[key].
func (d *decoder) entries(n *yaml.Node, path string, fn func(k, v *yaml.Node, path string) error) error {
	n, err := d.resolve(n, path)
	if err != nil {
		return err
	}
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.MappingNode {
		return d.errf(n, path, "want a mapping, got %s", describe(n))
	}
	seen := make(map[string]bool, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, err := d.resolve(n.Content[i], path)
		if err != nil {
			return err
		}
		if k.Kind != yaml.ScalarNode {
			return d.errf(k, path, "want a scalar key, got %s", describe(k))
		}
		if seen[k.Value] {
			return d.errf(k, path, "duplicate key %q", k.Value)
		}
		seen[k.Value] = true
		if err := fn(k, n.Content[i+1], path+"["+strconv.Quote(k.Value)+"]"); err != nil {
			return err
		}
	}
	return nil
}

// seq calls fn for each item of the sequence n (null counts as empty).
func (d *decoder) seq(n *yaml.Node, path string, fn func(item *yaml.Node, path string) error) error {
	n, err := d.resolve(n, path)
	if err != nil {
		return err
	}
	if isNull(n) {
		return nil
	}
	if n.Kind != yaml.SequenceNode {
		return d.errf(n, path, "want a sequence, got %s", describe(n))
	}
	for i, item := range n.Content {
		item, err := d.resolve(item, path)
		if err != nil {
			return err
		}
		if err := fn(item, path+"["+strconv.Itoa(i)+"]"); err != nil {
			return err
		}
	}
	return nil
}

// str reads a string; null reads as "".
func (d *decoder) str(n *yaml.Node, path string) (string, error) {
	n, err := d.resolve(n, path)
	if err != nil {
		return "", err
	}
	if isNull(n) {
		return "", nil
	}
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!str" {
		return "", d.errf(n, path, "want a string, got %s", describe(n))
	}
	return n.Value, nil
}

func (d *decoder) strs(n *yaml.Node, path string) ([]string, error) {
	var out []string
	err := d.seq(n, path, func(item *yaml.Node, p string) error {
		s, err := d.str(item, p)
		out = append(out, s)
		return err
	})
	return out, err
}

func (d *decoder) boolean(n *yaml.Node, path string) (bool, error) {
	n, err := d.resolve(n, path)
	if err != nil {
		return false, err
	}
	var b bool
	if n.Kind != yaml.ScalarNode || n.ShortTag() != "!!bool" || n.Decode(&b) != nil {
		return false, d.errf(n, path, "want true or false, got %s", describe(n))
	}
	return b, nil
}

// uint reads a non-negative integer no larger than max. Keys of port maps
// may be written quoted, so strings of digits are accepted when quotedOK.
func (d *decoder) uint(n *yaml.Node, path string, max uint64, quotedOK bool) (uint64, error) {
	n, err := d.resolve(n, path)
	if err != nil {
		return 0, err
	}
	tag := n.ShortTag()
	if n.Kind != yaml.ScalarNode || !(tag == "!!int" || quotedOK && tag == "!!str") {
		return 0, d.errf(n, path, "want a number, got %s", describe(n))
	}
	v, err := strconv.ParseUint(n.Value, 0, 64)
	if err != nil || v > max {
		return 0, d.errf(n, path, "%s: want a number 0-%d", strconv.Quote(n.Value), max)
	}
	return v, nil
}

// port reads a port, 1-65535, or 0-65535 when zeroOK.
func (d *decoder) port(n *yaml.Node, path string, zeroOK, quotedOK bool) (uint32, error) {
	v, err := d.uint(n, path, 1<<32-1, quotedOK)
	if err != nil {
		return 0, err
	}
	lo := uint64(1)
	if zeroOK {
		lo = 0
	}
	if v < lo || v > 65535 {
		return 0, d.errf(n, path, "port %d out of range %d-65535", v, lo)
	}
	return uint32(v), nil
}

// enum reads a string that must be one of names (in the order listed for
// the error), returning its index.
func (d *decoder) enum(n *yaml.Node, path, what string, names ...string) (int, error) {
	s, err := d.str(n, path)
	if err != nil {
		return 0, err
	}
	if i := slices.Index(names, s); i >= 0 {
		return i, nil
	}
	want := names[0]
	for i, name := range names[1:] {
		if i == len(names)-2 {
			want += " or " + name
		} else {
			want += ", " + name
		}
	}
	return 0, d.errf(n, path, "unknown %s %q (want %s)", what, s, want)
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func orRoot(path string) string {
	if path == "" {
		return "(top level)"
	}
	return path
}
