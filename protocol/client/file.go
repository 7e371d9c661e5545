package client

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/lwiofs/lwiofs/protocol"
)

// File is a file registered with the server (FIG. 7A/B). Its Fid belongs
// to the session, so every connection of the client can use it. Methods are
// safe for concurrent use.
type File struct {
	cl     *Client
	fid    uint16
	flags  uint32
	byOpen bool          // registered by the session's OPEN: it closes with the handle
	mode   atomic.Uint32 // Mode
	closed atomic.Bool
}

// Fid is the server's file id.
func (f *File) Fid() uint16 { return f.fid }

// Register registers the file a resume key names (the key from the session
// channel's resume-key request) and returns it. flagsAndAttributes are the
// Win32 create flags the file was opened with; FILE_NO_INTERMEDIATE_BUFFERING
// (protocol.FileNoIntermediateBuffering) allows collapsed vectored writes.
func (cl *Client) Register(ctx context.Context, key protocol.ResumeKey, flagsAndAttributes uint32) (*File, error) {
	c, sl, err := cl.begin(ctx)
	if err != nil {
		return nil, err
	}
	req := protocol.NewRegisterRequest(protocol.FidParams{
		ResumeKey: key, SessionID: cl.cfg.SessionID, FlagsAndAttributes: flagsAndAttributes,
	}, c.hint(), c.prepare(sl, kindControl, 0).Cookie)
	req.Params.Put(sl.send.Bytes()[protocol.HeaderSize:])
	r, err := c.roundTrip(ctx, sl, &req.Header, protocol.RegisterRequestSize, nil)
	if err != nil {
		return nil, err
	}
	sl.unref()
	if r.st != protocol.StatusSuccess {
		return nil, fmt.Errorf("lwio register: %w", r.st)
	}
	if r.info == 0 || r.info > 0xFFFF {
		return nil, fmt.Errorf("lwio register: server returned Fid %d", r.info)
	}
	f := &File{cl: cl, fid: uint16(r.info), flags: flagsAndAttributes}
	f.mode.Store(uint32(cl.cfg.Completion))
	cl.ctr.registered.Add(1)
	return f, nil
}

// Attach returns the File of a Fid the session channel's OPEN registered
// (session.Tree.RegisterOnOpen): the same as Register's, without the
// REGISTER round trip. flagsAndAttributes are those the open asked for.
// Its Close sends nothing: the server closes the Fid with the handle.
func (cl *Client) Attach(fid uint16, flagsAndAttributes uint32) *File {
	f := &File{cl: cl, fid: fid, flags: flagsAndAttributes, byOpen: true}
	f.mode.Store(uint32(cl.cfg.Completion))
	cl.ctr.attached.Add(1)
	return f
}

// begin picks a connection, charges a credit and takes a slot.
func (cl *Client) begin(ctx context.Context) (*conn, *slot, error) {
	c, err := cl.pick()
	if err != nil {
		return nil, nil, err
	}
	sl, err := c.beginN(ctx, 1)
	return c, sl, err
}

// beginN charges n credits on c (all at once: ChargeN) and takes a slot
// that will give them back.
func (c *conn) beginN(ctx context.Context, n int) (*slot, error) {
	if err := c.credits.ChargeN(ctx, n); err != nil {
		if c.alive() {
			return nil, err
		}
		return nil, c.connErr()
	}
	sl, err := c.getSlot(ctx)
	if err != nil {
		c.credits.ReleaseN(n)
		return nil, err
	}
	sl.ncred = n
	return sl, nil
}

func (f *File) begin(ctx context.Context) (*conn, *slot, error) {
	if f.closed.Load() {
		return nil, nil, ErrClosed
	}
	c, sl, err := f.cl.begin(ctx)
	if err == nil {
		sl.mode = Mode(f.mode.Load())
	}
	return c, sl, err
}

// SetCompletion sets the completion mode of this file's I/O requests
// (FIG. 8: the mode is chosen per request); a file starts with the client's
// Config.Completion.
func (f *File) SetCompletion(m Mode) { f.mode.Store(uint32(m)) }

// Close closes the Fid on the server (FIG. 12A/B): later requests on it
// fail. It does not close the file on the session channel. A File from
// Attach only stops being usable here: its Fid goes when the session
// handle it was opened with closes, with no message of its own.
func (f *File) Close(ctx context.Context) error {
	if f.closed.Swap(true) {
		return ErrClosed
	}
	if f.byOpen {
		return nil
	}
	return f.control(ctx, protocol.NewCloseRequest)
}

// Cancel cancels the requests queued on the server for this file (FIG.
// 13A/B); they complete with STATUS_CANCELLED, those already executing
// finish.
func (f *File) Cancel(ctx context.Context) error {
	if f.closed.Load() {
		return ErrClosed
	}
	return f.control(ctx, protocol.NewCancelRequest)
}

// control sends the header-only request build makes (CLOSE, CANCEL) for
// the file and returns its status.
func (f *File) control(ctx context.Context, build func(fid uint16, credits uint8, cookie uint64) protocol.Header) error {
	c, sl, err := f.cl.begin(ctx)
	if err != nil {
		return err
	}
	h := build(f.fid, c.hint(), c.prepare(sl, kindControl, 0).Cookie)
	r, err := c.roundTrip(ctx, sl, &h, protocol.HeaderSize, nil)
	if err != nil {
		return err
	}
	sl.unref()
	return r.st.Err()
}
