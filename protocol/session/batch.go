package session

import (
	"context"
	"fmt"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/ntstatus"
)

// BATCH runs several requests of one tree, in order, as one round trip
// (SMB2's related compound requests, MS-SMB2 3.3.5.2.7.2, reduced to what
// a client holding a Write lease sends at close: the writes and attribute
// changes it held back). The server stops at the first request that fails;
// the response has one result per request it ran.

// MaxBatchOps bounds the requests in one BATCH.
const MaxBatchOps = 256

// batchable reports whether a command may be part of a BATCH: the tree's
// own operations whose answers are small. Reads, listings and the pipe
// are not; neither is anything about the session, its trees or leases'
// acknowledgements.
func batchable(cmd Command) bool {
	switch cmd {
	case CmdGetAttr, CmdSetAttr, CmdMkdir, CmdRmdir, CmdOpen, CmdClose, CmdWrite, CmdUnlink,
		CmdRename, CmdSymlink, CmdLink, CmdFsync, CmdSetXattr, CmdRemoveXattr, CmdLease:
		return true
	}
	return false
}

// batchOp is one request of a BATCH: its command (u32) and its body.
type batchOp struct {
	Command uint32
	Body    []byte
}

type batchReq struct{ Ops []batchOp }

func (m *batchReq) code(c coder) {
	list(c, &m.Ops, 4+4, func(o *batchOp) { c.u32(&o.Command); c.blob(&o.Body) })
}

// batchResult is one request's status and, when it succeeded, its
// response body.
type batchResult struct {
	Status uint32
	Body   []byte
}

type batchResp struct{ Results []batchResult }

func (m *batchResp) code(c coder) {
	list(c, &m.Results, 4+4, func(r *batchResult) { c.u32(&r.Status); c.blob(&r.Body) })
}

func (m *batchReq) sizeHint() int {
	n := 4
	for _, o := range m.Ops {
		n += 8 + len(o.Body)
	}
	return n
}

// BatchOp is one request of a Batch: Command is CmdWrite (Handle, Offset,
// Data), CmdSetAttr (Handle, or Path when Handle is 0; SetAttr), CmdFsync
// (Handle, Datasync), CmdClose (Handle) or CmdOpen (Path, Flags, Mode,
// Durable, and Lease: the lease asked for, 0 none) — an OPEN after the
// changes a client held back of other files, which the server runs only if
// every request before it succeeded.
type BatchOp struct {
	Command  Command
	Handle   Handle
	Path     string
	Offset   uint64
	Data     []byte
	SetAttr  SetAttrIn
	Datasync bool
	Flags    int
	Mode     uint32
	Durable  DurableID
	Lease    LeaseState
}

// BatchResult is what one request of a Batch did: its status, and the
// attributes after a SETATTR or the count of a WRITE; an OPEN's handle,
// attributes, file id (durable opens) and lease granted.
type BatchResult struct {
	Status protocol.Status
	Attr   Attr
	Count  uint32
	Handle Handle
	FileID []byte
	Lease  LeaseState
}

// body is the request message of op.
func (t *Tree) body(op *BatchOp) (message, error) {
	switch op.Command {
	case CmdWrite:
		if len(op.Data) > MaxIOSize {
			return nil, protocol.StatusInvalidParameter
		}
		return &writeReq{Handle: op.Handle, Offset: op.Offset, Data: op.Data}, nil
	case CmdSetAttr:
		return &setAttrReq{Path: op.Path, Handle: op.Handle, In: op.SetAttr}, nil
	case CmdFsync:
		return &fsyncReq{Handle: op.Handle, Datasync: op.Datasync}, nil
	case CmdClose:
		return &handleMsg{Handle: op.Handle}, nil
	case CmdOpen:
		req := &openReq{Path: op.Path, Flags: uint32(op.Flags), Mode: op.Mode, DurableID: op.Durable,
			leaseTail: leaseTail{op.Lease != 0, uint32(op.Lease)}}
		t.openPrep(req)
		return req, nil
	}
	return nil, fmt.Errorf("session: %v in a batch: %w", op.Command, protocol.StatusInvalidParameter)
}

// Batch runs ops in order in one round trip and returns one result per op
// the server ran: all of them, or up to and including the first that
// failed. The error is a failure of the batch as a whole (a lost
// connection, a refused batch).
func (t *Tree) Batch(ctx context.Context, ops []BatchOp) ([]BatchResult, error) {
	if len(ops) == 0 {
		return nil, nil
	}
	if len(ops) > MaxBatchOps {
		return nil, protocol.StatusInvalidParameter
	}
	req := &batchReq{Ops: make([]batchOp, len(ops))}
	subs := make([]message, len(ops))
	for i := range ops {
		m, err := t.body(&ops[i])
		if err != nil {
			return nil, err
		}
		subs[i] = m
		req.Ops[i] = batchOp{Command: uint32(ops[i].Command), Body: marshal(m)}
	}
	var r batchResp
	if err := t.call(ctx, CmdBatch, req, &r); err != nil {
		return nil, err
	}
	if len(r.Results) > len(ops) || len(r.Results) == 0 {
		return nil, protocol.StatusInvalidNetworkResp
	}
	if last := r.Results[len(r.Results)-1]; len(r.Results) < len(ops) && protocol.Status(last.Status) == protocol.StatusSuccess {
		// The server stops only at a failure: a short answer without
		// one is not an answer (an OPEN after it would look not run).
		return nil, protocol.StatusInvalidNetworkResp
	}
	out := make([]BatchResult, len(r.Results))
	for i, res := range r.Results {
		out[i].Status = protocol.Status(res.Status)
		if out[i].Status != protocol.StatusSuccess {
			if i != len(r.Results)-1 {
				return nil, protocol.StatusInvalidNetworkResp
			}
			continue
		}
		var err error
		switch ops[i].Command {
		case CmdWrite:
			var cm writeResp
			err = unmarshal(res.Body, &cm)
			out[i].Count = cm.Count
		case CmdSetAttr:
			var am attrMsg
			err = unmarshal(res.Body, &am)
			out[i].Attr = am.Attr
		case CmdOpen:
			var om openResp
			if err = unmarshal(res.Body, &om); err == nil {
				t.opened(subs[i].(*openReq), &om)
				out[i].Handle, out[i].Attr, out[i].FileID, out[i].Lease = om.Handle, om.Attr, om.FileID, LeaseState(om.Lease)
			}
		default:
			err = unmarshal(res.Body, &empty{})
		}
		if err != nil {
			return nil, protocol.StatusInvalidNetworkResp
		}
	}
	return out, nil
}

// batch runs a BATCH: each request decoded and dispatched in order, until
// one fails. A body that does not decode is the connection's end, as it is
// for a request on its own.
func (c *serverConn) batch(ss *serverSession, h Header, req *batchReq) (message, error, error) {
	if len(req.Ops) == 0 || len(req.Ops) > MaxBatchOps {
		return nil, protocol.StatusInvalidParameter, nil
	}
	subs := make([]message, len(req.Ops))
	for i, op := range req.Ops {
		cmd := Command(op.Command)
		if op.Command >= cmdLimit || !batchable(cmd) {
			return nil, protocol.StatusInvalidParameter, nil
		}
		subs[i] = bodies[cmd].req()
		if err := unmarshal(op.Body, subs[i]); err != nil {
			return nil, nil, fmt.Errorf("batch request %d (%v): %w", i, cmd, err)
		}
		if w, ok := subs[i].(*writeReq); ok {
			w.inRun = true // a BATCH runs whole on its tree's identity thread (onTree)
		}
	}
	resp := &batchResp{}
	for i, sub := range subs {
		sh := h
		sh.Command = Command(req.Ops[i].Command)
		m, err := c.s.dispatch(ss, sh, sub)
		st := ntstatus.FromError(err)
		r := batchResult{Status: uint32(st)}
		if st == protocol.StatusSuccess && m != nil {
			r.Body = marshal(m)
		}
		resp.Results = append(resp.Results, r)
		if st != protocol.StatusSuccess {
			c.log.WithFields(logrus.Fields{"op": sh.Command, "index": i, "status": st}).WithError(err).Debug("batch request failed")
			break
		}
	}
	return resp, nil, nil
}

// CloseHandles closes handles in as few round trips as BATCH allows
// (closes a client put off, gathered). A handle that fails to close does
// not keep the others open; the first failure is returned.
func (t *Tree) CloseHandles(ctx context.Context, hs []Handle) error {
	var first error
	for len(hs) > 0 {
		n := min(len(hs), MaxBatchOps)
		ops := make([]BatchOp, n)
		for i := range ops {
			ops[i] = BatchOp{Command: CmdClose, Handle: hs[i]}
		}
		res, err := t.Batch(ctx, ops)
		if err != nil {
			return err
		}
		done := len(res)
		if st := res[done-1].Status; st != protocol.StatusSuccess && first == nil {
			first = st
		}
		hs = hs[done:]
	}
	return first
}
