#!/usr/bin/env bash
# Runs the interop tests: our code against upstream Istio's own Go code
# (istio.io/istio, downloaded through the Go module proxy on first run).
#
# Istio's generated protos and ours register the same proto names, which
# protobuf-go turns into an init panic unless its conflict policy says
# otherwise (see doc.go). "ignore" and "warn" behave the same; "warn" also
# prints ~100 identical conflict warnings per test binary, so the default
# here is "ignore": run with GOLANG_PROTOBUF_REGISTRATION_CONFLICT=warn to
# see them.
#
# -tags=vtprotobuf builds Istio's vtprotobuf marshalers, as istiod's release
# build does (Makefile.core.mk STANDARD_TAGS), so the tests can encode
# resources exactly as istiod pushes them.
#
# Extra arguments go to `go test` (e.g. -run TestOurPoolToIstioServer -v).
set -euo pipefail
cd "$(dirname "$0")"
export GOLANG_PROTOBUF_REGISTRATION_CONFLICT="${GOLANG_PROTOBUF_REGISTRATION_CONFLICT:-ignore}"
go vet -tags=vtprotobuf ./...
go test -count=1 -timeout 5m -tags=vtprotobuf "$@" ./...
