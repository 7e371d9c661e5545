// Package dist holds what installs lwiofs as a system service rather than
// Go code: install.sh (make install / uninstall), the systemd unit
// template lwio-server.service.in, the commented example configuration
// server.toml, the Debian packaging (mkdeb.sh, deb/) and test-install.sh,
// the real install test that CI runs as root. Its Go test checks the unit
// template and the documented mount unit with systemd-analyze verify.
package dist
