package protocol

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/lwiofs/lwiofs/transport"
)

// docRow is one row of a layout table in docs/wire.md. Offset or Size is -1
// where the document says "var".
type docRow struct {
	Offset, Size int
	Field        string
}

// parseWireDoc reads every table that follows a "<!-- layout: NAME -->"
// line in docs/wire.md.
func parseWireDoc(t *testing.T) map[string][]docRow {
	t.Helper()
	f, err := os.Open("../docs/wire.md")
	if err != nil {
		t.Fatalf("the wire document must exist: %v", err)
	}
	defer f.Close()
	out := map[string][]docRow{}
	cur := ""
	inTable := false
	num := func(s string) int {
		if s == "var" {
			return -1
		}
		n, err := strconv.Atoi(s)
		if err != nil {
			t.Fatalf("layout %s: bad number %q", cur, s)
		}
		return n
	}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if name, ok := strings.CutPrefix(line, "<!-- layout: "); ok {
			cur = strings.TrimSuffix(name, " -->")
			if _, dup := out[cur]; dup {
				t.Fatalf("layout %s documented twice", cur)
			}
			out[cur] = nil
			inTable = false
			continue
		}
		if cur == "" {
			continue
		}
		if !strings.HasPrefix(line, "|") {
			if inTable {
				cur, inTable = "", false
			}
			continue
		}
		inTable = true
		cols := strings.Split(strings.Trim(line, "|"), "|")
		for i := range cols {
			cols[i] = strings.TrimSpace(cols[i])
		}
		if len(cols) < 3 || cols[0] == "Offset" || strings.HasPrefix(cols[0], "-") || strings.HasPrefix(cols[0], ":") || strings.HasPrefix(cols[0], "---") {
			continue
		}
		out[cur] = append(out[cur], docRow{Offset: num(cols[0]), Size: num(cols[1]), Field: cols[2]})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

// diffCheck reports whether base and mod differ in exactly the bytes
// [off, off+size).
func diffCheck(base, mod []byte, off, size int) error {
	if len(base) != len(mod) {
		return fmt.Errorf("encodings of %d and %d bytes", len(base), len(mod))
	}
	lo, hi := -1, -1
	for i := range base {
		if base[i] != mod[i] {
			if lo < 0 {
				lo = i
			}
			hi = i + 1
		}
	}
	if lo != off || hi != off+size {
		return fmt.Errorf("encoder writes the field at [%d,%d), document says [%d,%d)", lo, hi, off, off+size)
	}
	return nil
}

func bytesAt(b []byte, off int, want []byte) error {
	if off < 0 || off+len(want) > len(b) || !bytes.Equal(b[off:off+len(want)], want) {
		return fmt.Errorf("want %x at offset %d of %x", want, off, b)
	}
	return nil
}

func u16At(b []byte, off int, want uint16) error {
	var w [2]byte
	binary.LittleEndian.PutUint16(w[:], want)
	return bytesAt(b, off, w[:])
}

type fieldCheck func(off, size int) error

// diffOf builds a check from a function that encodes the structure with
// the field set to all ones (set=true) or left zero.
func diffOf(enc func(set bool) []byte) fieldCheck {
	return func(off, size int) error { return diffCheck(enc(false), enc(true), off, size) }
}

// setCheck builds a check from a setter of one field: the zero structure
// and the one with set applied, both encoded by enc, must differ in exactly
// the field's bytes.
func setCheck[T any](enc func(*T) []byte, set func(*T)) fieldCheck {
	return diffOf(func(on bool) []byte {
		var v T
		if on {
			set(&v)
		}
		return enc(&v)
	})
}

// fieldOf is setCheck for a structure whose Append cannot fail.
func fieldOf[T any, P interface {
	*T
	Append([]byte) []byte
}](set func(P)) fieldCheck {
	return setCheck(func(v *T) []byte { return P(v).Append(nil) }, func(v *T) { set(v) })
}

// fieldOfE is setCheck for a structure whose Append can fail (it does not
// here: every value set is valid).
func fieldOfE[T any, P interface {
	*T
	Append([]byte) ([]byte, error)
}](set func(P)) fieldCheck {
	return setCheck(func(v *T) []byte { return must(P(v).Append(nil)) }, func(v *T) { set(v) })
}

func must(b []byte, err error) []byte {
	if err != nil {
		panic(err)
	}
	return b
}

func ones(n int) []byte { return bytes.Repeat([]byte{0xff}, n) }

func wireChecks() map[string]map[string]fieldCheck {
	const max16, max32, max64 = 0xFFFF, 0xFFFFFFFF, ^uint64(0)
	nameFF := func(n int) string { return strings.Repeat("\uffff", n) }
	// resumeKey checks one of MakeResumeKey's three arguments (0, 1, 2).
	resumeKey := func(arg int) fieldCheck {
		return setCheck(func(a *[3]uint64) []byte {
			k := MakeResumeKey(a[0], a[1], a[2])
			return k[:]
		}, func(a *[3]uint64) { a[arg] = max64 })
	}
	// A response with one provider with one instance, to find the
	// provider and address entries at NegotiateResponseFixedSize.
	withProvider := func(p transport.ProviderInfo) []byte {
		r := NegotiateResponse{Providers: []transport.ProviderInfo{p}}
		return must(r.Append(nil))
	}
	prov := func(set func(p *transport.ProviderInfo)) fieldCheck {
		return func(off, size int) error {
			base := transport.ProviderInfo{Instances: []transport.Instance{{}}}
			mod := base
			set(&mod)
			return diffCheck(withProvider(base), withProvider(mod), NegotiateResponseFixedSize+off, size)
		}
	}
	addr := withProvider(transport.ProviderInfo{Name: "p", Instances: []transport.Instance{{HostAddress: []byte{1, 2, 3}, Discriminator: []byte{9, 8}}}})
	addrAt := NegotiateResponseFixedSize + ProviderFixedSize
	rkCtx := must((&ResumeKeyResponse{Context: "ab"}).Append(nil))
	authKey := (&AuthParams{HasKey: true, Key: [16]byte{0: 0x5a, 15: 0xa5}}).Append(nil)

	return map[string]map[string]fieldCheck{
		"Header": {
			"Length":          fieldOf(func(h *Header) { h.Length = max32 }),
			"Status":          fieldOf(func(h *Header) { h.SetStatus(max32) }),
			"Opcode":          fieldOf(func(h *Header) { h.Opcode = 0xff }),
			"Flags":           fieldOf(func(h *Header) { h.Flags = 0xff }),
			"Credits":         fieldOf(func(h *Header) { h.Credits = 0xff }),
			"Marker":          fieldOf(func(h *Header) { h.Marker = 0xff }),
			"Fid":             fieldOf(func(h *Header) { h.Fid = max16 }),
			"Sequence":        fieldOf(func(h *Header) { h.Sequence = max16 }),
			"Tid":             fieldOf(func(h *Header) { h.Tid = max32 }),
			"Offset":          fieldOf(func(h *Header) { h.Offset = max64 }),
			"DataVa":          fieldOf(func(h *Header) { h.DataVa = max64 }),
			"DataMh":          fieldOf(func(h *Header) { h.DataMh = max32 }),
			"NumPages":        fieldOf(func(h *Header) { h.SetVec(max16, 0) }),
			"PageSize":        fieldOf(func(h *Header) { h.SetVec(0, max16) }),
			"IosMh":           fieldOf(func(h *Header) { h.IosMh = max32 }),
			"ImmediateCookie": fieldOf(func(h *Header) { h.SetCookies(max32, 0) }),
			"IosVa":           fieldOf(func(h *Header) { h.IosVa = max64 }),
			"Cookie":          fieldOf(func(h *Header) { h.SetCookies(0, max64) }),
		},
		"StatusResponse": {
			"Cookie":      fieldOf(func(r *StatusResponse) { r.Cookie = max64 }),
			"Information": fieldOf(func(r *StatusResponse) { r.Ios.Information = max32 }),
			"Status":      fieldOf(func(r *StatusResponse) { r.Ios.Status = max32 }),
		},
		"IOStatusBlock": {
			"Information": fieldOf(func(r *IOStatusBlock) { r.Information = max32 }),
			"Status":      fieldOf(func(r *IOStatusBlock) { r.Status = max32 }),
		},
		"RDMARegion": {
			"DataVa": fieldOf(func(r *RDMARegion) { r.DataVa = max64 }),
			"DataMh": fieldOf(func(r *RDMARegion) { r.DataMh = max32 }),
			"Length": fieldOf(func(r *RDMARegion) { r.Length = max32 }),
		},
		"AuthParams": {
			"Magic":             func(off, size int) error { return bytesAt((&AuthParams{}).Append(nil), off, []byte("LWIO")[:size]) },
			"RevId":             fieldOf(func(p *AuthParams) { p.RevID = max16 }),
			"Endian":            fieldOf(func(p *AuthParams) { p.Endian = max16 }),
			"PageSize":          fieldOf(func(p *AuthParams) { p.PageSize = max16 }),
			"BaseSequence":      fieldOf(func(p *AuthParams) { p.BaseSequence = max16 }),
			"MaxRdmaWindowSize": fieldOf(func(p *AuthParams) { p.MaxRdmaWindowSize = max32 }),
			"MaxSendBufferSize": fieldOf(func(p *AuthParams) { p.MaxSendBufferSize = max32 }),
			"MaxRecvBufferSize": fieldOf(func(p *AuthParams) { p.MaxRecvBufferSize = max32 }),
			"HeaderSize":        fieldOf(func(p *AuthParams) { p.HeaderSize = max16 }),
			"Credits":           fieldOf(func(p *AuthParams) { p.Credits = max16 }),
			"RdmaReadSupported": fieldOf(func(p *AuthParams) { p.RdmaReadSupported = max16 }),
			"Options":           func(off, _ int) error { return bytesAt(authKey, off, []byte{AuthOptionKey, AuthOptionKeyLength}) },
		},
		"AuthOption": {
			"OptionCode": func(off, _ int) error { return bytesAt(authKey, AuthParamsFixedSize+off, []byte{AuthOptionKey}) },
			"OptionLen":  func(off, _ int) error { return bytesAt(authKey, AuthParamsFixedSize+off, []byte{AuthOptionKeyLength}) },
			"OptionData": func(off, _ int) error {
				return bytesAt(authKey, AuthParamsFixedSize+off, []byte{0x5a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xa5})
			},
		},
		"FidParams": {
			"ResumeKey":          fieldOf(func(p *FidParams) { copy(p.ResumeKey[:], ones(24)) }),
			"SessionId":          fieldOf(func(p *FidParams) { p.SessionID = max64 }),
			"FlagsAndAttributes": fieldOf(func(p *FidParams) { p.FlagsAndAttributes = max32 }),
		},
		"SRV_RESUME_KEY": {
			"ResumeKey": resumeKey(0),
			"Timestamp": resumeKey(1),
			"Pid":       resumeKey(2),
		},
		"SRV_REQUEST_RESUME_KEY": {
			"Key":           fieldOfE(func(r *ResumeKeyResponse) { copy(r.Key[:], ones(24)) }),
			"ContextLength": func(off, _ int) error { return u16At(rkCtx, off, 4) },
			"Context":       func(off, _ int) error { return bytesAt(rkCtx, off, []byte{'a', 0, 'b', 0}) },
		},
		"ControlHeader": {
			"ProtocolId": func(off, size int) error {
				return bytesAt(must((&NegotiateRequest{}).Append(nil)), off, []byte("LWIO")[:size])
			},
			"RevId":  fieldOfE(func(r *NegotiateRequest) { r.RevID = max32 }),
			"Opcode": func(off, _ int) error { return u16At(must((&NegotiateRequest{}).Append(nil)), off, ControlOpNegotiate) },
			"Length": func(off, _ int) error {
				return u16At(must((&NegotiateResponse{}).Append(nil)), off, NegotiateResponseFixedSize)
			},
		},
		"NegotiateRequest": {
			"ControlHeader":  func(off, size int) error { return sizeIs(off, size, 0, ControlHeaderSize) },
			"ClientName":     fieldOfE(func(r *NegotiateRequest) { r.ClientName = nameFF(MaxHostName) }),
			"Key":            fieldOfE(func(r *NegotiateRequest) { copy(r.Key[:], ones(16)) }),
			"ResponseLength": fieldOfE(func(r *NegotiateRequest) { r.ResponseLength = max16 }),
			"ProviderCount": func(off, _ int) error {
				r := NegotiateRequest{Providers: make([]transport.ProviderInfo, 3)}
				return u16At(must(r.Append(nil)), off, 3)
			},
			"ProviderList": func(off, _ int) error { return sizeIs(off, -1, NegotiateRequestFixedSize, -1) },
		},
		"NegotiateResponse": {
			"ControlHeader": func(off, size int) error { return sizeIs(off, size, 0, ControlHeaderSize) },
			"SrvName":       fieldOfE(func(r *NegotiateResponse) { r.SrvName = nameFF(MaxHostName) }),
			"Key":           fieldOfE(func(r *NegotiateResponse) { copy(r.Key[:], ones(16)) }),
			"ProviderCount": func(off, _ int) error { return u16At(withProvider(transport.ProviderInfo{}), off, 1) },
			"ProviderList":  func(off, _ int) error { return sizeIs(off, -1, NegotiateResponseFixedSize, -1) },
		},
		"Provider": {
			"Name":          prov(func(p *transport.ProviderInfo) { p.Name = nameFF(MaxProviderName) }),
			"InstanceCount": func(off, _ int) error { return u16At(addr, NegotiateResponseFixedSize+off, 1) },
			"InstanceTable": func(off, _ int) error { return u16At(addr, NegotiateResponseFixedSize+off, 3) },
		},
		"NetAddress": {
			"HostAddressLen":   func(off, _ int) error { return u16At(addr, addrAt+off, 3) },
			"DiscriminatorLen": func(off, _ int) error { return u16At(addr, addrAt+off, 2) },
			"HostAddress":      func(off, _ int) error { return bytesAt(addr, addrAt+off, []byte{1, 2, 3, 9, 8}) },
			"Discriminator":    func(off, _ int) error { return bytesAt(addr[len(addr)-2:], 0, []byte{9, 8}) },
		},
	}
}

func sizeIs(off, size, wantOff, wantSize int) error {
	if off != wantOff || size != wantSize {
		return fmt.Errorf("documented at %d size %d, encoder has %d size %d", off, size, wantOff, wantSize)
	}
	return nil
}

// TestWireDocMatchesEncoder checks every documented offset and size against
// the encoder, and that every field the encoder writes is documented.
func TestWireDocMatchesEncoder(t *testing.T) {
	doc := parseWireDoc(t)
	checks := wireChecks()
	for layout, fields := range checks {
		rows, ok := doc[layout]
		if !ok {
			t.Errorf("layout %s is not documented in docs/wire.md", layout)
			continue
		}
		seen := map[string]bool{}
		for _, r := range rows {
			c, ok := fields[r.Field]
			if !ok {
				t.Errorf("%s.%s is documented but has no check", layout, r.Field)
				continue
			}
			seen[r.Field] = true
			if err := c(r.Offset, r.Size); err != nil {
				t.Errorf("%s.%s @%d size %d: %v", layout, r.Field, r.Offset, r.Size, err)
			}
		}
		for f := range fields {
			if !seen[f] {
				t.Errorf("%s.%s is not in the document's table", layout, f)
			}
		}
	}
	for layout := range doc {
		if _, ok := checks[layout]; !ok {
			t.Errorf("documented layout %s is not checked", layout)
		}
	}
	// Fixed parts: the documented sizes add up to the size constants (the
	// header's second union names take no bytes of their own).
	unionViews := map[string]bool{"Status": true, "NumPages": true, "PageSize": true, "ImmediateCookie": true, "Cookie": true}
	sum := func(layout string) int {
		n := 0
		for _, r := range doc[layout] {
			if r.Size > 0 && !(layout == "Header" && unionViews[r.Field]) {
				n += r.Size
			}
		}
		return n
	}
	for layout, want := range map[string]int{
		"Header": HeaderSize, "StatusResponse": StatusResponseSize, "IOStatusBlock": IOStatusBlockSize,
		"RDMARegion": RDMARegionSize, "AuthParams": AuthParamsFixedSize, "FidParams": FidParamsSize,
		"SRV_RESUME_KEY": ResumeKeySize, "SRV_REQUEST_RESUME_KEY": ResumeKeyResponseFixedSize,
		"ControlHeader": ControlHeaderSize, "NegotiateRequest": NegotiateRequestFixedSize,
		"NegotiateResponse": NegotiateResponseFixedSize, "Provider": ProviderFixedSize, "NetAddress": InstanceFixedSize,
	} {
		if got := sum(layout); got != want {
			t.Errorf("%s: documented fixed fields add up to %d, want %d", layout, got, want)
		}
	}
}
