package xds

// Decoding of a local config's policies: upstream's serde form of
// rbac::Authorization (rules as three nested lists; StringMatch as a
// serde_yaml enum).

import (
	"net/netip"
	"strings"

	"google.golang.org/protobuf/types/known/emptypb"
	"gopkg.in/yaml.v3"

	"github.com/ztunnel-go/ztunnel/internal/xds/securitypb"
)

func (d *decoder) policy(n *yaml.Node, path string) (*securitypb.Authorization, error) {
	a := &securitypb.Authorization{}
	set := map[string]bool{}
	err := d.mapping(n, path, func(key string, v *yaml.Node, p string) error {
		set[key] = true
		var err error
		switch key {
		case "name":
			a.Name, err = d.str(v, p)
		case "namespace":
			a.Namespace, err = d.str(v, p)
		case "scope":
			var i int
			i, err = d.enum(v, p, "scope", "Global", "Namespace", "WorkloadSelector")
			a.Scope = securitypb.Scope(i)
		case "action":
			var i int
			i, err = d.enum(v, p, "action", "Allow", "Deny")
			a.Action = securitypb.Action(i)
		case "dryRun":
			a.DryRun, err = d.boolean(v, p)
		case "rules":
			a.Rules, err = d.rules(v, p)
		default:
			return errUnknownField
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	// scope and action are required: a forgotten scope must not silently
	// become Global, nor a forgotten action Allow.
	if err := d.require(n, path, set, "name", "namespace", "scope", "action"); err != nil {
		return nil, err
	}
	return a, nil
}

// rules reads rules as upstream writes them: a list (rules, OR) of lists
// (clauses, AND) of lists (matches, OR) of match objects.
func (d *decoder) rules(n *yaml.Node, path string) ([]*securitypb.Rule, error) {
	var rules []*securitypb.Rule
	err := d.seq(n, path, func(rn *yaml.Node, rp string) error {
		r := &securitypb.Rule{}
		rules = append(rules, r)
		return d.seq(rn, rp, func(cn *yaml.Node, cp string) error {
			c := &securitypb.Clause{}
			r.Clauses = append(r.Clauses, c)
			return d.seq(cn, cp, func(mn *yaml.Node, mp string) error {
				m, err := d.match(mn, mp)
				c.Matches = append(c.Matches, m)
				return err
			})
		})
	})
	return rules, err
}

func (d *decoder) match(n *yaml.Node, path string) (*securitypb.Match, error) {
	m := &securitypb.Match{}
	err := d.mapping(n, path, func(key string, v *yaml.Node, p string) error {
		var err error
		switch key {
		case "namespaces":
			m.Namespaces, err = d.stringMatches(v, p)
		case "notNamespaces":
			m.NotNamespaces, err = d.stringMatches(v, p)
		case "principals":
			m.Principals, err = d.stringMatches(v, p)
		case "notPrincipals":
			m.NotPrincipals, err = d.stringMatches(v, p)
		case "serviceAccounts":
			m.ServiceAccounts, err = d.serviceAccounts(v, p)
		case "notServiceAccounts":
			m.NotServiceAccounts, err = d.serviceAccounts(v, p)
		case "sourceIps":
			m.SourceIps, err = d.cidrs(v, p)
		case "notSourceIps":
			m.NotSourceIps, err = d.cidrs(v, p)
		case "destinationIps":
			m.DestinationIps, err = d.cidrs(v, p)
		case "notDestinationIps":
			m.NotDestinationIps, err = d.cidrs(v, p)
		case "destinationPorts":
			m.DestinationPorts, err = d.ports(v, p)
		case "notDestinationPorts":
			m.NotDestinationPorts, err = d.ports(v, p)
		default:
			return errUnknownField
		}
		return err
	})
	return m, err
}

func (d *decoder) ports(n *yaml.Node, path string) ([]uint32, error) {
	var out []uint32
	err := d.seq(n, path, func(item *yaml.Node, p string) error {
		v, err := d.port(item, p, false, false)
		out = append(out, v)
		return err
	})
	return out, err
}

func (d *decoder) cidrs(n *yaml.Node, path string) ([]*securitypb.Address, error) {
	var out []*securitypb.Address
	err := d.seq(n, path, func(item *yaml.Node, p string) error {
		pfx, err := d.prefix(item, p)
		out = append(out, &securitypb.Address{Address: pfx.Addr().AsSlice(), Length: uint32(pfx.Bits())})
		return err
	})
	return out, err
}

// prefix reads a CIDR such as "10.0.0.0/8"; a bare IP means that one
// address. Host bits are kept, as upstream keeps them.
func (d *decoder) prefix(n *yaml.Node, path string) (netip.Prefix, error) {
	s, err := d.str(n, path)
	if err != nil {
		return netip.Prefix{}, err
	}
	if p, err := netip.ParsePrefix(s); err == nil {
		return p, nil
	}
	if ip, err := netip.ParseAddr(s); err == nil && ip.Zone() == "" {
		return netip.PrefixFrom(ip, ip.BitLen()), nil
	}
	return netip.Prefix{}, d.errf(n, path, "%q: not a CIDR", s)
}

func (d *decoder) serviceAccounts(n *yaml.Node, path string) ([]*securitypb.ServiceAccountMatch, error) {
	var out []*securitypb.ServiceAccountMatch
	err := d.seq(n, path, func(item *yaml.Node, p string) error {
		sa := &securitypb.ServiceAccountMatch{}
		out = append(out, sa)
		return d.mapping(item, p, func(key string, v *yaml.Node, fp string) error {
			var err error
			switch key {
			case "namespace":
				sa.Namespace, err = d.str(v, fp)
			case "serviceAccount":
				sa.ServiceAccount, err = d.str(v, fp)
			default:
				return errUnknownField
			}
			return err
		})
	})
	return out, err
}

// stringMatches reads upstream's StringMatch enum in either form serde_yaml
// knows: a one-key mapping ({Exact: foo}, {Presence: []}) or a tagged value
// (!Exact foo, !Presence []).
func (d *decoder) stringMatches(n *yaml.Node, path string) ([]*securitypb.StringMatch, error) {
	var out []*securitypb.StringMatch
	err := d.seq(n, path, func(item *yaml.Node, p string) error {
		kind, val, tagged := strings.TrimPrefix(item.Tag, "!"), item, true
		if item.Kind == yaml.MappingNode && len(item.Content) == 2 {
			kind, val, tagged = item.Content[0].Value, item.Content[1], false
			p = join(p, kind)
		} else if !strings.HasPrefix(item.Tag, "!") || strings.HasPrefix(item.Tag, "!!") {
			return d.errf(item, p, "want one of Exact, Prefix, Suffix or Presence, got %s", describe(item))
		}
		sm := &securitypb.StringMatch{}
		out = append(out, sm)
		switch kind {
		case "Exact", "Prefix", "Suffix":
			s := val.Value
			if !tagged {
				var err error
				if s, err = d.str(val, p); err != nil {
					return err
				}
			} else if val.Kind != yaml.ScalarNode {
				return d.errf(val, p, "want a string, got %s", describe(val))
			}
			switch kind {
			case "Exact":
				sm.MatchType = &securitypb.StringMatch_Exact{Exact: s}
			case "Prefix":
				sm.MatchType = &securitypb.StringMatch_Prefix{Prefix: s}
			default:
				sm.MatchType = &securitypb.StringMatch_Suffix{Suffix: s}
			}
		case "Presence":
			if !(isNull(val) || len(val.Content) == 0 && val.Kind != yaml.ScalarNode || val.Kind == yaml.ScalarNode && val.Value == "") {
				return d.errf(val, p, "Presence takes no value, got %s", describe(val))
			}
			sm.MatchType = &securitypb.StringMatch_Presence{Presence: &emptypb.Empty{}}
		default:
			return d.errf(item, p, "unknown string match %q (want Exact, Prefix, Suffix or Presence)", kind)
		}
		return nil
	})
	return out, err
}
