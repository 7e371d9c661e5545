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

// ResumeKeyer is what the LWIO data path needs of the session channel
// (*session.Tree): the Fid an OPEN registered the handle as, else the
// resume-key request (FSCTL_SRV_REQUEST_RESUME_KEY, seed FIG. 2, 3) to
// REGISTER it by.
type ResumeKeyer interface {
	Fid(h session.Handle) (session.OpenFid, bool)
	RequestResumeKey(ctx context.Context, h session.Handle) (protocol.ResumeKeyResponse, error)
}

// lwioPath is the LWIO data path: the session open (done by the node)
// registers the file and answers its Fid; a handle opened without one
// (the server could not) gets it by resume key + REGISTER (seed FIG.
// 7A/B) on first use.
type lwioPath struct {
	keys     ResumeKeyer
	cl       *client.Client
	fallback DataPath // used for a file whose registration fails; nil: fail the open
	log      logrus.FieldLogger
}

// lwioDataPath returns the data path that registers every opened file with
// the LWIO client engine cl. A file whose registration the server refuses
// uses fallback instead if it is not nil, with a warning; otherwise its
// open fails. A registration whose connection was lost (the session
// channel's or an LWIO one: protocol.ConnectionError) fails as it is,
// fallback or not: the session channel is no way around a dead session,
// and a Reconnector, seeing the lost connection, re-opens the handle on
// the next session and registers it there.
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
	if protocol.IsConnectionLost(err) {
		p.log.WithError(err).WithField("handle", uint64(h)).Debug("fs: LWIO registration: connection lost")
		return nil, err
	}
	p.log.WithError(err).WithField("handle", uint64(h)).Warn("fs: LWIO registration failed; this file's data goes over the session channel")
	return p.fallback.Attach(ctx, h, flags)
}

func (p *lwioPath) register(ctx context.Context, h session.Handle, flags int) (DataFile, error) {
	if of, ok := p.keys.Fid(h); ok {
		return p.cl.Attach(of.Fid, of.FlagsAndAttributes), nil
	}
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
	return f, nil
}

// A registered file is a data file as it is.
var _ DataFile = (*client.File)(nil)
