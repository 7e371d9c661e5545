package fs

import (
	"context"
	"strings"
	"syscall"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/client"
	"github.com/lwiofs/lwiofs/protocol/session"
)

// ResumeKeyer is the session channel's resume-key request (*session.Tree):
// FSCTL_SRV_REQUEST_RESUME_KEY on an open handle (seed FIG. 2, 3).
type ResumeKeyer interface {
	RequestResumeKey(ctx context.Context, h session.Handle) (protocol.ResumeKeyResponse, error)
}

// lwioPath is the LWIO data path: open = session open (done by the node)
// + resume key + REGISTER → Fid (seed FIG. 7A/B).
type lwioPath struct {
	keys     ResumeKeyer
	cl       *client.Client
	fallback DataPath // used for a file whose registration fails; nil: fail the open
	log      logrus.FieldLogger
}

// lwioDataPath returns the data path that registers every opened file with
// the LWIO client engine cl. A file whose registration fails (the RDMA
// connections are gone, say) uses fallback instead if it is not nil, with
// a warning; otherwise its open fails.
func lwioDataPath(keys ResumeKeyer, cl *client.Client, fallback DataPath, log logrus.FieldLogger) DataPath {
	return &lwioPath{keys: keys, cl: cl, fallback: fallback, log: log}
}

// Name is "lwio/" and the providers of the LWIO connections, e.g.
// "lwio/softrdma".
func (p *lwioPath) Name() string {
	return strings.Join(append([]string{"lwio"}, dedupe(p.cl.Providers())...), "/")
}

func (p *lwioPath) Attach(ctx context.Context, h session.Handle, flags int) (DataFile, error) {
	f, err := p.register(ctx, h, flags)
	if err == nil {
		return f, nil
	}
	if p.fallback == nil || ctx.Err() != nil {
		return nil, err
	}
	p.log.WithError(err).WithField("handle", uint64(h)).Warn("fs: LWIO registration failed; this file's data goes over the session channel")
	return p.fallback.Attach(ctx, h, flags)
}

func (p *lwioPath) register(ctx context.Context, h session.Handle, flags int) (DataFile, error) {
	rk, err := p.keys.RequestResumeKey(ctx, h)
	if err != nil {
		return nil, err
	}
	var fa uint32
	if flags&syscall.O_DIRECT != 0 {
		// Unbuffered: lets a VEC_WRITE of identical pages COLLAPSE.
		fa |= protocol.FileNoIntermediateBuffering
	}
	f, err := p.cl.Register(ctx, rk.Key, fa)
	if err != nil {
		return nil, err
	}
	return lwioFile{File: f, maxRead: p.cl.MaxRead()}, nil
}

// lwioFile is a registered file: *client.File has every DataFile method
// but ReadBuf as fs declares it — the client's returns its own *client.Buf
// and serves at most one READ (MaxRead bytes) — so this is where a
// longer read goes through ReadAt into dest instead.
type lwioFile struct {
	*client.File
	maxRead int
}

var _ DataFile = lwioFile{}

func (f lwioFile) ReadBuf(ctx context.Context, dest []byte, off int64) (Buffer, error) {
	if len(dest) > f.maxRead {
		return readInto(ctx, f, dest, off)
	}
	b, err := f.File.ReadBuf(ctx, off, len(dest))
	if b == nil {
		return nil, err // not a typed nil in the interface
	}
	return b, err
}
