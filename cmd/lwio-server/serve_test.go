package main

import (
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/smbauth"
	"github.com/lwiofs/lwiofs/transport"
)

func TestInstances(t *testing.T) {
	ins, err := instances("127.0.0.1:4451")
	if err != nil || len(ins) != 1 || ins[0].String() != "127.0.0.1:4451" {
		t.Fatalf("specific address: %v %v", ins, err)
	}
	// A wildcard is advertised as local addresses, loopback last, never
	// as 0.0.0.0 which no client can connect to.
	ins, err = instances("0.0.0.0:4451")
	if err != nil || len(ins) == 0 {
		t.Fatalf("wildcard: %v %v", ins, err)
	}
	for _, in := range ins {
		a, err := in.Addr()
		if err != nil {
			t.Fatal(err)
		}
		host, port, _ := net.SplitHostPort(a)
		if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() || ip.To4() == nil || port != "4451" {
			t.Errorf("wildcard advertised as %s", a)
		}
	}
}

func TestSessionConfig(t *testing.T) {
	in := func(a string) transport.Instance {
		i, err := transport.InstanceFor(a)
		if err != nil {
			t.Fatal(err)
		}
		return i
	}
	c := &Config{
		Shares: map[string]ShareConfig{"b": {Path: "/b", ReadOnly: true}, "a": {Path: "/a", Users: []string{"u"}}},
		Users:  map[string]UserConfig{"u": {NTHash: smbauth.FormatNTHash(smbauth.NTHash("pw"))}},
	}
	lls := []lwioListener{
		{provider: "softrdma", info: []transport.Instance{in("10.0.0.1:1")}},
		{provider: "verbs", info: []transport.Instance{in("10.0.0.1:2")}},
		{provider: "softrdma", info: []transport.Instance{in("10.0.0.2:1")}},
	}
	log := logrus.New()
	log.Out = io.Discard
	sc := sessionConfig(c, lls, log)
	if len(sc.Shares) != 2 || sc.Shares[0].Name != "a" || !sc.Shares[1].ReadOnly || sc.Shares[0].Users[0] != "u" {
		t.Errorf("shares %+v", sc.Shares)
	}
	if sc.Users["u"] != smbauth.NTHash("pw") {
		t.Errorf("user hash not carried")
	}
	if len(sc.Providers) != 2 || sc.Providers[0].Name != "verbs" || sc.Providers[1].Name != "softrdma" ||
		len(sc.Providers[1].Instances) != 2 {
		t.Errorf("providers %v: want verbs first, softrdma with both instances", sc.Providers)
	}
}

func TestKeepServing(t *testing.T) {
	log := logrus.New()
	log.Out = io.Discard
	// Accept errors are retried; a clean close ends it.
	calls := 0
	keepServing(log, make(chan struct{}), func() error {
		calls++
		if calls < 3 {
			return errors.New("accept4: too many open files")
		}
		return nil
	})
	if calls != 3 {
		t.Errorf("serve called %d times, want 3", calls)
	}
	// Shutting down ends it even while the listener keeps failing.
	stopping := make(chan struct{})
	done := make(chan struct{})
	go func() {
		keepServing(log, stopping, func() error { return errors.New("broken") })
		close(done)
	}()
	time.Sleep(30 * time.Millisecond)
	close(stopping)
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("keepServing did not stop")
	}
}
