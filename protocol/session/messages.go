package session

// Message bodies of the session channel, one type per request and response
// shape. Every body is a sequence of fields in the order written here
// (docs/session.md lists them); strings are u16-counted, blobs u32-counted.

// message is a frame body: code lists its fields, in wire order, to an
// encoder or a decoder.
type message interface{ code(coder) }

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
		m.code(&e)
	}
	return e.b
}

// unmarshal decodes b into m, rejecting short input and trailing bytes.
func unmarshal(b []byte, m message) error {
	d := decoder{b: b}
	m.code(&d)
	return d.finish()
}

// handle codes a Handle (a u64).
func handle(c coder, h *Handle) { c.u64((*uint64)(h)) }

// empty is the body of requests and responses that carry nothing.
type empty struct{}

func (*empty) code(coder) {}

// tokenMsg carries an NTLMSSP token (SESSION_SETUP request and response).
type tokenMsg struct{ Token []byte }

func (m *tokenMsg) code(c coder) { c.blob(&m.Token) }

// sessionSetupDone is the final SESSION_SETUP response body: the server's
// name and its sealing answer (seal.go).
type sessionSetupDone struct {
	ServerName string
	Seal       sealAnswer
}

func (m *sessionSetupDone) code(c coder) { c.str(&m.ServerName); m.Seal.code(c) }

// nameMsg carries one name: a share (TREE_CONNECT), a path (GETATTR,
// RMDIR, UNLINK, READLINK, LISTXATTR), a pipe (PIPE_OPEN).
type nameMsg struct{ Name string }

func (m *nameMsg) code(c coder) { c.str(&m.Name) }

// Tree flags of a TREE_CONNECT response.
const (
	treeFlagReadOnly uint32 = 1
	// treeFlagSeal: the share seals (encrypt desired or required); every
	// frame after this response is sealed, both ways.
	treeFlagSeal uint32 = 2
	// treeFlagSharedAccount: the server cannot act per user (it is not
	// root); every user acts as the server's own account, the one named.
	treeFlagSharedAccount uint32 = 4
)

// treeConnectResp answers TREE_CONNECT: the tree's id, its flags and the
// account the server acts as for it (docs/session.md, "Identity").
type treeConnectResp struct {
	TreeID  uint32
	Flags   uint32
	Account Account
}

func (m *treeConnectResp) code(c coder) {
	c.u32(&m.TreeID)
	c.u32(&m.Flags)
	codeAccount(c, &m.Account)
}

type attrMsg struct{ Attr Attr }

func (m *attrMsg) code(c coder) { codeAttr(c, &m.Attr) }

type setAttrReq struct {
	Path   string
	Handle Handle // used when non-zero; Path is then ignored
	In     SetAttrIn
}

func (m *setAttrReq) code(c coder) { c.str(&m.Path); handle(c, &m.Handle); codeSetAttrIn(c, &m.In) }

// readDirReq asks for the entries of Path whose names sort after After
// (byte order), at most MaxBytes of encoded entries. Lease requests may
// follow: Want for the directory, EntryWant for each entry.
type readDirReq struct {
	Path     string
	After    string
	MaxBytes uint32
	leaseTail
	EntryWant uint32
}

func (m *readDirReq) code(c coder) {
	c.str(&m.Path)
	c.str(&m.After)
	c.u32(&m.MaxBytes)
	if m.leaseTail.code(c) {
		c.u32(&m.EntryWant)
	}
}

// readDirResp: when the request asked for leases, the directory's follows
// and then one per entry (Leases, as many as Entries).
type readDirResp struct {
	More    bool
	Entries []DirEntry
	leaseTail
	Leases []uint32
}

func (m *readDirResp) code(c coder) {
	c.bool(&m.More)
	list(c, &m.Entries, 2+attrWireSize, func(de *DirEntry) { c.str(&de.Name); codeAttr(c, &de.Attr) })
	if m.leaseTail.code(c) {
		list(c, &m.Leases, 4, c.u32)
	}
}

type mkdirReq struct {
	Path string
	Mode uint32
	leaseTail
}

func (m *mkdirReq) code(c coder) { c.str(&m.Path); c.u32(&m.Mode); m.leaseTail.code(c) }

// mkdirResp is attrMsg with the lease granted on the new directory when
// the request asked for one.
type mkdirResp struct {
	Attr Attr
	leaseTail
}

func (m *mkdirResp) code(c coder) { codeAttr(c, &m.Attr); m.leaseTail.code(c) }

// openReq: Flags are Linux open(2) flags (O_ACCMODE, O_CREAT, O_EXCL,
// O_TRUNC, O_APPEND, O_DIRECTORY, O_NOFOLLOW, O_SYNC, O_DSYNC); others are
// ignored. A non-zero DurableID, chosen by the client, asks for a durable
// handle (durable.go): it names the open in a later REOPEN, and an OPEN
// that repeats an id the server knows is a replay, answered with that open.
// A lease request (Want) may follow (lease.go), and after it the LWIO
// registration: FidFlags present asks the server to register the opened
// file with the session's LWIO engine as REGISTER would (FIG. 7A), with
// FidFlags as its FlagsAndAttributes, and to return the Fid, so the data
// path needs no resume key and no REGISTER round trip (issue 16). A
// request with the registration carries the lease fields too (Want 0: no
// lease), so every shorter body stays what it was.
type openReq struct {
	Path      string
	Flags     uint32
	Mode      uint32
	DurableID DurableID
	leaseTail
	Register bool
	FidFlags uint32
}

func (m *openReq) code(c coder) {
	c.str(&m.Path)
	c.u32(&m.Flags)
	c.u32(&m.Mode)
	c.guid((*[16]byte)(&m.DurableID))
	m.Leased = m.Leased || m.Register // (encoding; decoding starts with Register false)
	if m.leaseTail.code(c) && c.tail(&m.Register) {
		c.u32(&m.FidFlags)
	}
}

// openResp: FileID is the sealed identity of the file for a reopen after a
// server restart (empty: none; durable.go). The lease granted follows when
// the request asked for one, and after it the Fid the open was registered
// as when it was (openReq's Register; not when not asked, no LWIO
// connection of the session, the Fid table full) — with a Lease of 0 if
// no lease was asked.
type openResp struct {
	Handle Handle
	Attr   Attr
	FileID []byte
	leaseTail
	Registered bool
	Fid        uint32
}

func (m *openResp) code(c coder) {
	handle(c, &m.Handle)
	codeAttr(c, &m.Attr)
	c.blob(&m.FileID)
	m.Leased = m.Leased || m.Registered
	if m.leaseTail.code(c) && c.tail(&m.Registered) {
		c.u32(&m.Fid)
	}
}

type handleMsg struct{ Handle Handle }

func (m *handleMsg) code(c coder) { handle(c, &m.Handle) }

type readReq struct {
	Handle Handle
	Offset uint64
	Length uint32
}

func (m *readReq) code(c coder) { handle(c, &m.Handle); c.u64(&m.Offset); c.u32(&m.Length) }

// dataMsg carries bytes: a READ response, a READLINK response (the target),
// a GETXATTR response, a PIPE_TRANSACT request and response, an IOCTL
// response.
type dataMsg struct{ Data []byte }

func (m *dataMsg) code(c coder) { c.blob(&m.Data) }

type writeReq struct {
	Handle Handle
	Offset uint64
	Data   []byte

	inRun bool // not on the wire: part of a BATCH, run inside Tree.Run
}

func (m *writeReq) code(c coder) { handle(c, &m.Handle); c.u64(&m.Offset); c.blob(&m.Data) }

// writeResp: End is the file offset just past the bytes written — for an
// append (Offset WriteToEndOfFile) the end of file it left.
type writeResp struct {
	Count uint32
	End   uint64
}

func (m *writeResp) code(c coder) { c.u32(&m.Count); c.u64(&m.End) }

// twoPathReq: RENAME (Old, New, Flags = RENAME_NOREPLACE|RENAME_EXCHANGE),
// LINK (Old, New), SYMLINK (Old = target text, New = link path).
type twoPathReq struct {
	Old, New string
	Flags    uint32
}

func (m *twoPathReq) code(c coder) { c.str(&m.Old); c.str(&m.New); c.u32(&m.Flags) }

type statFSMsg struct{ StatFS StatFS }

func (m *statFSMsg) code(c coder) { codeStatFS(c, &m.StatFS) }

type fsyncReq struct {
	Handle   Handle
	Datasync bool
}

func (m *fsyncReq) code(c coder) { handle(c, &m.Handle); c.bool(&m.Datasync) }

// xattrReq: GETXATTR and REMOVEXATTR (Path, Name), SETXATTR (all fields;
// Flags are XATTR_CREATE / XATTR_REPLACE).
type xattrReq struct {
	Path  string
	Name  string
	Value []byte
	Flags uint32
}

func (m *xattrReq) code(c coder) { c.str(&m.Path); c.str(&m.Name); c.blob(&m.Value); c.u32(&m.Flags) }

type namesMsg struct{ Names []string }

func (m *namesMsg) code(c coder) { list(c, &m.Names, 2, c.str) }

// ioctlReq is an FSCTL on an open handle.
type ioctlReq struct {
	Handle  Handle
	CtlCode uint32
	Input   []byte
}

func (m *ioctlReq) code(c coder) { handle(c, &m.Handle); c.u32(&m.CtlCode); c.blob(&m.Input) }

// pipeTransactReq is one message written to a pipe handle; the response is
// a dataMsg with the pipe's answer.
type pipeTransactReq struct {
	Handle Handle
	Data   []byte
}

func (m *pipeTransactReq) code(c coder) { handle(c, &m.Handle); c.blob(&m.Data) }

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
	CmdMkdir:          {func() message { return new(mkdirReq) }, func() message { return new(mkdirResp) }},
	CmdRmdir:          {func() message { return new(nameMsg) }, func() message { return new(empty) }},
	CmdOpen:           {func() message { return new(openReq) }, func() message { return new(openResp) }},
	CmdClose:          {func() message { return new(handleMsg) }, func() message { return new(empty) }},
	CmdRead:           {func() message { return new(readReq) }, func() message { return new(dataMsg) }},
	CmdWrite:          {func() message { return new(writeReq) }, func() message { return new(writeResp) }},
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
	CmdLeaseBreak:     {func() message { return new(leaseBreakMsg) }, func() message { return new(empty) }},
	CmdLeaseAck:       {func() message { return new(leaseAckReq) }, func() message { return new(empty) }},
	CmdLease:          {func() message { return new(leaseReq) }, func() message { return new(leaseResp) }},
	CmdBatch:          {func() message { return new(batchReq) }, func() message { return new(batchResp) }},
	CmdLock:           {func() message { return new(lockReq) }, func() message { return new(empty) }},
	CmdUnlock:         {func() message { return new(unlockReq) }, func() message { return new(empty) }},
	CmdGetLk:          {func() message { return new(lockReq) }, func() message { return new(lockResp) }},
	CmdCancel:         {func() message { return new(cancelReq) }, func() message { return new(empty) }},
	CmdReopen:         {func() message { return new(reopenReq) }, func() message { return new(reopenResp) }},
	CmdCopyRange:      {func() message { return new(copyRangeReq) }, func() message { return new(copyRangeResp) }},
	CmdFallocate:      {func() message { return new(fallocateReq) }, func() message { return new(attrMsg) }},
	CmdSeek:           {func() message { return new(seekReq) }, func() message { return new(offsetMsg) }},
	CmdTmpfile:        {func() message { return new(openReq) }, func() message { return new(openResp) }},
	CmdLinkHandle:     {func() message { return new(linkHandleReq) }, func() message { return new(attrMsg) }},
}
