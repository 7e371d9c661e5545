package main

import (
	"io"
	"runtime"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/internal/testutil"
	"github.com/lwiofs/lwiofs/smbauth"
)

func TestServerConfig(t *testing.T) {
	c := &Config{
		Shares:      map[string]ShareConfig{"b": {Path: "/b", ReadOnly: true}, "a": {Path: "/a", Users: []string{"u"}}},
		Users:       map[string]UserConfig{"u": {NTHash: smbauth.FormatNTHash(smbauth.NTHash("pw"))}},
		Limits:      LimitsConfig{CreditsPerConnection: 7, Workers: 3},
		Listen:      ListenConfig{Session: "127.0.0.1:5000", Softrdma: []string{"127.0.0.1:5001", "127.0.0.1:5002"}, Metrics: "127.0.0.1:9450"},
		StateDir:    t.TempDir(),
		softrdmaSet: true,
	}
	c.Limits.DurableTimeout = 5
	log := logrus.New()
	log.Out = io.Discard
	fc, err := serverConfig(c, log)
	if err != nil {
		t.Fatal(err)
	}
	sc := fc.Session
	if len(sc.Shares) != 2 || sc.Shares[0].Name != "a" || !sc.Shares[1].ReadOnly || sc.Shares[0].Users[0] != "u" {
		t.Errorf("shares %+v", sc.Shares)
	}
	if sc.Users["u"] != smbauth.NTHash("pw") {
		t.Errorf("user hash not carried")
	}
	if sc.StateDir != c.StateDir || sc.DurableTimeout != 5*time.Second {
		t.Errorf("state_dir %q, durable_timeout %v not carried", sc.StateDir, sc.DurableTimeout)
	}
	if fc.Engine.Credits != 7 || fc.Engine.MaxCredits != 7 || fc.Engine.Workers != 3 {
		t.Errorf("limits not carried: %+v", fc.Engine)
	}
	if fc.SessionAddr != "127.0.0.1:5000" || len(fc.Listeners) != 2 || fc.Listeners[1].Addr != "127.0.0.1:5002" ||
		fc.Listeners[0].Provider.Name() != "softrdma" {
		t.Errorf("listeners %+v on %s", fc.Listeners, fc.SessionAddr)
	}
	if fc.MetricsAddr != "127.0.0.1:9450" {
		t.Errorf("metrics address %q not carried", fc.MetricsAddr)
	}
}

// TestKeepSysmonQuiet: the server takes one P more for its sysmon keeper,
// and the keeper, with its default settings, naps in system calls once
// goroutines run as a busy server's do (docs/bench.md, "Go's sysmon").
// It fails if the extra P or the keeper is dropped.
func TestKeepSysmonQuiet(t *testing.T) {
	n := runtime.GOMAXPROCS(0)
	t.Cleanup(func() { runtime.GOMAXPROCS(n) })
	t.Setenv("GOMAXPROCS", "")
	k := keepSysmonQuiet()
	defer k.Stop()
	if got := runtime.GOMAXPROCS(0); got != n+1 {
		t.Fatalf("GOMAXPROCS %d after keepSysmonQuiet, want %d", got, n+1)
	}
	// Requests, as goroutines see them: one wakes another, until the
	// keeper notices.
	ping, pong := make(chan struct{}), make(chan struct{})
	go func() {
		for range ping {
			pong <- struct{}{}
		}
	}()
	defer close(ping)
	testutil.Eventually(t, "the keeper naps under load", time.Minute, func() bool {
		for range 1000 {
			ping <- struct{}{}
			<-pong
		}
		return k.Napping()
	})
}
