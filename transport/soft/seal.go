package soft

import (
	"crypto/cipher"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/lwiofs/lwiofs/transport"
)

// Sealed framing (docs/transport.md, "Sealed connections"). A sealed frame
// is the frame with its header and payload encrypted and authenticated by
// the direction's AEAD (AES-GCM):
//
//	0   Type     u8        frameSealed, in clear (the associated data)
//	1   header   31 bytes  bytes 1–31 of the frame header, encrypted, with
//	                       the real Type in byte 3 (zero in a clear header)
//	32  tag      16 bytes
//	48  payload  Length bytes in chunks of sealChunk (the last shorter),
//	             each encrypted and followed by its 16-byte tag
//
// Frames are numbered 1, 2, 3 … in each direction (seq, never on the wire);
// the header's nonce is seq ‖ 0 and chunk i's is seq ‖ i+1 (u64 and u32,
// little-endian). A replayed, reordered, dropped or altered frame or chunk
// therefore fails to authenticate. Chunks bound the reader's buffer and let
// it decrypt from its buffer straight into the receive buffer or RDMA
// target, so each payload byte is touched once by the cipher each way.
const (
	frameSealed     frameType = 0x80
	sealTagSize               = 16
	sealedHdrSize             = frameHeaderSize + sealTagSize
	sealChunk                 = 64 << 10
	sealNonceSize             = 12
	sealReadBufSize           = 4 * (sealChunk + sealTagSize)
)

// sealedLen is the wire size of the payload of a sealed frame of n bytes.
func sealedLen(n int) int { return n + sealTagSize*((n+sealChunk-1)/sealChunk) }

// sealKeys is what Seal installed.
type sealKeys struct {
	send, recv cipher.AEAD
	lead       bool
}

// whySealRefused is the failure of a frame that does not authenticate: a
// warning, since it means tampering, a bug, or a peer with other keys.
const whySealRefused = "sealed frame refused"

var errSealedNoKeys = errors.New("softrdma: sealed frame on a connection that has no keys")

func putNonce(n *[sealNonceSize]byte, seq uint64, i uint32) []byte {
	binary.LittleEndian.PutUint64(n[:8], seq)
	binary.LittleEndian.PutUint32(n[8:], i)
	return n[:]
}

// Seal keys the connection's framing (transport.Sealable).
func (c *conn) Seal(cfg transport.SealConfig) error {
	for _, a := range []cipher.AEAD{cfg.Send, cfg.Recv} {
		if a == nil || a.NonceSize() != sealNonceSize || a.Overhead() != sealTagSize {
			return errors.New("softrdma: Seal needs two AEADs with 12-byte nonces and 16-byte tags")
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.st != stateOpen {
		return transport.ErrClosed
	}
	if c.sealk.Load() != nil {
		return errors.New("softrdma: connection already sealed")
	}
	c.sealk.Store(&sealKeys{send: cfg.Send, recv: cfg.Recv, lead: cfg.Lead})
	if cfg.Lead {
		// Under c.mu: every frame gathered from now on is sealed.
		c.sealOut.Store(true)
	}
	c.log.WithField("lead", cfg.Lead).Debug("sealed")
	return nil
}

var _ transport.Sealable = (*conn)(nil)

// sealBuf is the writer's room for the sealed frames of one batch. The
// batch's I/O vector points into it until the batch is written, and the
// next batch is gathered only then, so it is reused; a batch larger than
// every one before gets a new block (the old one lives while the vector
// still points into it).
type sealBuf struct {
	b     []byte
	used  int
	seq   uint64 // frames sealed so far, this direction
	nonce [sealNonceSize]byte
	jobs  []sealJob // reserved under c.mu, sealed by run after it
}

// sealJob is a frame gather reserved room for: sealing it (a pass of
// AES-GCM over the payload) happens outside c.mu, so acknowledgements and
// Posts are not held up behind it. Its segments stay valid: the frame is
// not on the wire yet, so nothing can complete it.
type sealJob struct {
	a      cipher.AEAD
	h      frameHeader
	segs   []transport.Segment
	length int
	seq    uint64
	out    []byte
}

func (s *sealBuf) reset() { s.used = 0 }

// reserve numbers the frame h carrying segs (length bytes) and returns
// where its sealed form will be; run fills it in.
func (s *sealBuf) reserve(a cipher.AEAD, h *frameHeader, segs []transport.Segment, length int) []byte {
	s.seq++
	out := s.take(sealedHdrSize + sealedLen(length))
	s.jobs = append(s.jobs, sealJob{a: a, h: *h, segs: segs, length: length, seq: s.seq, out: out})
	return out
}

// run seals the reserved frames; the write side's owner calls it before
// writing the batch.
func (s *sealBuf) run() {
	for i := range s.jobs {
		j := &s.jobs[i]
		s.sealInto(j.a, j.seq, &j.h, j.segs, j.length, j.out)
	}
	clear(s.jobs)
	s.jobs = s.jobs[:0]
}

func (s *sealBuf) take(n int) []byte {
	if len(s.b)-s.used < n {
		s.b = make([]byte, max(2*len(s.b), n, 1<<20))
		s.used = 0
	}
	p := s.b[s.used : s.used+n : s.used+n]
	s.used += n
	return p
}

// seal returns the sealed form of the frame h carrying segs (length bytes).
func (s *sealBuf) seal(a cipher.AEAD, h *frameHeader, segs []transport.Segment, length int) []byte {
	out := s.reserve(a, h, segs, length)
	s.run()
	return out
}

// sealInto writes the sealed form of frame number seq into out.
func (s *sealBuf) sealInto(a cipher.AEAD, seq uint64, h *frameHeader, segs []transport.Segment, length int, out []byte) {
	sealHeader(a, &s.nonce, seq, h, out[:sealedHdrSize])
	p := out[sealedHdrSize:]
	si, so := 0, 0 // the segment and offset the next plaintext byte is at
	for i, off := uint32(1), 0; off < length; i++ {
		n := min(sealChunk, length-off)
		dst := p[:n+sealTagSize]
		for si < len(segs) && so == segs[si].Length {
			si, so = si+1, 0
		}
		var pt []byte
		if b := segs[si].Bytes(); len(b)-so >= n {
			pt = b[so : so+n] // inside one segment: sealed from where it lies
			so += n
		} else {
			for m := 0; m < n; { // straddles segments: gathered first
				for so == segs[si].Length {
					si, so = si+1, 0
				}
				k := copy(dst[m:n], segs[si].Bytes()[so:])
				m, so = m+k, so+k
			}
			pt = dst[:n]
		}
		a.Seal(dst[:0], putNonce(&s.nonce, seq, i), pt, nil)
		p, off = p[n+sealTagSize:], off+n
	}
}

// sealHeader writes h's sealed header (sealedHdrSize bytes) into b.
func sealHeader(a cipher.AEAD, nonce *[sealNonceSize]byte, seq uint64, h *frameHeader, b []byte) {
	h.encode(b)
	b[3], b[0] = b[0], byte(frameSealed)
	a.Seal(b[1:1], putNonce(nonce, seq, 0), b[1:frameHeaderSize], b[:1])
}

// openHeader authenticates and decrypts the sealed header in b (sealedHdrSize
// bytes, in place) and decodes it.
func (rd *frameReader) openHeader(a cipher.AEAD, h *frameHeader) error {
	b := rd.buf[rd.r : rd.r+sealedHdrSize]
	rd.inSeq++
	if _, err := a.Open(b[1:1], putNonce(&rd.nonce, rd.inSeq, 0), b[1:], b[:1]); err != nil {
		return fmt.Errorf("softrdma: sealed frame %d does not authenticate (tampered, replayed or not for this connection)", rd.inSeq)
	}
	if frameType(b[3]) == frameSealed {
		return errBadFrame
	}
	b[0], b[3] = b[3], 0
	if err := h.decode(b[:frameHeaderSize]); err != nil {
		return err
	}
	if h.Flags&flagShm != 0 { // a sealed connection keeps its data on the socket
		return errBadFrame
	}
	h.seq = rd.inSeq
	return nil
}

// errSealedPayload is a payload chunk that does not authenticate.
type errSealedPayload struct{ seq uint64 }

func (e errSealedPayload) Error() string {
	return fmt.Sprintf("softrdma: payload of sealed frame %d does not authenticate (tampered)", e.seq)
}

// openInto reads the sealed payload of frame h and decrypts it into dst
// (len(dst) == h.Length) chunk by chunk. A chunk that is not the last is
// read from the socket straight into its place in dst, its tag into the
// next chunk's room (AES-GCM wants the tag right after the ciphertext), and
// opened there in place; the last chunk, and one already in the reader's
// buffer, is opened from the buffer into dst.
func (rd *frameReader) openInto(a cipher.AEAD, h *frameHeader, dst []byte) error {
	for i, off := uint32(1), 0; off < len(dst); i++ {
		n := min(sealChunk, len(dst)-off)
		nonce := putNonce(&rd.nonce, h.seq, i)
		if off+n < len(dst) && rd.buffered() < n+sealTagSize {
			area := dst[off : off+n+sealTagSize]
			if err := rd.readInto(area); err != nil {
				return err
			}
			if _, err := a.Open(area[:0], nonce, area, nil); err != nil {
				return errSealedPayload{h.seq}
			}
		} else {
			rd.exact = false
			if err := rd.fill(n + sealTagSize); err != nil {
				return err
			}
			ct := rd.buf[rd.r : rd.r+n+sealTagSize]
			if _, err := a.Open(dst[off:off], nonce, ct, nil); err != nil {
				return errSealedPayload{h.seq}
			}
			rd.r += n + sealTagSize
		}
		off += n
	}
	return nil
}

// wireLen is what follows h's header on the wire.
func (h *frameHeader) wireLen() int {
	if h.seq != 0 {
		return sealedLen(int(h.Length))
	}
	if h.Flags&flagShm != 0 {
		return int(h.Wire)
	}
	return int(h.Length)
}

// readHeader reads and decodes the next frame header, sealed or clear, and
// applies the sealing rules: a sealed frame needs keys; with keys, a clear
// frame is allowed only while the peer has sent nothing sealed, and only an
// acknowledgement. The first sealed frame from the peer starts sealing this
// end's sends when it does not lead.
func (c *conn) readHeader(h *frameHeader) (failure, bool) {
	b := c.rd.buf[c.rd.r:]
	k := c.sealk.Load()
	if frameType(b[0]) != frameSealed {
		err := h.decode(b[:frameHeaderSize])
		c.rd.r += frameHeaderSize
		if err != nil {
			return failure{why: "protocol violation", err: err}, false
		}
		if k != nil && (c.rd.inSeq != 0 || h.Type != frameAck) {
			return failure{why: "protocol violation", err: fmt.Errorf("softrdma: %v in clear on a sealed connection", h.Type)}, false
		}
		return failure{}, true
	}
	if k == nil {
		return failure{why: "protocol violation", err: errSealedNoKeys}, false
	}
	if len(c.rd.buf) < sealReadBufSize {
		nb := make([]byte, sealReadBufSize)
		c.rd.w = copy(nb, c.rd.buf[c.rd.r:c.rd.w])
		c.rd.buf, c.rd.r = nb, 0
	}
	if err := c.rd.fill(sealedHdrSize); err != nil {
		return failure{why: "receive failed", err: err}, false
	}
	err := c.rd.openHeader(k.recv, h)
	c.rd.r += sealedHdrSize
	if err != nil {
		return failure{why: whySealRefused, err: err}, false
	}
	if h.seq == 1 && !k.lead {
		c.sealOut.Store(true)
		c.transmit() // anything queued meanwhile goes out sealed
	}
	return failure{}, true
}

// readPayload places h's payload into dst: read, or read and opened.
func (c *conn) readPayload(h *frameHeader, dst []byte) error {
	if h.seq == 0 {
		return c.rd.readInto(dst)
	}
	return c.rd.openInto(c.sealk.Load().recv, h, dst)
}

// SealsConnections reports that softrdma connections can seal
// (transport.SealingProvider).
func (p *Provider) SealsConnections() bool { return true }
