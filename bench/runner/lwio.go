package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// lwioSpec is one lwiofs configuration the bench measures as a target: the
// binaries, lwio-mount's options and lwio-server's flags. Comparing two
// configurations in one interleaved run (completion=auto against the fixed
// modes, sealed against unsealed, old binaries against new) is one more
// spec: `-lwio NAME=...`, BENCH_LWIO, or BENCH_LWIO_BIN_OLD.
type lwioSpec struct {
	Name string
	// Bin is the directory with lwio-server, lwio-mount and lwio.
	Bin string
	// Mount is lwio-mount's -o options beyond username (e.g.
	// "completion=polling").
	Mount string
	// Server is lwio-server's flags beyond share, listeners and user (e.g.
	// "-encrypt=required"); targets with other Bin or Server get their own
	// server.
	Server []string `json:",omitempty"`
}

// lwioFlags collects repeated -lwio flags.
type lwioFlags []string

func (f *lwioFlags) String() string     { return strings.Join(*f, " ") }
func (f *lwioFlags) Set(v string) error { *f = append(*f, v); return nil }

// parseLWIOSpec reads NAME=MOUNT_OPTIONS, or NAME=PART;PART… where each
// part is mount=OPTIONS, server=FLAG,FLAG… or bin=DIR:
//
//	lwio-auto=completion=auto
//	lwio-sealed=mount=completion=auto,seal;server=-encrypt=required   (the default run's)
//	lwio-before=mount=completion=interrupt;bin=/tmp/bin-main
func parseLWIOSpec(s string) (lwioSpec, error) {
	name, rest, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return lwioSpec{}, fmt.Errorf("-lwio %q: want NAME=MOUNT_OPTIONS or NAME=mount=…;server=…;bin=…", s)
	}
	switch name {
	case "dir", "nullfs", "sshfs":
		return lwioSpec{}, fmt.Errorf("-lwio %q: %s is a built-in target", s, name)
	}
	spec := lwioSpec{Name: name}
	parts := strings.Split(rest, ";")
	keyed := false
	for _, p := range parts {
		k, _, _ := strings.Cut(p, "=")
		keyed = keyed || k == "mount" || k == "server" || k == "bin"
	}
	if !keyed {
		spec.Mount = rest
		return spec, nil
	}
	for _, p := range parts {
		k, v, _ := strings.Cut(p, "=")
		switch k {
		case "mount":
			spec.Mount = v
		case "server":
			spec.Server = strings.Split(v, ",")
		case "bin":
			spec.Bin = v
		default:
			return lwioSpec{}, fmt.Errorf("-lwio %q: unknown part %q (mount=, server=, bin=)", s, p)
		}
	}
	return spec, nil
}

// sealedTarget is the default run's sealed configuration: lwio-auto's
// mount with sealing required by both ends, so the report shows what
// AES-GCM costs (session channel and softrdma data connections) beside
// lwio-auto in the same interleaved run. -lwio lwio-sealed=… replaces it.
var sealedTarget = lwioSpec{Name: "lwio-sealed", Mount: "completion=auto,seal", Server: []string{"-encrypt=required"}}

// lwioTargets resolves the target list: names from -targets (lwio-MODE
// without a spec means completion=MODE), then the targets -lwio and env
// define that -targets did not name, then, with oldBin, each lwio target
// again on the binaries in oldBin as NAME-old. Specs without bin= use bin.
func lwioTargets(names, flags []string, env, oldBin, bin string) ([]string, []lwioSpec, error) {
	byName := map[string]lwioSpec{}
	var defined []string
	for _, s := range append(append([]string(nil), flags...), strings.Fields(env)...) {
		spec, err := parseLWIOSpec(s)
		if err != nil {
			return nil, nil, err
		}
		if _, dup := byName[spec.Name]; !dup {
			defined = append(defined, spec.Name)
		}
		byName[spec.Name] = spec
	}
	var targets []string
	var specs []lwioSpec
	seen := map[string]bool{}
	add := func(name string) error {
		if seen[name] {
			return nil
		}
		seen[name] = true
		targets = append(targets, name)
		spec, ok := byName[name]
		switch {
		case ok:
		case name == "dir" || name == "nullfs" || name == "sshfs":
			return nil
		case name == sealedTarget.Name:
			spec = sealedTarget
			spec.Server = append([]string(nil), sealedTarget.Server...)
		case strings.HasPrefix(name, "lwio-"):
			spec = lwioSpec{Name: name, Mount: "completion=" + strings.TrimPrefix(name, "lwio-")}
		default:
			return fmt.Errorf("unknown target %q (dir, nullfs, sshfs, lwio-MODE or one defined by -lwio)", name)
		}
		if spec.Bin == "" {
			spec.Bin = bin
		}
		specs = append(specs, spec)
		return nil
	}
	for _, n := range append(names, defined...) {
		if n = strings.TrimSpace(n); n != "" {
			if err := add(n); err != nil {
				return nil, nil, err
			}
		}
	}
	if oldBin != "" {
		for _, spec := range append([]lwioSpec(nil), specs...) {
			old := spec
			old.Name, old.Bin = spec.Name+"-old", oldBin
			byName[old.Name] = old
			if err := add(old.Name); err != nil {
				return nil, nil, err
			}
		}
	}
	return targets, specs, nil
}

const lwioPassword = "bench-password"

// lwioServer is one lwio-server of an export, shared by the targets with
// the same binaries and flags.
type lwioServer struct {
	d     *daemon
	addr  string // the session listener
	ports []int  // session and softrdma listeners
}

func (env *setupEnv) setupLWIO(spec lwioSpec) (*target, func(), error) {
	serverBin, mountBin := filepath.Join(spec.Bin, "lwio-server"), filepath.Join(spec.Bin, "lwio-mount")
	for _, b := range []string{serverBin, mountBin} {
		if _, err := os.Stat(b); err != nil {
			return nil, nil, fmt.Errorf("%s is not built (make build): %v", b, err)
		}
	}
	var cleanups []func()
	cleanup := func() {
		for i := len(cleanups) - 1; i >= 0; i-- {
			cleanups[i]()
		}
	}
	key := spec.Bin + "\x00" + strings.Join(spec.Server, "\x00")
	srv := env.servers[key]
	if srv == nil {
		p1, err := freePort()
		if err != nil {
			return nil, nil, err
		}
		p2, err := freePort()
		if err != nil {
			return nil, nil, err
		}
		srv = &lwioServer{addr: fmt.Sprintf("127.0.0.1:%d", p1), ports: []int{p1, p2}}
		args := append([]string{"-share", "bench=" + env.export, "-listen", srv.addr,
			"-soft", fmt.Sprintf("127.0.0.1:%d", p2), "-user", "bench", "-account", "root", "-allow-root", "-log-level", "warn"}, spec.Server...)
		srv.d, err = startDaemon("lwio-server", filepath.Join(env.work, fmt.Sprintf("lwio-server-%d.log", len(env.servers))),
			[]string{"LWIO_PASSWORD=" + lwioPassword}, serverBin, args...)
		if err != nil {
			return nil, nil, err
		}
		env.servers[key] = srv
		// The server outlives the mounts: cleanups run in reverse, and its
		// stop is in the cleanup of the first target that uses it.
		cleanups = append(cleanups, func() { srv.d.stop(); delete(env.servers, key) })
		if err := waitListening(srv.d, srv.addr); err != nil {
			return nil, cleanup, err
		}
	}
	mnt := filepath.Join(env.work, "mnt-"+spec.Name)
	if err := os.Mkdir(mnt, 0o755); err != nil {
		return nil, cleanup, err
	}
	opts := "username=bench"
	if spec.Mount != "" {
		opts += "," + spec.Mount
	}
	d, err := startDaemon("lwio-mount ("+spec.Name+")", filepath.Join(env.work, spec.Name+".log"),
		[]string{"LWIO_PASSWORD=" + lwioPassword}, mountBin, "//"+srv.addr+"/bench", mnt, "-o", opts)
	if err != nil {
		return nil, cleanup, err
	}
	cleanups = append(cleanups, func() { unmount(d, mnt) })
	t := &target{Name: spec.Name, Dir: mnt, client: d, server: srv.d, ports: srv.ports, lwioStat: filepath.Join(spec.Bin, "lwio")}
	if err := waitMounted(d, mnt); err != nil {
		return t, cleanup, err
	}
	t.DataPath = dataPath(d)
	return t, cleanup, nil
}

// dataPath reads, from lwio-mount's start-up log, which data path the
// mount uses (the field data_path=) and any warning about it, so that a
// table of figures never hides a fallback from RDMA to TCP.
func dataPath(d *daemon) string {
	deadline := time.Now().Add(3 * time.Second)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(d.log)
		var path, warn string
		for _, l := range strings.Split(string(b), "\n") {
			if i := strings.Index(l, "data_path="); i >= 0 && path == "" {
				path = strings.Fields(l[i+len("data_path="):])[0]
			}
			if strings.Contains(l, "level=warning") && strings.Contains(l, "data") {
				warn = l
			}
		}
		if path != "" {
			if warn != "" {
				return path + " — " + warn
			}
			return path
		}
		time.Sleep(100 * time.Millisecond)
	}
	return "unknown (lwio-mount logged no data_path)"
}
