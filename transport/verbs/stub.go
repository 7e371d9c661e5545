//go:build !linux || !cgo || noverbs

package verbs

import (
	"context"
	"errors"
	"runtime"

	"github.com/lwiofs/lwiofs/transport"
)

// Provider is the verbs provider. In this build it is a stub: see Available.
type Provider struct{ opts Options }

var _ transport.Provider = (*Provider)(nil)

// New returns the verbs provider.
func New(opts Options) *Provider { return &Provider{opts: opts.withDefaults()} }

// Built reports whether the real provider is compiled in.
const Built = false

func (p *Provider) Name() string { return Name }

// Available says why verbs is unusable in this build.
func (p *Provider) Available() error { return errStub }

func (p *Provider) Listen(addr string, cfg transport.Config) (transport.Listener, error) {
	return nil, errStub
}

func (p *Provider) Dial(ctx context.Context, addr string, cfg transport.Config) (transport.Conn, error) {
	return nil, errStub
}

// Close releases nothing in this build.
func (p *Provider) Close() error { return nil }

var errStub = errors.New(stubReason())

func stubReason() string {
	switch {
	case runtime.GOOS != "linux":
		return "verbs provider not built in (" + runtime.GOOS + ": verbs is Linux-only)"
	case !cgoEnabled:
		return "verbs provider not built in (CGO_ENABLED=0)"
	}
	return "verbs provider not built in (build tag noverbs)"
}
