package rig

import (
	"context"
	"sync"

	"github.com/lwiofs/lwiofs/transport"
)

// RegionInfo is one memory region the server registered.
type RegionInfo struct {
	Addr   uint64
	Handle uint32
	Len    int
	Access transport.Access
}

// RegionLog records every Alloc on the server's connections' protection
// domain. The regions themselves are the provider's (the provider checks
// them by type), so deregistration is not seen: Bytes is the total ever
// registered, an upper bound of what is registered at any moment.
type RegionLog struct {
	mu      sync.Mutex
	regions []RegionInfo
	bytes   int64
	remote  int
}

func (l *RegionLog) add(r transport.Region, access transport.Access) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.regions = append(l.regions, RegionInfo{Addr: r.Addr(), Handle: r.Handle(), Len: len(r.Bytes()), Access: r.Access()})
	l.bytes += int64(len(r.Bytes()))
	if access&transport.AccessRemoteWrite != 0 || r.Access()&transport.AccessRemoteWrite != 0 {
		l.remote++
	}
}

// Snapshot returns the regions registered so far.
func (l *RegionLog) Snapshot() []RegionInfo {
	return read(l, func() []RegionInfo { return append([]RegionInfo(nil), l.regions...) })
}

// Count is the number of regions registered so far.
func (l *RegionLog) Count() int { return read(l, func() int { return len(l.regions) }) }

// RemoteWritable is the number of regions registered with
// AccessRemoteWrite: the server's security model says it is always 0.
func (l *RegionLog) RemoteWritable() int { return read(l, func() int { return l.remote }) }

// Bytes is the total size of every region registered so far.
func (l *RegionLog) Bytes() int64 { return read(l, func() int64 { return l.bytes }) }

// read is v() under l's lock.
func read[T any](l *RegionLog, v func() T) T {
	l.mu.Lock()
	defer l.mu.Unlock()
	return v()
}

// countingProvider is the server's softrdma provider with its accepted
// connections' Domain seen through countingDomain. The engine registers
// all its memory through Conn.Domain (receives, slots, read buffers).
type countingProvider struct {
	transport.Provider
	log *RegionLog
}

// Counted returns p with every Domain of its connections (dialled or
// accepted) recording its registrations in log.
func Counted(p transport.Provider, log *RegionLog) transport.Provider {
	return &countingProvider{Provider: p, log: log}
}

func (p *countingProvider) Dial(ctx context.Context, addr string, cfg transport.Config) (transport.Conn, error) {
	return p.log.conn(p.Provider.Dial(ctx, addr, cfg))
}

// conn gives c, a connection just dialled or accepted, with its Domain
// recording in l, or passes on the error that came instead.
func (l *RegionLog) conn(c transport.Conn, err error) (transport.Conn, error) {
	if err != nil {
		return nil, err
	}
	return &countingConn{Conn: c, dom: &countingDomain{Domain: c.Domain(), log: l}}, nil
}

func (p *countingProvider) Listen(addr string, cfg transport.Config) (transport.Listener, error) {
	l, err := p.Provider.Listen(addr, cfg)
	if err != nil {
		return nil, err
	}
	return &countingListener{Listener: l, log: p.log}, nil
}

type countingListener struct {
	transport.Listener
	log *RegionLog
}

func (l *countingListener) Accept(ctx context.Context) (transport.Conn, error) {
	return l.log.conn(l.Listener.Accept(ctx))
}

type countingConn struct {
	transport.Conn
	dom *countingDomain
}

func (c *countingConn) Domain() transport.Domain { return c.dom }

type countingDomain struct {
	transport.Domain
	log *RegionLog
}

func (d *countingDomain) Alloc(n int, access transport.Access) (transport.Region, error) {
	r, err := d.Domain.Alloc(n, access)
	if err == nil {
		d.log.add(r, access)
	}
	return r, err
}
