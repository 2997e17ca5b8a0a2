package cniemu

import (
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/coreos/go-iptables/iptables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/ztunnel-go/ztunnel/internal/inpod"
)

// Values istio-cni uses for in-pod redirection (cni/pkg/config).
const (
	// Mark is what ztunnel puts on its own sockets in the pod (PACKET_MARK
	// 1337); the rules let such traffic through untouched.
	Mark     = 0x539
	MarkMask = 0xfff
	// ConnMark tags connections whose packets carried Mark on the way in, so
	// replies from the app are routed back to ztunnel's transparent sockets.
	ConnMark     = 0x111
	ConnMarkMask = 0xfff
	restoreMask  = 0xffffffff
	// RouteTable holds the "everything is local" route that delivers
	// ConnMark-ed replies to ztunnel.
	RouteTable = 100
	// rulePriority of the fwmark rule (istio: 32764).
	rulePriority = 32764

	OutboundPort      = 15001
	InboundPlainPort  = 15006
	InboundHBONEPort  = 15008
	DNSCapturePort    = 15053
	chainPrerouting   = "ISTIO_PRERT"
	chainOutput       = "ISTIO_OUTPUT"
	hostProbeSNATIPv4 = "169.254.7.127"
	hostProbeSNATIPv6 = "fd16:9254:7127:1337:ffff:ffff:ffff:ffff"
)

// RedirectOptions choose the optional parts of istio-cni's rules.
type RedirectOptions struct {
	// DNS also captures DNS (UDP and TCP 53 → 15053, ztunnel's DNS proxy)
	// with istio's conntrack zone rules, as istio-cni does when ambient DNS
	// capture is on (its default). Packets with Mark (ztunnel's forwards to
	// the real resolver) are left alone.
	DNS bool
	// IPv6 installs the same rules with ip6tables.
	IPv6 bool
}

// rule is one iptables rule; why says what it is for.
type rule struct {
	table, chain string
	spec         []string
	why          string
}

// inpodRules returns istio-cni's in-pod rules (AppendInpodRules, non-ingress
// mode, no virtual interfaces) for one IP family, in istio's order.
func inpodRules(opts RedirectOptions, v6 bool) []rule {
	mark := fmt.Sprintf("%#x/%#x", Mark, MarkMask)
	connmark := fmt.Sprintf("%#x/%#x", ConnMark, ConnMarkMask)
	lo, probe := "127.0.0.1/32", hostProbeSNATIPv4
	if v6 {
		lo, probe = "::1/128", hostProbeSNATIPv6
	}
	port := strconv.Itoa
	rs := []rule{
		{"mangle", "PREROUTING", []string{"-j", chainPrerouting},
			"jump to our chain, so cleanup is one flush"},
		{"mangle", "OUTPUT", []string{"-j", chainOutput},
			"jump to our chain"},
		{"nat", "OUTPUT", []string{"-j", chainOutput},
			"jump to our chain"},
	}
	if opts.DNS {
		rs = append(rs,
			rule{"raw", "PREROUTING", []string{"-j", chainPrerouting}, "jump to our chain (DNS conntrack zones)"},
			rule{"raw", "OUTPUT", []string{"-j", chainOutput}, "jump to our chain (DNS conntrack zones)"},
		)
	}
	rs = append(rs,
		rule{"nat", "PREROUTING", []string{"-j", chainPrerouting},
			"jump to our chain"},
		rule{"mangle", chainPrerouting, []string{"-m", "mark", "--mark", mark, "-j", "CONNMARK", "--set-xmark", connmark},
			"packets arriving with ztunnel's mark: remember it on the connection"},
		rule{"nat", chainPrerouting, []string{"-s", probe, "-p", "tcp", "-m", "tcp", "-j", "ACCEPT"},
			"kubelet health probes (SNATed to the probe address on the node) are not captured"},
		rule{"nat", chainOutput, []string{"-d", probe, "-p", "tcp", "-m", "tcp", "-j", "ACCEPT"},
			"nor are the replies to them"},
		rule{"nat", chainPrerouting, []string{"!", "-d", lo, "-p", "tcp", "!", "--dport", port(InboundHBONEPort),
			"-m", "mark", "!", "--mark", mark, "-j", "REDIRECT", "--to-ports", port(InboundPlainPort)},
			"inbound TCP not for localhost and not from ztunnel → inbound plaintext 15006; HBONE to 15008 goes straight to its listener"},
		rule{"mangle", chainOutput, []string{"-m", "connmark", "--mark", connmark, "-j", "CONNMARK", "--restore-mark",
			"--nfmask", fmt.Sprintf("%#x", restoreMask), "--ctmask", fmt.Sprintf("%#x", restoreMask)},
			"replies on such connections get the mark back, so the fwmark rule routes them to ztunnel"},
	)
	if opts.DNS {
		rs = append(rs,
			rule{"nat", chainOutput, []string{"!", "-o", "lo", "-p", "udp", "-m", "mark", "!", "--mark", mark,
				"-m", "udp", "--dport", "53", "-j", "REDIRECT", "--to-port", port(DNSCapturePort)},
				"UDP DNS to a non-local resolver → ztunnel's DNS proxy"},
			rule{"nat", chainOutput, []string{"!", "-d", lo, "-p", "tcp", "--dport", "53", "-m", "mark", "!", "--mark", mark,
				"-j", "REDIRECT", "--to-ports", port(DNSCapturePort)},
				"TCP DNS likewise"},
			rule{"raw", chainOutput, []string{"-p", "udp", "-m", "mark", "--mark", mark, "-m", "udp", "--dport", "53",
				"-j", "CT", "--zone", "1"},
				"ztunnel → upstream DNS in its own conntrack zone (istio#33469)"},
			rule{"raw", chainPrerouting, []string{"-p", "udp", "-m", "mark", "!", "--mark", mark, "-m", "udp", "--sport", "53",
				"-j", "CT", "--zone", "1"},
				"and the answers"},
		)
	}
	rs = append(rs,
		rule{"nat", chainOutput, []string{"-p", "tcp", "-m", "mark", "--mark", connmark, "-j", "ACCEPT"},
			"outbound packets of connections ztunnel accepted transparently: let them go"},
		rule{"nat", chainOutput, []string{"!", "-d", lo, "-o", "lo", "-j", "ACCEPT"},
			"the app calling itself by its pod IP (over lo) is not captured"},
		rule{"nat", chainOutput, []string{"!", "-d", lo, "-p", "tcp", "-m", "mark", "!", "--mark", mark,
			"-j", "REDIRECT", "--to-ports", port(OutboundPort)},
			"all other outbound TCP not from ztunnel → outbound 15001"},
	)
	return rs
}

// InstallRedirect installs istio-cni's in-pod redirection inside the netns
// at path (e.g. /var/run/netns/NAME): the iptables rules above plus the
// fwmark rule and local route of table 100. Re-running it replaces the rules.
func InstallRedirect(path string, opts RedirectOptions) error {
	ns, err := inpod.OpenNetns(path, inpod.NetnsOptions{})
	if err != nil {
		return fmt.Errorf("cniemu: install redirect: %w", err)
	}
	defer ns.Close()
	return installIn(ns, opts)
}

// InstallRedirectFD is InstallRedirect for a netns FD (the caller keeps it).
func InstallRedirectFD(fd int, opts RedirectOptions) error {
	d, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("cniemu: install redirect: dup fd: %w", err)
	}
	ns, err := inpod.NewNetns(d, inpod.NetnsOptions{})
	if err != nil {
		return fmt.Errorf("cniemu: install redirect: %w", err)
	}
	defer ns.Close()
	return installIn(ns, opts)
}

func installIn(ns *inpod.Netns, opts RedirectOptions) error {
	families := []iptables.Protocol{iptables.ProtocolIPv4}
	if opts.IPv6 {
		families = append(families, iptables.ProtocolIPv6)
	}
	// go-iptables runs the iptables binary; a child started from a thread
	// inside the pod netns runs inside it too.
	return ns.Do(func() error {
		for _, fam := range families {
			if err := installFamily(fam, opts); err != nil {
				return err
			}
		}
		return installRouting(opts.IPv6)
	})
}

func installFamily(fam iptables.Protocol, opts RedirectOptions) error {
	ipt, err := iptables.New(iptables.IPFamily(fam), iptables.Timeout(5))
	if err != nil {
		return fmt.Errorf("cniemu: iptables: %w", err)
	}
	tables := []string{"mangle", "nat"}
	if opts.DNS {
		tables = append(tables, "raw")
	}
	for _, t := range tables {
		for _, ch := range []string{chainPrerouting, chainOutput} {
			// ClearChain creates the chain or empties it, so reruns converge.
			if err := ipt.ClearChain(t, ch); err != nil {
				return fmt.Errorf("cniemu: iptables -t %s -N %s: %w", t, ch, err)
			}
		}
	}
	for _, r := range inpodRules(opts, fam == iptables.ProtocolIPv6) {
		var err error
		if r.chain == chainPrerouting || r.chain == chainOutput {
			err = ipt.Append(r.table, r.chain, r.spec...)
		} else {
			err = ipt.AppendUnique(r.table, r.chain, r.spec...) // the jumps: once only
		}
		if err != nil {
			return fmt.Errorf("cniemu: iptables -t %s -A %s (%s): %w", r.table, r.chain, r.why, err)
		}
	}
	return nil
}

// installRouting adds, inside the current (pod) netns:
//
//	ip rule add fwmark 0x111/0xfff pref 32764 lookup 100
//	ip route add local 0.0.0.0/0 dev lo table 100
//
// so packets of ConnMark-ed connections (replies to connections ztunnel
// made with a spoofed source) are delivered locally to ztunnel.
func installRouting(v6 bool) error {
	h, err := netlink.NewHandle()
	if err != nil {
		return fmt.Errorf("cniemu: netlink: %w", err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("cniemu: find lo: %w", err)
	}
	fams := []int{unix.AF_INET}
	if v6 {
		fams = append(fams, unix.AF_INET6)
	}
	for _, fam := range fams {
		r := netlink.NewRule()
		r.Family = fam
		r.Table = RouteTable
		r.Mark = ConnMark
		mask := uint32(ConnMarkMask)
		r.Mask = &mask
		r.Priority = rulePriority
		if err := h.RuleAdd(r); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("cniemu: ip rule add fwmark %#x: %w", ConnMark, err)
		}
		dst := &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}
		if fam == unix.AF_INET6 {
			dst = &net.IPNet{IP: net.IPv6zero, Mask: net.CIDRMask(0, 128)}
		}
		route := &netlink.Route{Dst: dst, Scope: netlink.SCOPE_HOST, Type: unix.RTN_LOCAL,
			Table: RouteTable, LinkIndex: lo.Attrs().Index}
		if err := h.RouteReplace(route); err != nil {
			return fmt.Errorf("cniemu: ip route add local %s dev lo table %d: %w", dst, RouteTable, err)
		}
	}
	return nil
}
