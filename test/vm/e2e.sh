#!/usr/bin/env bash
# e2e.sh is the end-to-end phase of the verbs rig: lwiofs itself over real
# verbs in the Soft-RoCE guest — lwio-server and lwio-mount built with verbs
# support, fio with verification, a tar round trip and the POSIX checks on
# the mount, proof that the data moved by RDMA on verbs, and the server's
# per-connection receive queues (shared_receive_queue = false) (the guest half
# is test/vm/e2e-guest.sh; docs/verbs.md says what it proves).
#
#   test/vm/e2e.sh      # on its own: build, one boot of the guest, report
#
# test/vm/test-verbs.sh sources it and runs the phase in its own boot:
#   e2e_build OUT        builds OUT/bin/{lwio-server,lwio-mount,lwio,posix.test}
#                        and sets e2e_run_args: the run.sh arguments that
#                        stage them (-f) and run e2e-guest.sh last
#   e2e_report OUT       prints the guest's PASS/FAIL lines; 0 if it passed
#
# LWIOFS_VM_OUT keeps the logs in that directory (default: a temp dir,
# printed); the guest's own logs (server, mounts, fio, tar, POSIX) are in
# OUT/e2e. Other knobs: see test/vm/run.sh.

# e2e_build OUT compiles the programs the guest runs. cgo is forced on: a
# CGO_ENABLED=0 build has no verbs provider and would prove nothing.
e2e_build() {
	local out=$1 here
	here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
	mkdir -p "$out/bin"
	CGO_ENABLED=1 ${GO:-go} build -o "$out/bin/lwio-server" ./cmd/lwio-server || return 1
	CGO_ENABLED=1 ${GO:-go} build -o "$out/bin/lwio-mount" ./cmd/lwio-mount || return 1
	CGO_ENABLED=1 ${GO:-go} build -o "$out/bin/lwio" ./cmd/lwio || return 1
	${GO:-go} test -c -o "$out/bin/posix.test" ./test || return 1
	e2e_run_args=(-f "$out/bin/lwio-server" -f "$out/bin/lwio-mount" -f "$out/bin/lwio" -f "$out/bin/posix.test" "$here/e2e-guest.sh")
}

# e2e_report OUT prints what the guest's e2e-guest.sh found and returns 0
# only if it ran and passed.
e2e_report() {
	local out=$1 rc
	rc=$(cat "$out/e2e-guest.sh.rc" 2>/dev/null || echo none)
	if [ "$rc" = none ]; then
		echo "e2e: FAIL: the guest did not run e2e-guest.sh to the end (see $out/console.log)" >&2
		[ ! -f "$out/e2e-guest.sh.log" ] || tail -30 "$out/e2e-guest.sh.log" >&2
		return 1
	fi
	grep -E '^(e2e: |  )' "$out/e2e-guest.sh.log"
	if [ "$rc" != 0 ]; then
		echo "e2e: FAIL: lwiofs end to end over verbs (exit $rc; logs in $out/e2e, $out/e2e-guest.sh.log)" >&2
		return 1
	fi
	echo "e2e: PASS: lwiofs end to end over verbs (Soft-RoCE): mounts, fio, tar, POSIX checks, data by RDMA, shared and private receive queues"
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
	set -euo pipefail
	cd "$(dirname "$0")/../.."
	export PATH="$PATH:/usr/local/go/bin"
	out=${LWIOFS_VM_OUT:-$(mktemp -d /tmp/lwiofs-e2e.XXXXXX)}
	t0=$(date +%s)
	e2e_build "$out"
	echo "e2e: programs built in $(($(date +%s) - t0)) s" >&2
	set +e
	test/vm/run.sh -t "${LWIOFS_VM_TIMEOUT:-900}" -o "$out" "${e2e_run_args[@]}" >"$out/run.log" 2>&1
	echo "e2e: guest run finished (run.sh exit $?) after $(($(date +%s) - t0)) s; logs in $out" >&2
	e2e_report "$out"
	status=$?
	echo "e2e: $(($(date +%s) - t0)) s in total" >&2
	exit $status
fi
