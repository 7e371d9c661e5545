package fs

import (
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
)

func TestSetIDCleared(t *testing.T) {
	for _, tc := range []struct {
		mode, want uint32
		ok         bool
	}{
		{syscall.S_IFREG | 0o6777, syscall.S_IFREG | 0o777, true},
		{syscall.S_IFREG | 0o4755, syscall.S_IFREG | 0o755, true},
		{syscall.S_IFREG | 0o2755, syscall.S_IFREG | 0o755, true},  // group execute: set-group-ID goes
		{syscall.S_IFREG | 0o6745, syscall.S_IFREG | 0o2745, true}, // none: it stays (mandatory locking's mark)
		{syscall.S_IFREG | 0o2745, syscall.S_IFREG | 0o2745, false},
		{syscall.S_IFREG | 0o777, syscall.S_IFREG | 0o777, false},
		{syscall.S_IFDIR | 0o2775, syscall.S_IFDIR | 0o2775, false}, // only regular files
	} {
		if got, ok := setIDCleared(tc.mode); got != tc.want || ok != tc.ok {
			t.Errorf("setIDCleared(%o) = %o, %v; want %o, %v", tc.mode, got, ok, tc.want, tc.ok)
		}
	}
}

// killSeen is a raw filesystem that records whether the node API would
// find the request flagged *_KILL_SUIDGID (what rawFS keeps).
type killSeen struct {
	fuse.RawFileSystem
	x    *requestExtras
	seen []bool
}

func (k *killSeen) look(cancel <-chan struct{}) {
	e, _ := k.x.of(&fuse.Context{Cancel: cancel})
	k.seen = append(k.seen, e.killSetID)
}

func (k *killSeen) Open(cancel <-chan struct{}, in *fuse.OpenIn, out *fuse.OpenOut) fuse.Status {
	k.look(cancel)
	return fuse.OK
}

func (k *killSeen) Create(cancel <-chan struct{}, in *fuse.CreateIn, name string, out *fuse.CreateOut) fuse.Status {
	k.look(cancel)
	return fuse.OK
}

func (k *killSeen) Write(cancel <-chan struct{}, in *fuse.WriteIn, data []byte) (uint32, fuse.Status) {
	k.look(cancel)
	return uint32(len(data)), fuse.OK
}

// TestRawFSKeepsKillFlags: the kernel's WRITE_KILL_SUIDGID and
// OPEN_KILL_SUIDGID reach the node API (for the request they came with
// only), which go-fuse's would not pass on.
func TestRawFSKeepsKillFlags(t *testing.T) {
	x := newRequestExtras()
	k := &killSeen{RawFileSystem: fuse.NewDefaultRawFileSystem(), x: x}
	r := &rawFS{RawFileSystem: k, x: x}
	c := make(chan struct{})
	r.Open(c, &fuse.OpenIn{Flags: syscall.O_WRONLY | syscall.O_TRUNC, Mode: fuse.OPEN_KILL_SUIDGID}, &fuse.OpenOut{})
	r.Open(c, &fuse.OpenIn{Flags: syscall.O_WRONLY | syscall.O_TRUNC}, &fuse.OpenOut{})
	r.Create(c, &fuse.CreateIn{Flags: syscall.O_WRONLY | syscall.O_TRUNC, OpenFlags: fuse.OPEN_KILL_SUIDGID}, "f", &fuse.CreateOut{})
	r.Create(c, &fuse.CreateIn{Flags: syscall.O_WRONLY}, "f", &fuse.CreateOut{})
	r.Write(c, &fuse.WriteIn{WriteFlags: fuse.WRITE_KILL_SUIDGID}, []byte("x"))
	r.Write(c, &fuse.WriteIn{WriteFlags: fuse.WRITE_KILL_SUIDGID | fuse.WRITE_CACHE}, []byte("x"))
	r.Write(c, &fuse.WriteIn{Flags: syscall.O_APPEND}, []byte("x"))
	r.Write(c, &fuse.WriteIn{}, []byte("x"))
	want := []bool{true, false, true, false, true, true, false, false}
	if len(k.seen) != len(want) {
		t.Fatalf("seen %v, want %v", k.seen, want)
	}
	for i := range want {
		if k.seen[i] != want[i] {
			t.Errorf("seen %v, want %v", k.seen, want)
			break
		}
	}
	if _, ok := x.of(&fuse.Context{Cancel: c}); ok {
		t.Error("a request's extras outlive it")
	}
}
