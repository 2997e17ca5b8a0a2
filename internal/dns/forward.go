package dns

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	mdns "github.com/miekg/dns"
)

// DialFunc opens a connection to an upstream resolver. In-pod it creates
// the socket inside the pod's netns with SO_MARK 0x539, so the pod's DNS
// capture rules (which skip that mark) do not send it back to us.
type DialFunc func(ctx context.Context, network, addr string) (net.Conn, error)

// ResolvConf is what ztunnel uses of a resolv.conf.
type ResolvConf struct {
	// Servers are "ip:53" entries of the nameserver lines, in order.
	Servers []string
	// Search is the search list (search or domain line).
	Search []string
}

// ReadResolvConf parses a resolv.conf (ztunnel reads /etc/resolv.conf of
// its own netns: the node's resolvers).
func ReadResolvConf(path string) (ResolvConf, error) {
	cc, err := mdns.ClientConfigFromFile(path)
	if err != nil {
		return ResolvConf{}, fmt.Errorf("dns: read resolv.conf: %w", err)
	}
	rc := ResolvConf{Search: cc.Search}
	for _, s := range cc.Servers {
		rc.Servers = append(rc.Servers, net.JoinHostPort(s, cc.Port))
	}
	return rc, nil
}

// forward sends req to the upstream resolvers in order until one answers,
// within the forward timeout: over UDP, then again over TCP if the UDP
// answer was truncated. SERVFAIL and REFUSED move on to the next resolver;
// each resolver left gets an equal share of the time left. The answer carries req's id. A forward that cannot
// start because too many are in flight fails at once (ReasonOverloaded).
func (r *Resolver) forward(ctx context.Context, dial DialFunc, req *mdns.Msg) (*mdns.Msg, error) {
	select {
	case r.slots <- struct{}{}:
		defer func() { <-r.slots }()
	default:
		return nil, &Error{Reason: ReasonOverloaded, Err: fmt.Errorf("%d forwards in flight", cap(r.slots))}
	}
	ups := r.opts.Upstreams
	if len(ups) == 0 {
		return nil, &Error{Reason: ReasonForwardError, Err: errors.New("no upstream resolver configured")}
	}
	ctx, cancel := context.WithTimeout(ctx, r.opts.ForwardTimeout)
	defer cancel()

	// A fresh id upstream: the client's id is its own business, and a
	// random one makes a spoofed answer harder to slip in.
	up := req.Copy()
	up.Id = mdns.Id()
	var errs []error
	var last *mdns.Msg // a SERVFAIL or REFUSED, kept in case no one does better
	for i, addr := range ups {
		// Each resolver left gets an equal share of the time left, so a dead
		// first resolver does not use up the whole budget.
		deadline, _ := ctx.Deadline()
		actx, acancel := context.WithTimeout(ctx, time.Until(deadline)/time.Duration(len(ups)-i))
		resp, err := exchange(actx, dial, "udp", addr, up)
		if err == nil && resp.Truncated {
			resp, err = exchange(actx, dial, "tcp", addr, up)
		}
		acancel()
		if err == nil && (resp.Rcode == mdns.RcodeServerFailure || resp.Rcode == mdns.RcodeRefused) && i < len(ups)-1 {
			// This resolver cannot help (down upstream, or not ours to
			// ask); the next one may, as glibc would try it.
			last = resp
			continue
		}
		if err == nil {
			resp.Id = req.Id
			return resp, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", addr, err))
		if ctx.Err() != nil {
			break
		}
	}
	if last != nil {
		last.Id = req.Id
		return last, nil
	}
	reason := ReasonForwardError
	if ctx.Err() != nil || isTimeout(errs) {
		reason = ReasonForwardTimeout
	}
	return nil, &Error{Reason: reason, Err: errors.Join(errs...)}
}

func isTimeout(errs []error) bool {
	for _, err := range errs {
		var ne net.Error
		if !errors.As(err, &ne) || !ne.Timeout() {
			return false
		}
	}
	return len(errs) > 0
}

// exchange does one query over a new connection, bounded by ctx (its
// deadline and its cancellation both end the wait).
func exchange(ctx context.Context, dial DialFunc, network, addr string, m *mdns.Msg) (*mdns.Msg, error) {
	conn, err := dial(ctx, network, addr)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	stop := context.AfterFunc(ctx, func() { conn.SetDeadline(time.Now()) })
	defer stop()
	c := &mdns.Client{Net: network}
	// Room for the largest answer upstream may send over UDP when the
	// client did not offer EDNS; a larger one comes back truncated and is
	// fetched again over TCP.
	c.UDPSize = mdns.DefaultMsgSize
	resp, _, err := c.ExchangeWithConnContext(ctx, m, &mdns.Conn{Conn: conn})
	if err != nil {
		return nil, err
	}
	if len(resp.Question) != len(m.Question) || (len(m.Question) == 1 && !strings.EqualFold(resp.Question[0].Name, m.Question[0].Name)) {
		return nil, errors.New("answer is for another question")
	}
	return resp, nil
}

// defaultDial dials from the current netns without a mark (tests).
func defaultDial(ctx context.Context, network, addr string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, network, addr)
}
