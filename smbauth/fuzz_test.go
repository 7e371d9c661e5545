package smbauth

import (
	"reflect"
	"testing"
)

// fuzzSeeds are real messages: the spec's, Chromium's, impacket's, and ours.
func fuzzSeeds(f *testing.F) (neg, ch, auth [][]byte) {
	n, c, a := roundTripMessages(f)
	neg = [][]byte{unhex(f, chromiumNegotiate), unhex(f, impacketNegotiate), n.Marshal()}
	ch = [][]byte{unhex(f, specChallenge), unhex(f, impacketChallenge), c.Marshal()}
	auth = [][]byte{unhex(f, chromiumAuthenticate), unhex(f, impacketAuthenticate), a.Marshal()}

	cl := NewClient(ClientConfig{User: "alice", Password: "correct horse"})
	negB, _ := cl.Negotiate()
	chB, _, _ := testServer().Challenge(negB)
	authB, _, _ := cl.Authenticate(chB)
	neg, ch, auth = append(neg, negB), append(ch, chB), append(auth, authB)
	return neg, ch, auth
}

// roundTrip is the body of a parser's fuzz target: what parses re-encodes
// (Marshal) to something that parses to the same message; nothing panics.
func roundTrip[M interface{ Marshal() []byte }](t *testing.T, b []byte, parse func([]byte) (M, error)) {
	t.Helper()
	m, err := parse(b)
	if err != nil {
		return
	}
	m2, err := parse(m.Marshal())
	if err != nil {
		t.Fatalf("re-encoded %+v does not parse: %v", m, err)
	}
	if !reflect.DeepEqual(m, m2) {
		t.Fatalf("round trip: %+v became %+v", m, m2)
	}
}

// fuzzParse is a parser's fuzz target: seeded with seeds, its body roundTrip.
func fuzzParse[M interface{ Marshal() []byte }](f *testing.F, seeds [][]byte, parse func([]byte) (M, error)) {
	addSeeds(f, seeds)
	f.Fuzz(func(t *testing.T, b []byte) { roundTrip(t, b, parse) })
}

func addSeeds(f *testing.F, seeds [][]byte) {
	for _, s := range seeds {
		f.Add(s)
	}
}

// Decode → encode → decode gives the same message; nothing panics.
func FuzzParseNegotiate(f *testing.F) {
	seeds, _, _ := fuzzSeeds(f)
	fuzzParse(f, seeds, ParseNegotiate)
}

func FuzzParseChallenge(f *testing.F) {
	_, seeds, _ := fuzzSeeds(f)
	fuzzParse(f, seeds, ParseChallenge)
}

func FuzzParseAuthenticate(f *testing.F) {
	_, _, seeds := fuzzSeeds(f)
	fuzzParse(f, seeds, ParseAuthenticate)
}

// The server's whole Authenticate path, on arbitrary input, never panics and
// never lets anything in.
func FuzzServerAuthenticate(f *testing.F) {
	_, _, seeds := fuzzSeeds(f)
	addSeeds(f, seeds)
	s := testServer()
	cl := NewClient(ClientConfig{User: "alice", Password: "correct horse"})
	neg, _ := cl.Negotiate()
	f.Fuzz(func(t *testing.T, b []byte) {
		_, st, err := s.Challenge(neg)
		if err != nil {
			t.Fatal(err)
		}
		if res, err := st.Authenticate(b); err == nil {
			t.Fatalf("random AUTHENTICATE accepted: %+v", res)
		}
	})
}
