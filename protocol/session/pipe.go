package session

import (
	"strings"

	"github.com/sirupsen/logrus"

	"github.com/lwiofs/lwiofs/protocol"
	"github.com/lwiofs/lwiofs/protocol/share"
	"github.com/lwiofs/lwiofs/transport"
)

// LWIOPipe is the named pipe over which the LWIO negotiate runs (seed
// FIG. 2, step 209: "the client opens a pipe to the LWIO server").
const LWIOPipe = `\PIPE\LWIO`

// ProviderInfo is a provider as the server lists it for the negotiate.
type ProviderInfo = transport.ProviderInfo

func (s *Server) pipeOpen(ss *serverSession, name string) (message, error) {
	if !strings.EqualFold(name, LWIOPipe) {
		return nil, protocol.StatusObjectNameNotFound
	}
	h, _, err := s.newHandle(ss, func() (*share.OpenFile, error) { return nil, nil })
	if err != nil {
		return nil, err
	}
	return &handleMsg{Handle: h}, nil
}

// pipeTransact answers one LWIO negotiate request (FIG. 4A) with the
// negotiate response (FIG. 4B): the server's name, a fresh Key GUID bound
// to this session (SessionByKey finds it again when an RDMA connection
// authenticates, FIG. 5), and the providers common to both sides as
// transport.Common computes them against ServerConfig.Providers.
func (s *Server) pipeTransact(ss *serverSession, r *pipeTransactReq) (message, error) {
	of, ok := ss.handle(r.Handle)
	if !ok || of.file != nil { // not the pipe
		return nil, protocol.StatusInvalidHandle
	}
	req, err := protocol.DecodeNegotiateRequest(r.Data)
	if err != nil {
		return nil, protocol.StatusInvalidParameter
	}
	out := transport.Common(s.cfg.Providers, req.Providers)
	if ss.sealed() && !s.cfg.TrustedFabric {
		out = s.sealingOnly(ss, out)
	}
	key, err := s.newLWIOKey(ss)
	if err != nil {
		return nil, err
	}
	resp := protocol.NewNegotiateResponse(s.cfg.ServerName, key, out)
	if req.ResponseLength != 0 && resp.Size() > int(req.ResponseLength) {
		return nil, protocol.StatusBufferTooSmall
	}
	b, err := resp.Append(nil)
	if err != nil {
		return nil, protocol.StatusInvalidParameter
	}
	s.log.WithFields(logrus.Fields{"session": ss.id, "client": req.ClientName, "common": len(out)}).Info("lwio negotiate")
	return &dataMsg{Data: b}, nil
}

// sealingOnly drops from a sealed session's offer the providers whose
// connections cannot seal (verbs), which would carry its file data in
// clear: the client falls back to one that seals (softrdma) or to the
// sealed session channel. ServerConfig.TrustedFabric keeps them.
func (s *Server) sealingOnly(ss *serverSession, ps []ProviderInfo) []ProviderInfo {
	out := ps[:0:0]
	for _, p := range ps {
		if p.Seals {
			out = append(out, p)
			continue
		}
		s.log.WithFields(logrus.Fields{"session": ss.id, "provider": p.Name}).
			Info("sealed session: provider not offered, its connections cannot seal (trusted_fabric = false)")
	}
	return out
}

// encodeResumeKey encodes SRV_REQUEST_RESUME_KEY (FIG. 3) with the UNC
// context naming the share.
func encodeResumeKey(k [24]byte, unc string) []byte {
	r := protocol.ResumeKeyResponse{Key: protocol.ResumeKey(k), Context: unc}
	b, err := r.Append(nil)
	if err != nil {
		// Only an unencodable context fails; the share name came from the
		// server's own configuration.
		r.Context = ""
		b, _ = r.Append(nil)
	}
	return b
}
