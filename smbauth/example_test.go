package smbauth_test

import (
	"bytes"
	"fmt"
	"strings"

	"github.com/lwiofs/lwiofs/smbauth"
)

// The three NTLMSSP messages of one logon. The server keeps only the NT hash
// (as FormatNTHash text in its configuration); both sides end with the same
// 16-byte session key, which then signs every message.
func Example() {
	users := map[string]string{"alice": smbauth.FormatNTHash(smbauth.NTHash("correct horse"))}
	srv := smbauth.NewServer(smbauth.ServerConfig{
		TargetName: "LWIODOM", NetbiosComputer: "FILER",
		Lookup: func(user, domain string) ([16]byte, bool) {
			text, ok := users[strings.ToLower(user)]
			if !ok {
				return [16]byte{}, false
			}
			h, err := smbauth.ParseNTHash(text)
			return h, err == nil
		},
	})
	cl := smbauth.NewClient(smbauth.ClientConfig{User: "alice", Domain: "LWIODOM", Password: "correct horse"})

	negotiate, _ := cl.Negotiate()
	challenge, state, _ := srv.Challenge(negotiate)
	authenticate, clientKey, _ := cl.Authenticate(challenge)
	res, err := state.Authenticate(authenticate)
	fmt.Println(res.User, err, bytes.Equal(res.SessionKey, clientKey))

	sig := smbauth.Sign(clientKey, []byte("a message"))
	fmt.Println(smbauth.VerifySignature(res.SessionKey, sig[:], []byte("a message")))

	_, err = state.Authenticate(authenticate) // a challenge is answered once
	fmt.Println(err)
	// Output:
	// alice <nil> true
	// true
	// smbauth: logon failure
}
