package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/cmd/internal/cli"
	"github.com/lwiofs/lwiofs/protocol/session"
	"github.com/lwiofs/lwiofs/protocol/share"
	"github.com/lwiofs/lwiofs/smbauth"
)

// failregexes reads the fail2ban filter's failregex lines from
// docs/security.md and turns them into Go expressions, <HOST> captured.
func failregexes(t *testing.T) []*regexp.Regexp {
	t.Helper()
	doc, err := os.ReadFile("../../docs/security.md")
	if err != nil {
		t.Fatal(err)
	}
	var out []*regexp.Regexp
	in := false
	for _, line := range strings.Split(string(doc), "\n") {
		if v, ok := strings.CutPrefix(line, "failregex = "); ok {
			in = true
			line = v
		} else if in && strings.HasPrefix(line, "            ") {
			line = strings.TrimSpace(line)
		} else {
			in = false
			continue
		}
		re := strings.ReplaceAll(line, "<HOST>", `(?P<host>[0-9A-Fa-f.:]+)`)
		out = append(out, regexp.MustCompile(re))
	}
	if len(out) != 2 {
		t.Fatalf("docs/security.md: %d failregex lines, want 2 (text and JSON)", len(out))
	}
	return out
}

// TestFail2banFilter: the filter in docs/security.md finds the client's
// address in the server's real "logon failure" line, in both log
// formats — and not an address an attacker put in the user name.
func TestFail2banFilter(t *testing.T) {
	res := failregexes(t)
	for _, format := range []string{"text", "json"} {
		var buf bytes.Buffer
		log, err := cli.NewLogger(&buf, "info", format)
		if err != nil {
			t.Fatal(err)
		}
		srv, err := session.NewServer(session.ServerConfig{
			Shares:   []share.Config{{Name: "s", Path: t.TempDir()}},
			Users:    map[string][16]byte{"alice": smbauth.NTHash("right")},
			Logger:   log.WithField("component", "session"),
			Accounts: share.AccountsConfig{Guest: "root"},
		})
		if err != nil {
			t.Fatal(err)
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go srv.Serve(l)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		for _, user := range []string{"alice", `x" addr=6.6.6.6 y`, `{"addr":"6.6.6.6"}`} {
			_, err := session.Dial(ctx, l.Addr().String(), session.ClientConfig{User: user, Domain: "WORK", Password: "wrong"})
			if !errors.Is(err, session.ErrLogonFailure) {
				t.Errorf("%s: wrong password for %q: %v", format, user, err)
			}
		}
		cancel()
		srv.Close()
		var lines int
		for _, line := range strings.Split(buf.String(), "\n") {
			if !strings.Contains(line, "logon failure") || !strings.Contains(line, "warning") {
				continue
			}
			lines++
			var hosts []string
			for _, re := range res {
				if m := re.FindStringSubmatch(line); m != nil {
					hosts = append(hosts, m[re.SubexpIndex("host")])
				}
			}
			if len(hosts) != 1 || hosts[0] != "127.0.0.1" {
				t.Errorf("%s: the filter finds hosts %v in %s, want exactly 127.0.0.1", format, hosts, line)
			}
		}
		if testing.Verbose() {
			t.Log(buf.String())
		}
		if lines != 3 {
			t.Errorf("%s: %d logon failure lines, want 3:\n%s", format, lines, buf.String())
		}
	}
}
