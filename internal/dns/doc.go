// Package dns is ztunnel's DNS proxy (work in progress; see issue #12).
package dns

import _ "github.com/miekg/dns"
