#!/usr/bin/env bash
# mkdeb.sh builds the Debian package lwiofs from a staged install (what
# `make deb` runs, after `make build man`): dist/install.sh into a staging
# root with PREFIX=/usr, man pages compressed as Debian wants them, the
# control file and maintainer scripts from dist/deb/, dependencies on
# shared libraries computed by dpkg-shlibdeps, and dpkg-deb --build.
#
#   dist/mkdeb.sh               writes $BIN/lwiofs_VERSION_ARCH.deb and prints its path
#
# VERSION comes from git: the latest vX.Y.Z tag (plus +gitN.HASH past it),
# else 0.0.0~gitYYYYMMDD.HASH; DEB_VERSION overrides it.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-bin}

version=${DEB_VERSION:-}
if [ -z "$version" ]; then
	if desc=$(git describe --tags --match 'v[0-9]*' 2>/dev/null); then
		# v1.2.3-4-gabcdef0 -> 1.2.3+git4.abcdef0
		version=$(printf '%s' "${desc#v}" | sed -E 's/-([0-9]+)-g([0-9a-f]+)$/+git\1.\2/')
	elif hash=$(git rev-parse --short=12 HEAD 2>/dev/null); then
		version="0.0.0~git$(git log -1 --format=%cd --date=format:%Y%m%d HEAD).$hash"
	else
		version=0.0.0~unknown
	fi
	if [ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]; then
		version+=".dirty"
	fi
fi
arch=$(dpkg --print-architecture)

work=$(mktemp -d "${TMPDIR:-/tmp}/lwiofs-deb.XXXXXX")
trap 'rm -rf "$work"' EXIT
root=$work/root

DESTDIR=$root PREFIX=/usr BINDIR=/usr/bin SBINDIR=/usr/sbin MANDIR=/usr/share/man \
	DATADIR=/usr/share/lwiofs UNITDIR=/usr/lib/systemd/system SYSCONFDIR=/etc BIN=$BIN \
	dist/install.sh install >/dev/null
# The configuration is not a packaged file: postinst copies the example to
# /etc/lwio/server.toml only if none is there, so upgrades never prompt
# about a file that `lwio-server adduser` edits.
rm -rf "$root/etc"
# Man pages gzip -9n; the lwio.8 alias becomes a link to the .gz.
find "$root/usr/share/man" -type f -exec gzip -9n {} +
ln -sfn lwio-mount.8.gz "$root/usr/share/man/man8/lwio.8.gz"
rm -f "$root/usr/share/man/man8/lwio.8"
install -d -m 755 "$root/usr/share/doc/lwiofs"
install -m 644 README.md "$root/usr/share/doc/lwiofs/README.md"

# Shared-library dependencies of the programs (libc; rdma-core's libraries
# are loaded at run time, hence only Recommends).
mkdir -p "$work/src/debian"
printf 'Source: lwiofs\n\nPackage: lwiofs\nArchitecture: any\n' >"$work/src/debian/control"
shlibs=$(cd "$work/src" && dpkg-shlibdeps -O "$root/usr/bin/lwio-mount" "$root/usr/bin/lwio" "$root/usr/sbin/lwio-server" 2>/dev/null |
	sed -n 's/^shlibs:Depends=//p')

install -d -m 755 "$root/DEBIAN"
sed -e "s|@VERSION@|$version|" -e "s|@ARCH@|$arch|" \
	-e "s|@DEPENDS@|fuse3${shlibs:+, $shlibs}|" \
	-e "s|@SIZE@|$(du -sk --exclude=DEBIAN "$root" | cut -f1)|" \
	-e "s|@MAINTAINER@|${DEB_MAINTAINER:-lwiofs developers <lwiofs@localhost>}|" \
	dist/deb/control.in >"$root/DEBIAN/control"
for s in postinst prerm postrm; do
	install -m 755 "dist/deb/$s" "$root/DEBIAN/$s"
done

out="$BIN/lwiofs_${version}_${arch}.deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$out" >/dev/null
echo "$out"
