package session

import (
	"encoding/binary"
	"fmt"
	"time"
)

// coder is what a message lists its fields to, in wire order, in its code
// method: the encoder appends them, the decoder fills them in. A body's
// layout is written once and serves both directions (docs/session.md
// lists the layouts).
type coder interface {
	u16(*uint16)
	u32(*uint32)
	u64(*uint64)
	bool(*bool)
	// str is a u16 byte count and the bytes.
	str(*string)
	// blob is a u32 byte count and the bytes.
	blob(*[]byte)
	// time is seconds (i64) and nanoseconds (u32) since the Unix epoch;
	// the zero time.Time is 0, 0.
	time(*time.Time)
	// guid is 16 bytes as they are (an id chosen by one end).
	guid(*[16]byte)
	// count is the u32 length of a list whose elements take at least min
	// bytes each: the decoder refuses a count the rest of the body cannot
	// hold before anything is allocated. It reports whether to go on.
	count(n *int, min int) bool
	// tail reports whether the fields that follow are there: fields a
	// newer peer adds at the end of a body (docs/session.md says which).
	// The encoder writes them when *present; the decoder sets *present
	// to whether any bytes are left.
	tail(present *bool) bool
	// count16 is count with a u16 length.
	count16(n *int, min int) bool
}

// list codes a counted list of elements at least min bytes long each.
func list[T any](c coder, l *[]T, min int, elem func(*T)) { counted(c.count, l, min, elem) }

// list16 is list with a u16 count.
func list16[T any](c coder, l *[]T, min int, elem func(*T)) { counted(c.count16, l, min, elem) }

func counted[T any](count func(*int, int) bool, l *[]T, min int, elem func(*T)) {
	n := len(*l)
	if !count(&n, min) {
		return
	}
	if len(*l) != n { // decoding
		*l = make([]T, n)
	}
	for i := range *l {
		elem(&(*l)[i])
	}
}

// encoder appends little-endian fields to a byte slice. It never fails:
// lengths that do not fit their prefix are a programming error caught by
// the callers' own limits (paths are bounded by maxPathLen, blobs by
// MaxFrameSize).
type encoder struct{ b []byte }

func (e *encoder) u16(v *uint16) { e.b = binary.LittleEndian.AppendUint16(e.b, *v) }
func (e *encoder) u32(v *uint32) { e.b = binary.LittleEndian.AppendUint32(e.b, *v) }
func (e *encoder) u64(v *uint64) { e.b = binary.LittleEndian.AppendUint64(e.b, *v) }

func (e *encoder) bool(v *bool) {
	b := byte(0)
	if *v {
		b = 1
	}
	e.b = append(e.b, b)
}

func (e *encoder) str(s *string) {
	v := *s
	if len(v) > 0xFFFF {
		v = v[:0xFFFF]
	}
	e.b = binary.LittleEndian.AppendUint16(e.b, uint16(len(v)))
	e.b = append(e.b, v...)
}

func (e *encoder) blob(p *[]byte) {
	e.b = binary.LittleEndian.AppendUint32(e.b, uint32(len(*p)))
	e.b = append(e.b, *p...)
}

func (e *encoder) time(t *time.Time) {
	var sec uint64
	var nsec uint32
	if !t.IsZero() {
		sec, nsec = uint64(t.Unix()), uint32(t.Nanosecond())
	}
	e.b = binary.LittleEndian.AppendUint64(e.b, sec)
	e.b = binary.LittleEndian.AppendUint32(e.b, nsec)
}

func (e *encoder) tail(present *bool) bool { return *present }
func (e *encoder) guid(g *[16]byte)        { e.b = append(e.b, g[:]...) }

func (e *encoder) count(n *int, _ int) bool {
	e.b = binary.LittleEndian.AppendUint32(e.b, uint32(*n))
	return true
}

func (e *encoder) count16(n *int, _ int) bool {
	e.b = binary.LittleEndian.AppendUint16(e.b, uint16(*n))
	return true
}

// decoder reads little-endian fields with a sticky error: after the first
// short read every further field is left as it is (zero in a new
// message), and err says what was short. Callers check err once at the
// end (the p9 buffer idiom).
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf("%w: "+format, append([]any{ErrMalformedBody}, args...)...)
	}
}

func (d *decoder) need(n int, what string) []byte {
	if d.err != nil {
		return nil
	}
	if n < 0 || len(d.b) < n {
		d.fail("%s needs %d bytes, %d left", what, n, len(d.b))
		return nil
	}
	p := d.b[:n]
	d.b = d.b[n:]
	return p
}

// fixed reads an n-byte little-endian integer into v.
func fixed[T uint16 | uint32 | uint64](d *decoder, v *T, n int, get func([]byte) T, what string) {
	if p := d.need(n, what); p != nil {
		*v = get(p)
	}
}

func (d *decoder) u16(v *uint16) { fixed(d, v, 2, binary.LittleEndian.Uint16, "u16") }
func (d *decoder) u32(v *uint32) { fixed(d, v, 4, binary.LittleEndian.Uint32, "u32") }
func (d *decoder) u64(v *uint64) { fixed(d, v, 8, binary.LittleEndian.Uint64, "u64") }

func (d *decoder) bool(v *bool) {
	p := d.need(1, "bool")
	if p == nil {
		return
	}
	if p[0] > 1 {
		d.fail("boolean byte %d", p[0])
	}
	*v = p[0] == 1
}

func (d *decoder) str(s *string) {
	var n uint16
	fixed(d, &n, 2, binary.LittleEndian.Uint16, "u16")
	if p := d.need(int(n), "string"); p != nil {
		*s = string(p)
	}
}

// blob keeps a copy, so decoded messages never alias the frame buffer.
func (d *decoder) blob(b *[]byte) {
	var n uint32
	d.u32(&n)
	if p := d.need(int(min(n, 1<<31-1)), "blob"); p != nil {
		*b = append([]byte{}, p...)
	}
}

func (d *decoder) time(t *time.Time) {
	var sec uint64
	var nsec uint32
	d.u64(&sec)
	d.u32(&nsec)
	switch {
	case d.err != nil, sec == 0 && nsec == 0:
	case nsec >= 1e9:
		d.fail("nanoseconds %d out of range", nsec)
	default:
		*t = time.Unix(int64(sec), int64(nsec))
	}
}

func (d *decoder) tail(present *bool) bool {
	*present = d.err == nil && len(d.b) > 0
	return *present
}

func (d *decoder) guid(g *[16]byte) {
	if p := d.need(16, "guid"); p != nil {
		copy(g[:], p)
	}
}

func (d *decoder) count(n *int, min int) bool {
	var v uint32
	d.u32(&v)
	return d.listOf(n, v, min)
}

func (d *decoder) count16(n *int, min int) bool {
	var v uint16
	d.u16(&v)
	return d.listOf(n, uint32(v), min)
}

// listOf accepts a list of v elements of at least min bytes each if the
// rest of the body can hold them.
func (d *decoder) listOf(n *int, v uint32, min int) bool {
	if d.err != nil {
		return false
	}
	if uint64(v)*uint64(min) > uint64(len(d.b)) {
		d.fail("%d list elements of at least %d bytes, %d left", v, min, len(d.b))
		return false
	}
	*n = int(v)
	return true
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
