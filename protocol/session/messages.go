package session

// Message bodies of the session channel, one type per request and response
// shape. Every body is a sequence of fields in the order written here
// (docs/session.md lists them); strings are u16-counted, blobs u32-counted.

// message is a frame body.
type message interface {
	encode(*encoder)
	decode(*decoder)
}

// sizeHinter is implemented by bodies that can be large (READ responses,
// WRITE requests), so that frames are allocated once at their final size.
type sizeHinter interface{ sizeHint() int }

func (m *dataMsg) sizeHint() int  { return 4 + len(m.Data) }
func (m *writeReq) sizeHint() int { return 8 + 8 + 4 + len(m.Data) }

// frameCap is the capacity to allocate for a frame carrying body, with room
// to seal it in place.
func frameCap(body message) int {
	if h, ok := body.(sizeHinter); ok {
		return HeaderSize + sealOverhead + h.sizeHint()
	}
	return HeaderSize + sealOverhead + 128
}

// marshal encodes m into a new byte slice.
func marshal(m message) []byte {
	var e encoder
	if m != nil {
		m.encode(&e)
	}
	return e.b
}

// unmarshal decodes b into m, rejecting short input and trailing bytes.
func unmarshal(b []byte, m message) error {
	d := decoder{b: b}
	m.decode(&d)
	return d.finish()
}

// empty is the body of requests and responses that carry nothing.
type empty struct{}

func (*empty) encode(*encoder) {}
func (*empty) decode(*decoder) {}

// tokenMsg carries an NTLMSSP token (SESSION_SETUP request and response).
type tokenMsg struct{ Token []byte }

func (m *tokenMsg) encode(e *encoder) { e.blob(m.Token) }
func (m *tokenMsg) decode(d *decoder) { m.Token = d.blob() }

// sessionSetupDone is the final SESSION_SETUP response body: the server's
// name and its sealing answer (seal.go).
type sessionSetupDone struct {
	ServerName string
	Seal       sealAnswer
}

func (m *sessionSetupDone) encode(e *encoder) { e.str(m.ServerName); m.Seal.encode(e) }
func (m *sessionSetupDone) decode(d *decoder) { m.ServerName = d.str(); m.Seal.decode(d) }

// nameMsg carries one name: a share (TREE_CONNECT), a path (GETATTR,
// RMDIR, UNLINK, READLINK, LISTXATTR), a pipe (PIPE_OPEN).
type nameMsg struct{ Name string }

func (m *nameMsg) encode(e *encoder) { e.str(m.Name) }
func (m *nameMsg) decode(d *decoder) { m.Name = d.str() }

// Tree flags of a TREE_CONNECT response.
const (
	treeFlagReadOnly uint32 = 1
	// treeFlagSeal: the share seals (encrypt desired or required); every
	// frame after this response is sealed, both ways.
	treeFlagSeal uint32 = 2
)

type treeConnectResp struct {
	TreeID uint32
	Flags  uint32
}

func (m *treeConnectResp) encode(e *encoder) { e.u32(m.TreeID); e.u32(m.Flags) }
func (m *treeConnectResp) decode(d *decoder) { m.TreeID = d.u32(); m.Flags = d.u32() }

type attrMsg struct{ Attr Attr }

func (m *attrMsg) encode(e *encoder) { m.Attr.encode(e) }
func (m *attrMsg) decode(d *decoder) { m.Attr.decode(d) }

type setAttrReq struct {
	Path   string
	Handle Handle // used when non-zero; Path is then ignored
	In     SetAttrIn
}

func (m *setAttrReq) encode(e *encoder) { e.str(m.Path); e.u64(uint64(m.Handle)); m.In.encode(e) }
func (m *setAttrReq) decode(d *decoder) {
	m.Path = d.str()
	m.Handle = Handle(d.u64())
	m.In.decode(d)
}

// readDirReq asks for the entries of Path whose names sort after After
// (byte order), at most MaxBytes of encoded entries.
type readDirReq struct {
	Path     string
	After    string
	MaxBytes uint32
}

func (m *readDirReq) encode(e *encoder) { e.str(m.Path); e.str(m.After); e.u32(m.MaxBytes) }
func (m *readDirReq) decode(d *decoder) { m.Path = d.str(); m.After = d.str(); m.MaxBytes = d.u32() }

type readDirResp struct {
	More    bool
	Entries []DirEntry
}

func (m *readDirResp) encode(e *encoder) {
	e.bool(m.More)
	e.u32(uint32(len(m.Entries)))
	for i := range m.Entries {
		e.str(m.Entries[i].Name)
		m.Entries[i].Attr.encode(e)
	}
}

func (m *readDirResp) decode(d *decoder) {
	m.More = d.bool()
	n := d.u32()
	// Each entry takes at least 2+attrWireSize bytes: bound the
	// allocation by what the body can hold.
	if uint64(n)*(2+attrWireSize) > uint64(len(d.b)) {
		d.need(int(min(uint64(n)*(2+attrWireSize), 1<<31)), "directory entries")
		return
	}
	m.Entries = make([]DirEntry, 0, n)
	for range n {
		var de DirEntry
		de.Name = d.str()
		de.Attr.decode(d)
		if d.err != nil {
			return
		}
		m.Entries = append(m.Entries, de)
	}
}

type mkdirReq struct {
	Path string
	Mode uint32
}

func (m *mkdirReq) encode(e *encoder) { e.str(m.Path); e.u32(m.Mode) }
func (m *mkdirReq) decode(d *decoder) { m.Path = d.str(); m.Mode = d.u32() }

// openReq: Flags are Linux open(2) flags (O_ACCMODE, O_CREAT, O_EXCL,
// O_TRUNC, O_APPEND, O_DIRECTORY, O_NOFOLLOW, O_SYNC, O_DSYNC); others are
// ignored.
type openReq struct {
	Path  string
	Flags uint32
	Mode  uint32
}

func (m *openReq) encode(e *encoder) { e.str(m.Path); e.u32(m.Flags); e.u32(m.Mode) }
func (m *openReq) decode(d *decoder) { m.Path = d.str(); m.Flags = d.u32(); m.Mode = d.u32() }

type openResp struct {
	Handle Handle
	Attr   Attr
}

func (m *openResp) encode(e *encoder) { e.u64(uint64(m.Handle)); m.Attr.encode(e) }
func (m *openResp) decode(d *decoder) { m.Handle = Handle(d.u64()); m.Attr.decode(d) }

type handleMsg struct{ Handle Handle }

func (m *handleMsg) encode(e *encoder) { e.u64(uint64(m.Handle)) }
func (m *handleMsg) decode(d *decoder) { m.Handle = Handle(d.u64()) }

type readReq struct {
	Handle Handle
	Offset uint64
	Length uint32
}

func (m *readReq) encode(e *encoder) { e.u64(uint64(m.Handle)); e.u64(m.Offset); e.u32(m.Length) }
func (m *readReq) decode(d *decoder) {
	m.Handle = Handle(d.u64())
	m.Offset = d.u64()
	m.Length = d.u32()
}

// dataMsg carries bytes: a READ response, a READLINK response (the target),
// a GETXATTR response, a PIPE_TRANSACT request and response, an IOCTL
// response.
type dataMsg struct{ Data []byte }

func (m *dataMsg) encode(e *encoder) { e.blob(m.Data) }
func (m *dataMsg) decode(d *decoder) { m.Data = d.blob() }

type writeReq struct {
	Handle Handle
	Offset uint64
	Data   []byte
}

func (m *writeReq) encode(e *encoder) { e.u64(uint64(m.Handle)); e.u64(m.Offset); e.blob(m.Data) }
func (m *writeReq) decode(d *decoder) {
	m.Handle = Handle(d.u64())
	m.Offset = d.u64()
	m.Data = d.blob()
}

type countMsg struct{ Count uint32 }

func (m *countMsg) encode(e *encoder) { e.u32(m.Count) }
func (m *countMsg) decode(d *decoder) { m.Count = d.u32() }

// twoPathReq: RENAME (Old, New, Flags = RENAME_NOREPLACE|RENAME_EXCHANGE),
// LINK (Old, New), SYMLINK (Old = target text, New = link path).
type twoPathReq struct {
	Old, New string
	Flags    uint32
}

func (m *twoPathReq) encode(e *encoder) { e.str(m.Old); e.str(m.New); e.u32(m.Flags) }
func (m *twoPathReq) decode(d *decoder) { m.Old = d.str(); m.New = d.str(); m.Flags = d.u32() }

type statFSMsg struct{ StatFS StatFS }

func (m *statFSMsg) encode(e *encoder) { m.StatFS.encode(e) }
func (m *statFSMsg) decode(d *decoder) { m.StatFS.decode(d) }

type fsyncReq struct {
	Handle   Handle
	Datasync bool
}

func (m *fsyncReq) encode(e *encoder) { e.u64(uint64(m.Handle)); e.bool(m.Datasync) }
func (m *fsyncReq) decode(d *decoder) { m.Handle = Handle(d.u64()); m.Datasync = d.bool() }

// xattrReq: GETXATTR and REMOVEXATTR (Path, Name), SETXATTR (all fields;
// Flags are XATTR_CREATE / XATTR_REPLACE).
type xattrReq struct {
	Path  string
	Name  string
	Value []byte
	Flags uint32
}

func (m *xattrReq) encode(e *encoder) { e.str(m.Path); e.str(m.Name); e.blob(m.Value); e.u32(m.Flags) }
func (m *xattrReq) decode(d *decoder) {
	m.Path = d.str()
	m.Name = d.str()
	m.Value = d.blob()
	m.Flags = d.u32()
}

type namesMsg struct{ Names []string }

func (m *namesMsg) encode(e *encoder) {
	e.u32(uint32(len(m.Names)))
	for _, n := range m.Names {
		e.str(n)
	}
}

func (m *namesMsg) decode(d *decoder) {
	n := d.u32()
	if uint64(n)*2 > uint64(len(d.b)) {
		d.need(int(min(uint64(n)*2, 1<<31)), "names")
		return
	}
	m.Names = make([]string, 0, n)
	for range n {
		s := d.str()
		if d.err != nil {
			return
		}
		m.Names = append(m.Names, s)
	}
}

// ioctlReq is an FSCTL on an open handle.
type ioctlReq struct {
	Handle  Handle
	CtlCode uint32
	Input   []byte
}

func (m *ioctlReq) encode(e *encoder) { e.u64(uint64(m.Handle)); e.u32(m.CtlCode); e.blob(m.Input) }
func (m *ioctlReq) decode(d *decoder) {
	m.Handle = Handle(d.u64())
	m.CtlCode = d.u32()
	m.Input = d.blob()
}

// pipeTransactReq is one message written to a pipe handle; the response is
// a dataMsg with the pipe's answer.
type pipeTransactReq struct {
	Handle Handle
	Data   []byte
}

func (m *pipeTransactReq) encode(e *encoder) { e.u64(uint64(m.Handle)); e.blob(m.Data) }
func (m *pipeTransactReq) decode(d *decoder) { m.Handle = Handle(d.u64()); m.Data = d.blob() }

// bodies lists, per command, constructors for its request and successful
// response bodies. Filled once; used by the server's dispatcher for
// decoding and by the fuzz targets.
var bodies = [cmdLimit]struct{ req, resp func() message }{
	CmdSessionSetup:   {func() message { return new(setupReq) }, func() message { return new(tokenMsg) }},
	CmdLogoff:         {func() message { return new(empty) }, func() message { return new(empty) }},
	CmdTreeConnect:    {func() message { return new(nameMsg) }, func() message { return new(treeConnectResp) }},
	CmdTreeDisconnect: {func() message { return new(empty) }, func() message { return new(empty) }},
	CmdGetAttr:        {func() message { return new(nameMsg) }, func() message { return new(attrMsg) }},
	CmdSetAttr:        {func() message { return new(setAttrReq) }, func() message { return new(attrMsg) }},
	CmdReadDir:        {func() message { return new(readDirReq) }, func() message { return new(readDirResp) }},
	CmdMkdir:          {func() message { return new(mkdirReq) }, func() message { return new(attrMsg) }},
	CmdRmdir:          {func() message { return new(nameMsg) }, func() message { return new(empty) }},
	CmdOpen:           {func() message { return new(openReq) }, func() message { return new(openResp) }},
	CmdClose:          {func() message { return new(handleMsg) }, func() message { return new(empty) }},
	CmdRead:           {func() message { return new(readReq) }, func() message { return new(dataMsg) }},
	CmdWrite:          {func() message { return new(writeReq) }, func() message { return new(countMsg) }},
	CmdUnlink:         {func() message { return new(nameMsg) }, func() message { return new(empty) }},
	CmdRename:         {func() message { return new(twoPathReq) }, func() message { return new(empty) }},
	CmdSymlink:        {func() message { return new(twoPathReq) }, func() message { return new(attrMsg) }},
	CmdReadlink:       {func() message { return new(nameMsg) }, func() message { return new(dataMsg) }},
	CmdLink:           {func() message { return new(twoPathReq) }, func() message { return new(attrMsg) }},
	CmdStatFS:         {func() message { return new(empty) }, func() message { return new(statFSMsg) }},
	CmdFsync:          {func() message { return new(fsyncReq) }, func() message { return new(empty) }},
	CmdGetXattr:       {func() message { return new(xattrReq) }, func() message { return new(dataMsg) }},
	CmdSetXattr:       {func() message { return new(xattrReq) }, func() message { return new(empty) }},
	CmdListXattr:      {func() message { return new(nameMsg) }, func() message { return new(namesMsg) }},
	CmdRemoveXattr:    {func() message { return new(xattrReq) }, func() message { return new(empty) }},
	CmdIoctl:          {func() message { return new(ioctlReq) }, func() message { return new(dataMsg) }},
	CmdPipeOpen:       {func() message { return new(nameMsg) }, func() message { return new(handleMsg) }},
	CmdPipeTransact:   {func() message { return new(pipeTransactReq) }, func() message { return new(dataMsg) }},
	CmdEcho:           {func() message { return new(empty) }, func() message { return new(empty) }},
}
