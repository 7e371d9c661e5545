package protocol

import (
	"bytes"
	"testing"
)

// fragmentSequence splits w as a sender does for receive buffers of
// recv bytes: the first message and its FRAGMENTs, decoded.
func fragmentSequence(t *testing.T, w WriteRequest, recv int) []Request {
	t.Helper()
	per := FragmentData(recv)
	first := w.Fragment(per)
	msgs := [][]byte{first.Append(nil)}
	for done := per; done < len(w.Data); done += per {
		n := min(per, len(w.Data)-done)
		h := NewFragmentHeader(&first.Header, w.Header.Offset+uint64(done), uint32(n), 1)
		msgs = append(msgs, (&WriteRequest{Header: h, Data: w.Data[done : done+n]}).Append(nil))
	}
	if len(msgs) != Fragments(len(w.Data), recv) {
		t.Fatalf("%d messages, Fragments says %d", len(msgs), Fragments(len(w.Data), recv))
	}
	out := make([]Request, len(msgs))
	for i, m := range msgs {
		r, err := DecodeRequest(m)
		if err != nil {
			t.Fatalf("message %d: %v", i, err)
		}
		out[i] = r
	}
	return out
}

func TestAssembly(t *testing.T) {
	const recv = HeaderSize + 100
	data := seq(1, 250)
	w := NewWriteRequest(3, 1000, data, 1, InterruptMode(7, 9))
	good := func() []Request { return fragmentSequence(t, w, recv) }
	if n := len(good()); n != 3 {
		t.Fatalf("250 bytes in 100-byte buffers: %d messages", n)
	}

	var a Assembly
	seqs := good()
	if err := a.Start(&seqs[0], recv, 1<<20); err != nil {
		t.Fatal(err)
	}
	var got []byte
	got = append(got, seqs[0].Data...)
	for i, r := range seqs[1:] {
		done, err := a.Next(&r)
		if err != nil {
			t.Fatalf("fragment %d: %v", i+1, err)
		}
		got = append(got, r.Data...)
		if done != (i == len(seqs)-2) {
			t.Fatalf("fragment %d: done %v", i+1, done)
		}
	}
	if a.Open() || a.Messages() != 3 || !bytes.Equal(got, data) || a.First().Length != 250 {
		t.Fatalf("after the sequence: open %v, %d messages, data equal %v", a.Open(), a.Messages(), bytes.Equal(got, data))
	}

	// started starts a on a fresh good sequence, which it returns.
	started := func(a *Assembly) []Request {
		s := good()
		a.Start(&s[0], recv, 1<<20)
		return s
	}

	// Each broken rule is a *FieldError naming the rule.
	for _, c := range []struct {
		name       string
		run        func(a *Assembly) error
		msg, field string
	}{
		{"first fragment short of a buffer", func(a *Assembly) error {
			r := seqs[0]
			r.Data = r.Data[:99]
			return a.Start(&r, recv, 1<<20)
		}, "WRITE", "Length"},
		{"longer than the largest write", func(a *Assembly) error { s := good(); return a.Start(&s[0], recv, 200) }, "WRITE", "Length"},
		{"a second first fragment", func(a *Assembly) error {
			s := started(a)
			return a.Start(&s[0], recv, 1<<20)
		}, "WRITE", "Flags"},
		{"another request in between", func(a *Assembly) error {
			started(a)
			rd, _ := DecodeRequest(headerBytes(NewReadRequest(3, 0, 10, 1, 1, 1, InterruptMode(1, 1))))
			_, err := a.Next(&rd)
			return err
		}, "FRAGMENT", "Opcode"},
		{"another write's fragment", func(a *Assembly) error {
			started(a)
			other := fragmentSequence(t, NewWriteRequest(3, 1000, data, 1, InterruptMode(8, 10)), recv)
			_, err := a.Next(&other[1])
			return err
		}, "FRAGMENT", "Offset"},
		{"out of order", func(a *Assembly) error {
			s := started(a)
			_, err := a.Next(&s[2])
			return err
		}, "FRAGMENT", "Offset"},
		{"a middle fragment short", func(a *Assembly) error {
			s := fragmentSequence(t, NewWriteRequest(3, 1000, seq(1, 350), 1, InterruptMode(7, 9)), recv)
			a.Start(&s[0], recv, 1<<20)
			r := s[1]
			r.Data = r.Data[:50]
			r.Header.Length = 50
			_, err := a.Next(&r)
			return err
		}, "FRAGMENT", "Length"},
		{"the last fragment too long", func(a *Assembly) error {
			s := started(a)
			a.Next(&s[1])
			r := s[2]
			r.Header.Length++
			_, err := a.Next(&r)
			return err
		}, "FRAGMENT", "Length"},
		{"a FRAGMENT with no write open", func(a *Assembly) error { return a.Unexpected() }, "FRAGMENT", "Opcode"},
	} {
		var a Assembly
		wantFieldErr(t, c.name, c.run(&a), c.msg, c.field)
	}
}
