package smbauth

import (
	"bufio"
	"bytes"
	"encoding/hex"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// impacketPython returns a Python interpreter that can import impacket, or
// skips the test.
func impacketPython(t *testing.T) string {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: no external NTLM client")
	}
	for _, py := range []string{"python3", "/usr/bin/python3"} {
		if exec.Command(py, "-c", "import impacket.ntlm").Run() == nil {
			return py
		}
	}
	t.Skip("no python3 with impacket (Debian: apt-get install python3-impacket)")
	return ""
}

// TestImpacketClient lets impacket's NTLM client, which sends no MIC, log on
// to the server, with and without KEY_EXCH; both sides must agree on the key.
func TestImpacketClient(t *testing.T) {
	py := impacketPython(t)
	for _, keyExch := range []bool{false, true} {
		t.Run(fmt.Sprintf("keyexch=%v", keyExch), func(t *testing.T) {
			for _, tc := range []struct {
				name, user, password string
				ok                   bool
			}{
				{"good", "alice", "correct horse", true},
				{"wrong password", "alice", "correct horse!", false},
				{"unknown user", "carol", "correct horse", false},
			} {
				t.Run(tc.name, func(t *testing.T) {
					s := testServer()
					tr, err := runImpacket(py, s, tc.user, tc.password, "LWIODOM", keyExch)
					if err != nil {
						t.Fatal(err)
					}
					t.Logf("transcript:\n%s", tr)
					if tc.ok != (tr.err == nil) {
						t.Fatalf("Authenticate: %v, want ok=%v", tr.err, tc.ok)
					}
					if tr.err != nil {
						if tr.err != ErrLogonFailure {
							t.Fatalf("Authenticate: %v, want ErrLogonFailure", tr.err)
						}
						return
					}
					if !bytes.Equal(tr.serverKey, tr.clientKey) {
						t.Fatalf("session keys differ: server %x impacket %x", tr.serverKey, tr.clientKey)
					}
					if m, _ := ParseAuthenticate(tr.authenticate); (m.Flags&FlagKeyExch != 0) != keyExch {
						t.Errorf("AUTHENTICATE flags %v, KEY_EXCH wanted %v", m.Flags, keyExch)
					}
				})
			}
		})
	}
}

// TestImpacketClientSeal: impacket asks for NTLMSSP_NEGOTIATE_SEAL (with
// KEY_EXCH; as a client that will encrypt does). A server that seals grants
// it in the CHALLENGE and impacket keeps it in the AUTHENTICATE; one that
// does not (DisableSeal) leaves it out, and impacket drops it but still
// logs on. Either way both sides hold the same key.
func TestImpacketClientSeal(t *testing.T) {
	py := impacketPython(t)
	for _, disable := range []bool{false, true} {
		t.Run(fmt.Sprintf("DisableSeal=%v", disable), func(t *testing.T) {
			s := testServer()
			s.cfg.DisableSeal = disable
			tr, err := runImpacket(py, s, "alice", "correct horse", "LWIODOM", true)
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("transcript:\n%s", tr)
			if tr.err != nil {
				t.Fatalf("Authenticate: %v", tr.err)
			}
			if !bytes.Equal(tr.serverKey, tr.clientKey) {
				t.Fatalf("session keys differ: server %x impacket %x", tr.serverKey, tr.clientKey)
			}
			neg, _ := ParseNegotiate(tr.negotiate)
			ch, _ := ParseChallenge(tr.challenge)
			auth, _ := ParseAuthenticate(tr.authenticate)
			if neg.Flags&FlagSeal == 0 {
				t.Fatalf("impacket's NEGOTIATE does not ask for SEAL (%v)", neg.Flags)
			}
			granted := !disable
			if (ch.Flags&FlagSeal != 0) != granted || (auth.Flags&FlagSeal != 0) != granted ||
				(tr.flags&FlagSeal != 0) != granted {
				t.Errorf("SEAL: CHALLENGE %v, AUTHENTICATE %v, Result %v; granted should be %v",
					ch.Flags, auth.Flags, tr.flags, granted)
			}
		})
	}
}

type transcript struct {
	flags                              NegotiateFlags
	negotiate, challenge, authenticate []byte
	clientKey, serverKey               []byte
	err                                error
}

func (tr *transcript) String() string {
	return fmt.Sprintf("NEGOTIATE    %x\nCHALLENGE    %x\nAUTHENTICATE %x\nclient key   %x\nserver key   %x\nerr          %v",
		tr.negotiate, tr.challenge, tr.authenticate, tr.clientKey, tr.serverKey, tr.err)
}

func runImpacket(py string, s *Server, user, password, domain string, keyExch bool) (*transcript, error) {
	ke := "0"
	if keyExch {
		ke = "1"
	}
	cmd := exec.Command(py, "testdata/impacket_client.py", user, password, domain, ke)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	outPipe, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			_ = cmd.Process.Kill()
		}
	}()
	out := bufio.NewReader(outPipe)
	line := func() ([]byte, error) {
		l, err := out.ReadString('\n')
		if err != nil {
			return nil, fmt.Errorf("impacket: %v; stderr: %s", err, stderr.String())
		}
		return hex.DecodeString(strings.TrimSpace(l))
	}
	tr := &transcript{}
	if tr.negotiate, err = line(); err != nil {
		return nil, err
	}
	ch, st, err := s.Challenge(tr.negotiate)
	if err != nil {
		return nil, fmt.Errorf("Challenge(%x): %v", tr.negotiate, err)
	}
	tr.challenge = ch
	if _, err := io.WriteString(in, hex.EncodeToString(ch)+"\n"); err != nil {
		return nil, err
	}
	if tr.authenticate, err = line(); err != nil {
		return nil, err
	}
	if tr.clientKey, err = line(); err != nil {
		return nil, err
	}
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("impacket: %v; stderr: %s", err, stderr.String())
	}
	res, err := st.Authenticate(tr.authenticate)
	tr.serverKey, tr.flags, tr.err = res.SessionKey, res.Flags, err
	return tr, nil
}
