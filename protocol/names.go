package protocol

import (
	"encoding/binary"
	"unicode/utf16"
	"unicode/utf8"
)

// Strings on the wire are UTF-16LE (the seed's WCHAR), either counted
// (SRV_REQUEST_RESUME_KEY.Context) or in a fixed-length array padded with
// zero code units (ClientName, SrvName, provider Name). docs/wire.md,
// "Strings".

// utf16Len returns the number of UTF-16 code units of s, or -1 if s is not
// valid UTF-8, contains U+FFFD (indistinguishable here from invalid UTF-8),
// or contains a NUL (the fixed-length arrays' terminator).
func utf16Len(s string) int {
	n := 0
	for _, r := range s {
		if r == utf8.RuneError || r == 0 {
			return -1
		}
		n++
		if r >= 0x10000 {
			n++
		}
	}
	return n
}

// putUTF16 writes s as UTF-16LE into b, which must hold 2*utf16Len(s)
// bytes, and returns the number of bytes written.
func putUTF16(b []byte, s string) int {
	i := 0
	for _, r := range s {
		if r >= 0x10000 {
			r1, r2 := utf16.EncodeRune(r)
			binary.LittleEndian.PutUint16(b[i:], uint16(r1))
			binary.LittleEndian.PutUint16(b[i+2:], uint16(r2))
			i += 4
			continue
		}
		binary.LittleEndian.PutUint16(b[i:], uint16(r))
		i += 2
	}
	return i
}

// getUTF16 decodes UTF-16LE bytes that must be valid: an even count, no
// unpaired surrogate, no NUL, no U+FFFD. It returns ok=false otherwise, so
// that decode → encode gives back the same bytes.
func getUTF16(b []byte) (string, bool) {
	if len(b)%2 != 0 {
		return "", false
	}
	out := make([]byte, 0, len(b)/2)
	for i := 0; i < len(b); i += 2 {
		u := rune(binary.LittleEndian.Uint16(b[i:]))
		switch {
		case u == 0 || u == utf8.RuneError:
			return "", false
		case utf16.IsSurrogate(u):
			if u >= 0xDC00 || i+4 > len(b) {
				return "", false
			}
			u2 := rune(binary.LittleEndian.Uint16(b[i+2:]))
			r := utf16.DecodeRune(u, u2)
			if r == utf8.RuneError {
				return "", false
			}
			out = utf8.AppendRune(out, r)
			i += 2
		default:
			out = utf8.AppendRune(out, u)
		}
	}
	return string(out), true
}

// putFixedName writes s into the fixed-length WCHAR array b (len(b)/2
// units), padding with zero units. It fails if s does not fit or is not
// valid.
func putFixedName(b []byte, s string) bool {
	n := utf16Len(s)
	if n < 0 || 2*n > len(b) {
		return false
	}
	w := putUTF16(b, s)
	clear(b[w:])
	return true
}

// getFixedName reads a fixed-length WCHAR array: the name runs to the first
// zero unit (or fills the array) and every unit after it must be zero.
func getFixedName(b []byte) (string, bool) {
	end := len(b)
	for i := 0; i+1 < len(b); i += 2 {
		if b[i] == 0 && b[i+1] == 0 {
			end = i
			break
		}
	}
	for _, c := range b[end:] {
		if c != 0 {
			return "", false
		}
	}
	return getUTF16(b[:end])
}
