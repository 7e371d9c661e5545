package session

import (
	"encoding/binary"
	"fmt"
	"time"
)

// encoder appends little-endian fields to a byte slice. It never fails:
// lengths that do not fit their prefix are a programming error caught by
// the callers' own limits (paths are bounded by maxPathLen, blobs by
// MaxFrameSize).
type encoder struct{ b []byte }

func (e *encoder) u8(v uint8)   { e.b = append(e.b, v) }
func (e *encoder) u16(v uint16) { e.b = binary.LittleEndian.AppendUint16(e.b, v) }
func (e *encoder) u32(v uint32) { e.b = binary.LittleEndian.AppendUint32(e.b, v) }
func (e *encoder) u64(v uint64) { e.b = binary.LittleEndian.AppendUint64(e.b, v) }
func (e *encoder) bool(v bool) {
	if v {
		e.u8(1)
	} else {
		e.u8(0)
	}
}

// str writes a string as a u16 byte count followed by its bytes.
func (e *encoder) str(s string) {
	if len(s) > 0xFFFF {
		s = s[:0xFFFF]
	}
	e.u16(uint16(len(s)))
	e.b = append(e.b, s...)
}

// blob writes bytes as a u32 byte count followed by the bytes.
func (e *encoder) blob(p []byte) {
	e.u32(uint32(len(p)))
	e.b = append(e.b, p...)
}

// time writes t as seconds (i64) and nanoseconds (u32) since the Unix
// epoch; the zero time.Time is written as 0, 0.
func (e *encoder) time(t time.Time) {
	if t.IsZero() {
		e.u64(0)
		e.u32(0)
		return
	}
	e.u64(uint64(t.Unix()))
	e.u32(uint32(t.Nanosecond()))
}

// decoder reads little-endian fields with a sticky error: after the first
// short read every further read returns zero, and err says what was short.
// Callers check err once at the end (the p9 buffer idiom).
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) need(n int, what string) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || len(d.b) < n {
		d.err = fmt.Errorf("%w: %s needs %d bytes, %d left", ErrMalformedBody, what, n, len(d.b))
		return nil
	}
	p := d.b[:n]
	d.b = d.b[n:]
	return p
}

func (d *decoder) u8() uint8 {
	if p := d.need(1, "u8"); p != nil {
		return p[0]
	}
	return 0
}

func (d *decoder) u16() uint16 {
	if p := d.need(2, "u16"); p != nil {
		return binary.LittleEndian.Uint16(p)
	}
	return 0
}

func (d *decoder) u32() uint32 {
	if p := d.need(4, "u32"); p != nil {
		return binary.LittleEndian.Uint32(p)
	}
	return 0
}

func (d *decoder) u64() uint64 {
	if p := d.need(8, "u64"); p != nil {
		return binary.LittleEndian.Uint64(p)
	}
	return 0
}

func (d *decoder) bool() bool {
	v := d.u8()
	if v > 1 && d.err == nil {
		d.err = fmt.Errorf("%w: boolean byte %d", ErrMalformedBody, v)
	}
	return v == 1
}

func (d *decoder) str() string {
	n := int(d.u16())
	return string(d.need(n, "string"))
}

// blob returns a copy, so decoded messages never alias the frame buffer.
func (d *decoder) blob() []byte {
	n := d.u32()
	if d.err == nil && uint64(n) > uint64(len(d.b)) {
		d.err = fmt.Errorf("%w: blob of %d bytes, %d left", ErrMalformedBody, n, len(d.b))
		return nil
	}
	p := d.need(int(n), "blob")
	if p == nil {
		return nil
	}
	return append([]byte{}, p...)
}

func (d *decoder) time() time.Time {
	sec := int64(d.u64())
	nsec := d.u32()
	if d.err != nil || (sec == 0 && nsec == 0) {
		return time.Time{}
	}
	if nsec >= 1e9 {
		d.err = fmt.Errorf("%w: nanoseconds %d out of range", ErrMalformedBody, nsec)
		return time.Time{}
	}
	return time.Unix(sec, int64(nsec))
}

// finish reports the sticky error, or trailing bytes left after the body.
func (d *decoder) finish() error {
	if d.err != nil {
		return d.err
	}
	if len(d.b) != 0 {
		return fmt.Errorf("%w: %d trailing bytes", ErrMalformedBody, len(d.b))
	}
	return nil
}
