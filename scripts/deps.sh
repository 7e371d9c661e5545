#!/usr/bin/env bash
# deps.sh installs, non-interactively, what a fresh Debian machine lacks to
# build and test lwiofs. It is idempotent: packages already present are not
# touched, and nothing is done when everything is there.
#
#   scripts/deps.sh            # what `make build` and `make test` need
#   scripts/deps.sh bench      # plus what `make bench` needs (sshfs, sshd, gnuplot)
#   scripts/deps.sh vm         # plus what `make test-verbs` needs (qemu, mmdebstrap)
#   scripts/deps.sh deb        # plus what `make deb` needs (dpkg-shlibdeps)
#   scripts/deps.sh install    # plus what `make test-install` needs (man, groff, dpkg-dev)
set -euo pipefail

want=(
	fuse3:/usr/bin/fusermount3
	fio:/usr/bin/fio
	sqlite3:/usr/bin/sqlite3
	git:/usr/bin/git
	libibverbs-dev:/usr/include/infiniband/verbs.h
	librdmacm-dev:/usr/include/rdma/rdma_cma.h
	pkg-config:/usr/bin/pkg-config
	gcc:/usr/bin/gcc
	python3-impacket:/usr/lib/python3/dist-packages/impacket/ntlm.py
)
for extra in "$@"; do
	case "$extra" in
	bench) want+=(sshfs:/usr/bin/sshfs openssh-server:/usr/sbin/sshd gnuplot-nox:/usr/bin/gnuplot) ;;
	vm) want+=(qemu-system-x86:/usr/bin/qemu-system-x86_64 qemu-utils:/usr/bin/qemu-img mmdebstrap:/usr/bin/mmdebstrap e2fsprogs:/usr/sbin/mke2fs) ;;
	deb) want+=(dpkg-dev:/usr/bin/dpkg-shlibdeps) ;;
	install) want+=(dpkg-dev:/usr/bin/dpkg-shlibdeps man-db:/usr/bin/man groff-base:/usr/bin/nroff) ;;
	*) echo "deps.sh: unknown set $extra" >&2; exit 2 ;;
	esac
done

missing=()
for w in "${want[@]}"; do
	pkg=${w%%:*} path=${w#*:}
	[ -e "$path" ] || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0

if [ "$(id -u)" != 0 ]; then
	echo "deps.sh: missing packages ${missing[*]}; run as root or install them with apt-get" >&2
	exit 1
fi
echo "deps.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq </dev/null
apt-get install -y -qq --no-install-recommends "${missing[@]}" </dev/null >/dev/null
