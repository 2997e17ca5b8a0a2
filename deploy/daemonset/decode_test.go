package daemonset

import (
	"encoding/json"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"sigs.k8s.io/yaml"
)

// This file holds the test's machinery: strict manifest decoding, the list
// of variables internal/config reads, the Dockerfile's final stage, and a
// stand-in for the container's filesystem. The checks are in
// manifests_test.go.

// kinds maps apiVersion/kind to a fresh typed object. A document of any
// other kind is an error, so a typo in apiVersion cannot slip past as
// "unknown, skipped".
var kinds = map[string]func() any{
	"apps/v1/DaemonSet":                               func() any { return new(appsv1.DaemonSet) },
	"v1/ServiceAccount":                               func() any { return new(corev1.ServiceAccount) },
	"v1/ConfigMap":                                    func() any { return new(corev1.ConfigMap) },
	"rbac.authorization.k8s.io/v1/ClusterRole":        func() any { return new(rbacv1.ClusterRole) },
	"rbac.authorization.k8s.io/v1/ClusterRoleBinding": func() any { return new(rbacv1.ClusterRoleBinding) },
	"rbac.authorization.k8s.io/v1/Role":               func() any { return new(rbacv1.Role) },
	"rbac.authorization.k8s.io/v1/RoleBinding":        func() any { return new(rbacv1.RoleBinding) },
}

type object struct {
	source string // file name and document index, for messages
	kind   string
	obj    any
}

var docSeparator = regexp.MustCompile(`(?m)^---[ \t]*$`)

// decodeDocuments splits a YAML stream and decodes each document into its
// Kubernetes type, rejecting unknown or duplicate fields and wrong types.
func decodeDocuments(name string, data []byte) ([]object, error) {
	var out []object
	for i, doc := range docSeparator.Split(string(data), -1) {
		if onlyComments(doc) {
			continue
		}
		src := fmt.Sprintf("%s#%d", name, i)
		var tm struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			return nil, fmt.Errorf("%s: %w", src, err)
		}
		if tm.APIVersion == "" || tm.Kind == "" {
			return nil, fmt.Errorf("%s: apiVersion and kind are required", src)
		}
		key := tm.APIVersion + "/" + tm.Kind
		mk, ok := kinds[key]
		if !ok {
			return nil, fmt.Errorf("%s: unsupported kind %s", src, key)
		}
		obj := mk()
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			return nil, fmt.Errorf("%s: %s: %w", src, key, err)
		}
		out = append(out, object{source: src, kind: key, obj: obj})
	}
	return out, nil
}

func onlyComments(doc string) bool {
	for _, line := range strings.Split(doc, "\n") {
		if l := strings.TrimSpace(line); l != "" && !strings.HasPrefix(l, "#") {
			return false
		}
	}
	return true
}

// bundle is the decoded directory: exactly one DaemonSet and one
// ServiceAccount, plus anything else a later change adds.
type bundle struct {
	ds *appsv1.DaemonSet
	sa *corev1.ServiceAccount
}

func loadBundle(dir string) (*bundle, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	sort.Strings(files)
	var b bundle
	var errs []error
	for _, f := range files {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		objs, err := decodeDocuments(filepath.Base(f), data)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		for _, o := range objs {
			switch v := o.obj.(type) {
			case *appsv1.DaemonSet:
				if b.ds != nil {
					errs = append(errs, fmt.Errorf("%s: a second DaemonSet", o.source))
				}
				b.ds = v
			case *corev1.ServiceAccount:
				if b.sa != nil {
					errs = append(errs, fmt.Errorf("%s: a second ServiceAccount", o.source))
				}
				b.sa = v
			}
		}
	}
	if b.ds == nil || b.sa == nil {
		errs = append(errs, fmt.Errorf("want one DaemonSet and one ServiceAccount among %v", files))
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return &b, nil
}

// envNames is what the binary reads: exact names, and prefixes such as
// ISTIO_META_ under which every name is read.
type envNames struct {
	exact    map[string]bool
	prefixes []string
}

func (n envNames) has(name string) bool {
	if n.exact[name] {
		return true
	}
	for _, p := range n.prefixes {
		if strings.HasPrefix(name, p) && len(name) > len(p) {
			return true
		}
	}
	return false
}

func (n *envNames) add(tok string) {
	if p, ok := strings.CutSuffix(tok, "*"); ok {
		n.prefixes = append(n.prefixes, p)
		return
	}
	if strings.HasSuffix(tok, "_") { // p.prefixed("XDS_HEADER_")
		n.prefixes = append(n.prefixes, tok)
		return
	}
	n.exact[tok] = true
}

var envName = regexp.MustCompile(`^[A-Z][A-Z0-9_]*$`)

// readNames lists the variable names internal/config passes to its parser
// (p.str("NAME", ...), p.prefixed("PREFIX_"), ...): what the code reads,
// whatever the documentation says.
func readNames(dir string) (envNames, error) {
	n := envNames{exact: map[string]bool{}}
	fset := token.NewFileSet()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		return n, err
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			return n, err
		}
		ast.Inspect(file, func(node ast.Node) bool {
			call, ok := node.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 {
				return true
			}
			sel, ok := call.Fun.(*ast.SelectorExpr)
			if !ok {
				return true
			}
			if recv, ok := sel.X.(*ast.Ident); !ok || recv.Name != "p" {
				return true
			}
			lit, ok := call.Args[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			if s, err := strconv.Unquote(lit.Value); err == nil && envName.MatchString(s) {
				n.add(s)
			}
			return true
		})
	}
	return n, nil
}

var docToken = regexp.MustCompile(`^[A-Z][A-Z0-9_]+\*?$`)

// documentedNames lists the names in the "Read ..." paragraphs of
// internal/config's package comment.
func documentedNames(docFile string) (envNames, error) {
	n := envNames{exact: map[string]bool{}}
	f, err := parser.ParseFile(token.NewFileSet(), docFile, nil, parser.ParseComments|parser.PackageClauseOnly)
	if err != nil {
		return n, err
	}
	if f.Doc == nil {
		return n, fmt.Errorf("%s: no package comment", docFile)
	}
	for _, para := range strings.Split(f.Doc.Text(), "\n\n") {
		if !strings.HasPrefix(para, "Read") {
			continue
		}
		for _, w := range strings.Fields(para) {
			w = strings.Trim(w, ",.;:()")
			if docToken.MatchString(w) {
				n.add(w)
			}
		}
	}
	return n, nil
}

// finalStage is what the Dockerfile's last stage sets.
type finalStage struct {
	workdir    string
	copyDests  []string
	entrypoint []string
	cmd        []string
}

func parseDockerfile(data []byte) (finalStage, error) {
	var st finalStage
	var lines []string
	var cur strings.Builder
	for _, raw := range strings.Split(string(data), "\n") {
		l := strings.TrimSpace(raw)
		if cur.Len() == 0 && (l == "" || strings.HasPrefix(l, "#")) {
			continue
		}
		if c, ok := strings.CutSuffix(l, "\\"); ok {
			cur.WriteString(c + " ")
			continue
		}
		cur.WriteString(l)
		lines = append(lines, cur.String())
		cur.Reset()
	}
	last := -1
	for i, l := range lines {
		if strings.HasPrefix(strings.ToUpper(l), "FROM ") {
			last = i
		}
	}
	if last < 0 {
		return st, errors.New("no FROM")
	}
	st.workdir = "/" // the default when no WORKDIR is given
	for _, l := range lines[last+1:] {
		instr, rest, _ := strings.Cut(l, " ")
		rest = strings.TrimSpace(rest)
		switch strings.ToUpper(instr) {
		case "WORKDIR":
			st.workdir = path.Join(st.workdir, rest)
		case "COPY":
			f := strings.Fields(rest)
			st.copyDests = append(st.copyDests, f[len(f)-1])
		case "ENTRYPOINT", "CMD":
			var v []string
			if err := json.Unmarshal([]byte(rest), &v); err != nil {
				return st, fmt.Errorf("%s must be exec form (a JSON array): %w", instr, err)
			}
			if strings.EqualFold(instr, "CMD") {
				st.cmd = v
			} else {
				st.entrypoint = v
			}
		}
	}
	return st, nil
}

// imageWorkdir is the container's working directory, against which
// ztunnel's relative default paths resolve; the Dockerfile check pins it.
const imageWorkdir = "/"

// containerPath resolves p as the process in the container would.
func containerPath(p string) string { return path.Join(imageWorkdir, p) }

// knownConfigMapKeys are the keys of the config maps the pod mounts, as their
// owners publish them: istiod writes its root certificate to every
// namespace under this key.
var knownConfigMapKeys = map[string][]string{
	"istio-ca-root-cert": {"root-cert.pem"},
}

// rootfs is a directory standing in for the container's filesystem: every
// volume mount made a directory, every file a volume projects written, each
// file remembered with where it came from.
type rootfs struct {
	dir    string
	origin map[string]string // container path → source description
}

func buildRootfs(root string, pod *corev1.PodSpec, c *corev1.Container) (*rootfs, error) {
	fs := &rootfs{dir: root, origin: map[string]string{}}
	vols := map[string]*corev1.Volume{}
	for i := range pod.Volumes {
		vols[pod.Volumes[i].Name] = &pod.Volumes[i]
	}
	for _, m := range c.VolumeMounts {
		v, ok := vols[m.Name]
		if !ok {
			return nil, fmt.Errorf("mount %s: no volume named %q", m.MountPath, m.Name)
		}
		if m.SubPath != "" || m.SubPathExpr != "" {
			return nil, fmt.Errorf("mount %s: subPath is not modelled by this test", m.MountPath)
		}
		if err := os.MkdirAll(filepath.Join(root, m.MountPath), 0o755); err != nil {
			return nil, err
		}
		var err error
		switch {
		case v.Projected != nil:
			for _, src := range v.Projected.Sources {
				switch {
				case src.ServiceAccountToken != nil:
					err = fs.write(path.Join(m.MountPath, src.ServiceAccountToken.Path),
						"serviceAccountToken audience="+src.ServiceAccountToken.Audience)
				case src.ConfigMap != nil:
					err = fs.configMap(m.MountPath, src.ConfigMap.Name, src.ConfigMap.Items)
				default:
					err = fmt.Errorf("mount %s: projected source not modelled by this test", m.MountPath)
				}
				if err != nil {
					break
				}
			}
		case v.ConfigMap != nil:
			err = fs.configMap(m.MountPath, v.ConfigMap.Name, v.ConfigMap.Items)
		case v.HostPath != nil, v.EmptyDir != nil:
			// A directory: already made.
		default:
			err = fmt.Errorf("mount %s: volume %q's type is not modelled by this test", m.MountPath, v.Name)
		}
		if err != nil {
			return nil, err
		}
	}
	return fs, nil
}

func (fs *rootfs) configMap(dir, name string, items []corev1.KeyToPath) error {
	if len(items) > 0 {
		for _, it := range items {
			if err := fs.write(path.Join(dir, it.Path), "configMap "+name+" key "+it.Key); err != nil {
				return err
			}
		}
		return nil
	}
	keys, ok := knownConfigMapKeys[name]
	if !ok {
		return fmt.Errorf("config map %q: keys unknown to this test", name)
	}
	for _, k := range keys {
		if err := fs.write(path.Join(dir, k), "configMap "+name+" key "+k); err != nil {
			return err
		}
	}
	return nil
}

func (fs *rootfs) write(p, origin string) error {
	full := filepath.Join(fs.dir, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		return err
	}
	fs.origin[path.Clean(p)] = origin
	return os.WriteFile(full, []byte(origin+"\n"), 0o644)
}

// mountFor returns the deepest mount containing the container path p and
// p's path relative to it.
func mountFor(c *corev1.Container, p string) (*corev1.VolumeMount, string, bool) {
	var best *corev1.VolumeMount
	rel := ""
	for i := range c.VolumeMounts {
		m := &c.VolumeMounts[i]
		r, err := filepath.Rel(m.MountPath, p)
		if err != nil || r == ".." || strings.HasPrefix(r, "../") {
			continue
		}
		if best == nil || len(m.MountPath) > len(best.MountPath) {
			best, rel = m, r
		}
	}
	return best, rel, best != nil
}

func volumeNamed(pod *corev1.PodSpec, name string) *corev1.Volume {
	for i := range pod.Volumes {
		if pod.Volumes[i].Name == name {
			return &pod.Volumes[i]
		}
	}
	return nil
}

// sampleFieldRef is the values the kubelet would give each downward-API
// field, for a pod of the DaemonSet in ds.
func sampleFieldRef(ds *appsv1.DaemonSet, fieldPath string) (string, error) {
	switch fieldPath {
	case "metadata.name":
		return ds.Name + "-x7k2p", nil
	case "metadata.namespace":
		return ds.Namespace, nil
	case "spec.nodeName":
		return "node-a", nil
	case "spec.serviceAccountName":
		return ds.Spec.Template.Spec.ServiceAccountName, nil
	case "status.podIP":
		return "10.244.1.5", nil
	}
	return "", fmt.Errorf("fieldRef %q not modelled by this test", fieldPath)
}

// resolveEnv is the container's environment as the kubelet builds it: the
// manifest's variables (downward-API fields filled in) plus the service
// variables every pod gets.
func resolveEnv(ds *appsv1.DaemonSet, c *corev1.Container) ([]string, error) {
	if len(c.EnvFrom) > 0 {
		return nil, errors.New("envFrom would hide variable names from this test")
	}
	env := []string{"KUBERNETES_SERVICE_HOST=10.96.0.1", "KUBERNETES_SERVICE_PORT=443"}
	for _, e := range c.Env {
		v := e.Value
		switch {
		case e.ValueFrom == nil:
			if strings.Contains(v, "$(") {
				return nil, fmt.Errorf("%s: $(VAR) expansion not modelled by this test", e.Name)
			}
		case e.ValueFrom.FieldRef != nil:
			var err error
			if v, err = sampleFieldRef(ds, e.ValueFrom.FieldRef.FieldPath); err != nil {
				return nil, fmt.Errorf("%s: %w", e.Name, err)
			}
		default:
			return nil, fmt.Errorf("%s: only literal values and fieldRef are modelled by this test", e.Name)
		}
		env = append(env, e.Name+"="+v)
	}
	return env, nil
}
