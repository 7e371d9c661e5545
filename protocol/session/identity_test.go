package session

import (
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/share"
)

// accountsOf is an account database of the given accounts, by name.
func accountsOf(accts ...share.Account) func(string) (share.Account, error) {
	return func(name string) (share.Account, error) {
		for _, a := range accts {
			if a.Name == name {
				return a, nil
			}
		}
		return share.Account{}, fmt.Errorf("%w: %q", share.ErrNoAccount, name)
	}
}

// The client learns at tree connect which account its operations run as
// on the server (docs/session.md, "Identity").
func TestTreeAccount(t *testing.T) {
	alice := share.Account{Name: "alice-unix", Uid: 61001, Gid: 61001, Groups: []uint32{61001, 7}}
	e := newEnv(t, func(c *ServerConfig) {
		c.Accounts = share.AccountsConfig{Map: map[string]string{testUser: "alice-unix"}, Lookup: accountsOf(alice)}
	})
	tr := e.tree("data")
	want := alice
	if !share.PerUser() {
		want = share.NewAccounts(share.AccountsConfig{}).Self()
	}
	if got := tr.Account(); !reflect.DeepEqual(got, want) {
		t.Errorf("Tree.Account() = %+v, want %+v", got, want)
	}
	if tr.SharedAccount() != !share.PerUser() {
		t.Errorf("SharedAccount() = %v with PerUser() %v", tr.SharedAccount(), share.PerUser())
	}
}

// A user whose password is right but who has no Unix account (and no
// guest account is configured) is refused at logon with its own error and
// a log line naming it; with a guest account the user gets in as the
// guest.
func TestNoAccount(t *testing.T) {
	if !share.PerUser() {
		t.Skip("SKIP: not root: every user acts as the server's account, so none lacks one")
	}
	e := newEnv(t, func(c *ServerConfig) { c.Accounts = share.AccountsConfig{Lookup: accountsOf()} })
	if _, err := e.dial(testUser, testPassword); !errors.Is(err, ErrNoAccount) || !errors.Is(err, StatusNoSuchUser) {
		t.Fatalf("logon without an account: %v, want ErrNoAccount", err)
	}
	if !e.waitLogged("logon refused: the user has no Unix account") {
		t.Error("no log line for the refused logon")
	}
	if _, err := e.dial(testUser, "wrong"); !errors.Is(err, ErrLogonFailure) {
		t.Errorf("wrong password: %v, want ErrLogonFailure whatever the account database says", err)
	}
	nobody := share.Account{Name: "nobody", Uid: 65534, Gid: 65534}
	g := newEnv(t, func(c *ServerConfig) { c.Accounts = share.AccountsConfig{Guest: "nobody", Lookup: accountsOf(nobody)} })
	if got := g.tree("data").Account(); got.Uid != 65534 {
		t.Errorf("guest: the tree acts as %+v, want nobody", got)
	}
}

// A user who acts as root is refused at tree connect unless the share
// allows root, with a log line.
func TestRootRefusedAtTreeConnect(t *testing.T) {
	if !share.PerUser() {
		t.Skip("SKIP: not root: no user can act as root")
	}
	root := share.Account{Name: "root"}
	e := newEnv(t, func(c *ServerConfig) {
		c.Accounts = share.AccountsConfig{Map: map[string]string{testUser: "root"}, Lookup: accountsOf(root)}
		c.Shares = append(c.Shares, share.Config{Name: "admin", Path: e0(c), AllowRoot: true})
	})
	c := e.client()
	if _, err := c.TreeConnect(ctxT(t), "data"); !errors.Is(err, protocol.StatusAccessDenied) {
		t.Errorf("root on a share without allow_root: %v, want ACCESS_DENIED", err)
	}
	if !e.waitLogged("tree connect refused: user ") && e.waitLogged("which is uid 0 (root)") {
		t.Error("no log line for the refused tree connect")
	}
	tr, err := c.TreeConnect(ctxT(t), "admin")
	if err != nil || tr.Account().Uid != 0 {
		t.Errorf("root on a share with allow_root: %v %+v", err, tr)
	}
}
