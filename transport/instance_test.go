package transport

import (
	"bytes"
	"errors"
	"testing"
)

func TestInstanceFor(t *testing.T) {
	for _, tc := range []struct {
		addr       string
		host, disc []byte
		back       string
	}{
		{"127.0.0.1:4450", []byte{127, 0, 0, 1}, []byte{0x11, 0x62}, "127.0.0.1:4450"},
		{"10.1.2.3:0", []byte{10, 1, 2, 3}, []byte{0, 0}, "10.1.2.3:0"},
		{"[::1]:65535", append(make([]byte, 15), 1), []byte{0xff, 0xff}, "[::1]:65535"},
		{"[::ffff:192.0.2.1]:80", []byte{192, 0, 2, 1}, []byte{0, 80}, "192.0.2.1:80"},
	} {
		in, err := InstanceFor(tc.addr)
		if err != nil {
			t.Errorf("InstanceFor(%q): %v", tc.addr, err)
			continue
		}
		if !bytes.Equal(in.HostAddress, tc.host) || !bytes.Equal(in.Discriminator, tc.disc) {
			t.Errorf("InstanceFor(%q) = %x/%x, want %x/%x", tc.addr, in.HostAddress, in.Discriminator, tc.host, tc.disc)
		}
		if a, err := in.Addr(); err != nil || a != tc.back || in.String() != tc.back {
			t.Errorf("InstanceFor(%q).Addr() = %q, %v; String %q; want %q", tc.addr, a, err, in.String(), tc.back)
		}
	}
	for _, bad := range []string{"", "localhost:80", "1.2.3.4", "1.2.3.4:70000", "1.2.3.4:-1", "host:x"} {
		if in, err := InstanceFor(bad); err == nil {
			t.Errorf("InstanceFor(%q) = %v, want an error", bad, in)
		}
	}
	for _, in := range []Instance{
		{HostAddress: []byte{1, 2, 3}, Discriminator: []byte{0, 1}},
		{HostAddress: []byte{1, 2, 3, 4}, Discriminator: []byte{1}},
		{},
	} {
		if a, err := in.Addr(); err == nil {
			t.Errorf("%x/%x.Addr() = %q, want an error", in.HostAddress, in.Discriminator, a)
		}
		if in.String() == "" {
			t.Errorf("empty String for %x/%x", in.HostAddress, in.Discriminator)
		}
	}
}

func TestCompletionErr(t *testing.T) {
	if err := (Completion{Op: OpSend}).Err(); err != nil {
		t.Errorf("success: %v", err)
	}
	err := Completion{Op: OpWrite, Status: StatusRemoteAccess}.Err()
	var ce *CompletionError
	if !errors.As(err, &ce) || ce.Op != OpWrite || ce.Status != StatusRemoteAccess {
		t.Fatalf("Err() = %#v", err)
	}
	if got, want := err.Error(), "RDMA_WRITE: remote access error"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
	for s := StatusSuccess; s <= StatusTransportError; s++ {
		if s.String() == "" || s.String()[0] == 'S' {
			t.Errorf("Status %d has no name: %q", s, s.String())
		}
	}
	if got := Status(200).String(); got != "Status(200)" {
		t.Errorf("unknown status: %q", got)
	}
	for o, want := range map[Op]string{OpSend: "SEND", OpWrite: "RDMA_WRITE", OpRecv: "RECV", 0: "Op(0)", 9: "Op(9)"} {
		if got := o.String(); got != want {
			t.Errorf("Op(%d).String() = %q, want %q", o, got, want)
		}
	}
}

func TestConfigDefaults(t *testing.T) {
	got := Config{}.WithDefaults()
	want := Config{SendQueueDepth: 256, RecvQueueDepth: 256, MaxSGE: 16, MaxMessageSize: 16 << 20}
	if got != want {
		t.Errorf("Config{}.WithDefaults() = %+v, want %+v", got, want)
	}
	set := Config{SendQueueDepth: 1, RecvQueueDepth: 2, MaxSGE: 3, MaxMessageSize: 4}
	if set.WithDefaults() != set {
		t.Errorf("WithDefaults changed set fields: %+v", set.WithDefaults())
	}
}
