// Package rbac compiles istio.security.Authorization resources (the L4
// authorization policies istiod sends to ztunnel) into immutable [Policy]
// values and decides, with the pure function [Evaluate], whether one
// connection may reach a destination workload.
//
// The package owns only matching and the allow/deny decision. It does not
// select which policies apply to a workload: the state package does that
// (namespace- and global-scoped policies plus the ones the workload lists by
// name; [Policy.Selects] answers the scope half) and hands the result to
// Evaluate. It reads no environment variables, exports no metrics, starts no
// goroutines and logs nothing: callers log [Decision] (including dry-run
// outcomes) and may count [CompileReason] and [Reason] values, which are
// stable, short and label-safe.
//
// # Matching (as upstream ztunnel, src/rbac.rs)
//
// A policy matches when any of its rules matches (rules are OR'ed); a rule
// matches when all of its clauses match (AND); a clause matches when any of
// its matches matches (OR); a match matches when every non-empty field holds
// (AND), where a field holds when the attribute is in its list (OR) and a
// not_ field holds when the attribute is in none of its entries. A policy
// with no rules matches nothing; a rule with no clauses and a clause with no
// matches match everything.
//
// Attributes: namespaces match the peer identity's namespace ("" for a
// plaintext peer, so exact "" matches plaintext and presence does not);
// principals match the peer SPIFFE id with its "spiffe://" prefix removed,
// and never match a plaintext peer (so not_principals always holds for one);
// service_accounts compare namespace and service account (trust domain
// ignored) and never match a plaintext peer; source/destination IPs are CIDRs
// (an Address of 4 or 16 bytes and a prefix length, length 0 meaning the
// whole address family); destination ports compare the real destination
// port. Connection addresses are compared in canonical form (IPv4-mapped IPv6
// unmapped, zone dropped), as upstream's listeners canonicalize them; a
// 16-byte v4-mapped CIDR is an IPv6 prefix and never matches IPv4 traffic,
// as upstream.
//
// # Decision (as upstream ztunnel, DemandProxyState::assert_rbac)
//
//  1. Dry-run DENY policies are evaluated and matches reported.
//  2. Any enforced DENY that matches denies.
//  3. Dry-run ALLOW policies are evaluated and matches reported.
//  4. No enforced ALLOW policy: allow.
//  5. Any enforced ALLOW that matches allows; otherwise deny.
//
// Dry-run policies never change the outcome.
//
// # Fail closed (deliberately stricter than upstream)
//
// Some conditions cannot be evaluated at L4: Match.extensions, proto fields
// this build does not know (kept by proto3 as unknown fields) on a Rule,
// Clause, Match, StringMatch, ServiceAccountMatch or Address, a StringMatch
// without a match type, and a Match with no conditions at all — which is
// what istiod sends for a rule whose only conditions were HTTP attributes
// (methods, paths, requestPrincipals, non-L4 "when" keys). Every such
// condition is resolved in the direction that denies more: in a DENY policy
// it is assumed to hold, in an ALLOW policy it is assumed not to. Because the
// rule/clause/match tree is monotone, that can only turn a DENY into "matches
// more" and an ALLOW into "matches less". Concretely:
//
//   - DENY, Match without conditions or with only extensions: matches every
//     connection (upstream skips the Match, so an L7-only DENY denies
//     nothing; see istio/istio#61126).
//   - DENY, extensions or unknown fields beside L4 fields: the L4 fields
//     still apply ("enforced without the HTTP rules", as istiod's status says).
//   - DENY, unevaluable entry in a positive list: the field holds; in a not_
//     list: the entry is ignored.
//   - ALLOW, any unevaluable condition in a Match: that Match never matches;
//     an unevaluable entry in a positive list is ignored, and a list left
//     empty by that never matches.
//   - Unknown fields on a Clause or Rule: it holds in a DENY, fails in an
//     ALLOW.
//
// [Policy.Unevaluable] lists what was resolved this way, for the caller to
// log once per policy. Extensions and unknown fields on the Authorization
// itself are not conditions and are ignored, as upstream.
//
// # Rejected input
//
// Compile reports, with a [*CompileError], what is malformed rather than
// unknown: an Address that is not 4 or 16 bytes, a prefix length beyond the
// address size, a port above 65535, and Scope or Action numbers outside the
// enum. Upstream silently drops such IP entries and truncates such ports,
// which can widen an ALLOW. A malformed list entry comes back with the
// error and a fail-closed Policy in which the entry is unevaluable (as
// above), so a caller that NACKs the resource can still enforce it: skipping
// a new DENY because one CIDR is bad would fail open. A malformed Scope or
// Action returns no Policy: which way "closed" lies is unknown.
//
// # Cost
//
// Compile does all parsing (netip.Prefix, sorted port lists, the policy key)
// so Evaluate allocates nothing unless a dry-run policy matches.
package rbac
