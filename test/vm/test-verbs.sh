#!/usr/bin/env bash
# test-verbs.sh proves the verbs provider on real verbs: it compiles the
# transport/verbs tests (conformance suite, smoke test) twice — as built,
# with the race detector, and with the build tag verbsbroken, which corrupts
# the rkey of every RDMA WRITE — and runs both binaries in one boot of the Soft-RoCE guest
# (test/vm/run.sh). It passes only if the real build passes and the broken
# build fails its RDMA WRITE cases: a rig that cannot fail proves nothing.
# The same boot then runs the end-to-end phase (test/vm/e2e.sh): lwio-server
# and lwio-mount over verbs, fio, tar and POSIX checks on the mount, and
# proof that the data moved by RDMA on verbs.
#
#   test/vm/test-verbs.sh            # what `make test-verbs` runs
#
# LWIOFS_VM_OUT keeps the logs in that directory (default: a temp dir,
# printed). Other knobs: see test/vm/run.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
export PATH="$PATH:/usr/local/go/bin"
GO=${GO:-go}

out=${LWIOFS_VM_OUT:-$(mktemp -d /tmp/lwiofs-test-verbs.XXXXXX)}
mkdir -p "$out/bin"
t0=$(date +%s)
$GO test -race -c -o "$out/bin/verbs.test" ./transport/verbs
$GO test -c -tags verbsbroken -o "$out/bin/verbs-broken.test" ./transport/verbs
$GO test -c -o "$out/bin/transport.test" ./transport
# shellcheck source=test/vm/e2e.sh
. test/vm/e2e.sh
e2e_build "$out"
echo "test-verbs: test binaries built in $(( $(date +%s) - t0 )) s" >&2

set +e
test/vm/run.sh -t "${LWIOFS_VM_TIMEOUT:-900}" -o "$out" "$out/bin/verbs.test" "$out/bin/verbs-broken.test" "$out/bin/transport.test" \
	"${e2e_run_args[@]}" \
	-- -test.v -test.count=1 -test.timeout=600s >"$out/run.log" 2>&1
vmrc=$?
set -e
echo "test-verbs: guest run finished (run.sh exit $vmrc) after $(( $(date +%s) - t0 )) s in total; logs in $out" >&2

status=0
rc() { cat "$out/$1.rc" 2>/dev/null || echo none; }
disc=$(rc transport.test)
good=$(rc verbs.test)
bad=$(rc verbs-broken.test)
if [ "$good" = none ] || [ "$bad" = none ] || [ "$disc" = none ]; then
	echo "test-verbs: FAIL: the guest did not report (see $out/run.log, $out/console.log)" >&2
	tail -40 "$out/run.log" >&2
	exit 1
fi
grep -E -- '^(=== RUN|--- |    --- |PASS|FAIL|ok)|SKIP|: ' "$out/verbs.test.log" | grep -v '^=== RUN' || true
if [ "$good" != 0 ]; then
	echo "test-verbs: FAIL: the verbs provider failed over Soft-RoCE (exit $good)" >&2
	status=1
elif grep -q -- '--- SKIP: TestConformance \|--- SKIP: TestSmoke ' "$out/verbs.test.log"; then
	echo "test-verbs: FAIL: the suite was skipped in the guest, which proves nothing" >&2
	status=1
else
	echo "test-verbs: PASS: conformance suite and smoke test over rdma_rxe"
fi
if [ "$disc" != 0 ]; then
	echo "test-verbs: FAIL: package transport (discovery of rxe0 through rdmamap) failed in the guest:" >&2
	grep -E -- '--- FAIL|_test.go' "$out/transport.test.log" >&2 || true
	status=1
else
	echo "test-verbs: PASS: discovery finds rxe0 on dum0 ($(grep -o 'verbs\[[^]]*\]' "$out/transport.test.log" | head -1))"
fi
if [ "$bad" = 0 ]; then
	echo "test-verbs: FAIL: the deliberately broken provider (verbsbroken: wrong rkey) passed; the suite cannot catch it" >&2
	status=1
elif ! grep -q -- '--- FAIL: TestConformance/WritePlacement' "$out/verbs-broken.test.log"; then
	echo "test-verbs: FAIL: the broken provider failed (exit $bad), but not in WritePlacement as expected:" >&2
	grep -- '--- FAIL' "$out/verbs-broken.test.log" >&2 || true
	status=1
else
	echo "test-verbs: PASS: the broken provider (wrong rkey) is caught: $(grep -c -- '    --- FAIL' "$out/verbs-broken.test.log") conformance cases fail"
	# Named plainly, not as go test's "--- FAIL" lines: these failures are
	# the expected result, and a log reader must not take them for ours.
	echo "    caught by: $(grep -- '    --- FAIL' "$out/verbs-broken.test.log" | sed -E 's/.*--- FAIL: TestConformance\/([^ ]*).*/\1/' | tr '\n' ' ')"
fi
e2e_report "$out" || status=1
echo "test-verbs: $(( $(date +%s) - t0 )) s in total"
exit $status
