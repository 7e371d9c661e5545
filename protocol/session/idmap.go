package session

import (
	"context"
	"errors"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/share"
)

// CmdIDMap answers one name ↔ id question about the server host's accounts
// (its passwd and group databases), so a client can show owners under the
// local ids of the same names (NFSv4's idmapping, Samba's LSA lookups). It
// is session-scoped: the TreeID is ignored.
const CmdIDMap Command = 45

// IDKind is what an IDMAP request asks.
type IDKind uint32

// IDMAP questions.
const (
	IDUserByID    IDKind = 1 // the user name of uid ID
	IDGroupByID   IDKind = 2 // the group name of gid ID
	IDUserByName  IDKind = 3 // the uid of user Name
	IDGroupByName IDKind = 4 // the gid of group Name
)

// StatusNoneMapped answers an IDMAP question about an id or name the
// server's account databases do not have (MS-ERREF: "None of the
// information to be translated has been translated").
const StatusNoneMapped = protocol.Status(0xC0000073)

// idMapMsg is the IDMAP request and its response: the request names Kind
// and the ID (by id) or the Name (by name); the response repeats Kind and
// carries both.
type idMapMsg struct {
	Kind uint32
	ID   uint32
	Name string
}

func (m *idMapMsg) code(c coder) { c.u32(&m.Kind); c.u32(&m.ID); c.str(&m.Name) }

func init() {
	register(CmdIDMap, "IDMAP", func() message { return new(idMapMsg) }, func() message { return new(idMapMsg) })
}

// MapID asks the server to translate an account id to its name or a name to
// its id. An unknown id or name is StatusNoneMapped.
func (c *Client) MapID(ctx context.Context, kind IDKind, id uint32, name string) (uint32, string, error) {
	var r idMapMsg
	err := c.call(ctx, CmdIDMap, 0, &idMapMsg{Kind: uint32(kind), ID: id, Name: name}, &r)
	if err == nil && r.Kind != uint32(kind) {
		err = protocol.StatusInvalidNetworkResp
	}
	return r.ID, r.Name, err
}

// MapID is the session's MapID (the question is not about the share).
func (t *Tree) MapID(ctx context.Context, kind IDKind, id uint32, name string) (uint32, string, error) {
	return t.c.MapID(ctx, kind, id, name)
}

// mapID answers an IDMAP request from the server host's account databases,
// through the Accounts logons use.
func (s *Server) mapID(r *idMapMsg) (message, error) {
	var err error
	out := *r
	switch IDKind(r.Kind) {
	case IDUserByID:
		out.Name, err = s.accounts.UserName(r.ID)
	case IDGroupByID:
		out.Name, err = s.accounts.GroupName(r.ID)
	case IDUserByName:
		out.ID, err = s.accounts.UserID(r.Name)
	case IDGroupByName:
		out.ID, err = s.accounts.GroupID(r.Name)
	default:
		return nil, protocol.StatusInvalidParameter
	}
	if errors.Is(err, share.ErrNoName) {
		return nil, StatusNoneMapped
	}
	if err != nil {
		return nil, err
	}
	return &out, nil
}
