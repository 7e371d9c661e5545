package session

import (
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/protocol/share"
)

// perUserEnv is a server whose users act as Unix accounts of their own:
// alice as 61001, bob as 61002 (neither needs to exist: the account
// database is the test's), with the share writable by both. It skips the
// test when the process cannot act per user (not root).
func perUserEnv(t *testing.T, mut ...func(*ServerConfig)) *env {
	t.Helper()
	if !share.PerUser() {
		t.Skip("SKIP: per-user identity needs CAP_SETUID and CAP_SETGID (run as root)")
	}
	alice := share.Account{Name: testUser, Uid: 61001, Gid: 61001, Groups: []uint32{61001}}
	bob := share.Account{Name: "bob", Uid: 61002, Gid: 61002, Groups: []uint32{61002}}
	e := newEnv(t, append([]func(*ServerConfig){func(c *ServerConfig) {
		c.Accounts = share.AccountsConfig{Lookup: accountsOf(alice, bob)}
	}}, mut...)...)
	// t.TempDir's parents are 0700: let the accounts through.
	for d := e.share; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o777); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// TestLeaseBreakWaitHoldsNoThread: a write OPEN that breaks another
// client's lease runs on an identity thread (the whole request, Tree.Run)
// but waits for the acknowledgement off it. Many such opens against a
// client that never acknowledges do not hold one OS thread each for the
// break timeout; and each still returns only after its break was
// acknowledged (or timed out), as before.
func TestLeaseBreakWaitHoldsNoThread(t *testing.T) {
	const timeout = 1500 * time.Millisecond
	e := perUserEnv(t, func(c *ServerConfig) { c.Shares[0].LeaseBreakTimeout = timeout })
	holder, writer := e.treeAs("bob", "bob's", "data"), e.treeAs(testUser, testPassword, "data")
	if !holder.Leases() {
		t.Skip("the share grants no leases on this kernel")
	}
	ctx := ctxT(t)

	// The ordering rule, on identity threads: a slow holder's
	// acknowledgement comes before the writer's OPEN returns.
	writeShared(t, filepath.Join(e.share, "f"))
	if _, got, err := holder.Lease(ctx, "f", LeaseRead|LeaseHandle); err != nil || got == 0 {
		t.Fatalf("Lease: %v %v", got, err)
	}
	// acked is set as the handler returns, before the client sends the
	// acknowledgement (a flag, not a channel closed by another goroutine:
	// that goroutine may not have run yet when the OPEN returns).
	var acked atomic.Bool
	holder.OnLeaseBreak(func(b LeaseBreak) LeaseState {
		time.Sleep(200 * time.Millisecond)
		acked.Store(true)
		return b.New
	})
	h, _, err := writer.Open(ctx, "f", syscall.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if !acked.Load() {
		t.Fatal("the write open returned before the holder acknowledged its break")
	}
	writer.CloseHandle(ctx, h)

	// A holder that never acknowledges, and n write opens at once.
	const n = 24
	broke := make(chan struct{}, n)
	never := make(chan struct{})
	t.Cleanup(func() { close(never) })
	holder.OnLeaseBreak(func(b LeaseBreak) LeaseState {
		broke <- struct{}{}
		<-never
		return b.New
	})
	for i := range n {
		name := fmt.Sprintf("g%d", i)
		writeShared(t, filepath.Join(e.share, name))
		if _, got, err := holder.Lease(ctx, name, LeaseRead); err != nil || got == 0 {
			t.Fatalf("Lease %s: %v %v", name, got, err)
		}
	}
	before := share.LiveIdentityThreads()
	start := time.Now()
	took := make(chan time.Duration, n)
	for i := range n {
		go func() {
			h, _, err := writer.Open(ctx, fmt.Sprintf("g%d", i), syscall.O_WRONLY, 0)
			if err != nil {
				t.Error(err)
			} else {
				writer.CloseHandle(ctx, h)
			}
			took <- time.Since(start)
		}()
	}
	for range n {
		select {
		case <-broke:
		case <-time.After(timeout / 2):
			t.Fatal("the holder did not hear every break")
		}
	}
	time.Sleep(100 * time.Millisecond) // every open is now waiting
	live := share.LiveIdentityThreads()
	for range n {
		if d := <-took; d < timeout*9/10 {
			t.Errorf("a write open returned after %v, before its break was acknowledged or the %v timeout", d, timeout)
		}
	}
	if live-before >= n/2 {
		t.Errorf("%d identity threads while %d opens wait for a silent holder (%d before): the waits hold threads", live, n, before)
	}
	t.Logf("identity threads: %d before, %d while %d opens waited", before, live, n)
}

// writeShared makes a file every account may write.
func writeShared(t *testing.T, p string) {
	t.Helper()
	if err := os.WriteFile(p, []byte("x"), 0o666); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(p, 0o666); err != nil {
		t.Fatal(err)
	}
}

// TestTwoUsersRunConcurrently: two users' OPEN and MKDIR requests, each
// run whole on an identity thread (Tree.Run), interleave on the server;
// every file and directory ends up owned by the user whose request made
// it — no request runs in the other's credentials, or the server's.
func TestTwoUsersRunConcurrently(t *testing.T) {
	e := perUserEnv(t)
	users := []struct {
		name, password string
		uid            uint32
	}{{testUser, testPassword, 61001}, {"bob", "bob's", 61002}}
	ctx := ctxT(t)
	const rounds = 40
	var wg sync.WaitGroup
	for _, u := range users {
		for conn := range 2 { // two sessions each, so requests overlap
			tr := e.treeAs(u.name, u.password, "data")
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range rounds {
					name := fmt.Sprintf("%s-%d-%d", u.name, conn, i)
					h, _, err := tr.Open(ctx, name, syscall.O_CREAT|syscall.O_WRONLY, 0o644)
					if err != nil {
						t.Error(err)
						return
					}
					tr.CloseHandle(ctx, h)
					if _, err := tr.Mkdir(ctx, name+".d", 0o755); err != nil {
						t.Error(err)
						return
					}
				}
			}()
		}
	}
	wg.Wait()
	ents, err := os.ReadDir(e.share)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, ent := range ents {
		var st syscall.Stat_t
		if err := syscall.Lstat(filepath.Join(e.share, ent.Name()), &st); err != nil {
			t.Fatal(err)
		}
		for _, u := range users {
			if len(ent.Name()) > len(u.name) && ent.Name()[:len(u.name)+1] == u.name+"-" {
				n++
				if st.Uid != u.uid || st.Gid != u.uid {
					t.Errorf("%s is %d:%d, want %s's %d:%d", ent.Name(), st.Uid, st.Gid, u.name, u.uid, u.uid)
				}
			}
		}
	}
	if want := len(users) * 2 * rounds * 2; n != want {
		t.Errorf("%d files and directories, want %d", n, want)
	}
}
