package protocol

// Request is one decoded client message (FIG. 6A-17C). Which fields beyond
// Header mean anything depends on Header.Opcode:
//
//	OpAuth                  Auth
//	OpRegister              Register
//	OpVecRead               Regions (aliases the decoded buffer)
//	OpWrite, OpVecWrite     Data (aliases the decoded buffer)
//	OpFragment              Data (aliases the decoded buffer)
//	others                  Header alone
//
// Regions and Data are not copied: they stay valid only as long as the
// buffer given to DecodeRequest is not reused (e.g. until the receive
// buffer is posted again).
type Request struct {
	Header   Header
	Auth     AuthParams
	Register FidParams
	Regions  RegionList
	Data     []byte
}

// knownFlags are the header flag bits the seed defines, and FRAGMENTED.
const knownFlags = FlagInterrupt | FlagControl | FlagCollapse | FlagFragmented

// DecodeRequest decodes and validates one whole client message; b is exactly
// the bytes received. It never panics and allocates nothing for READ,
// WRITE, VEC_READ and VEC_WRITE. Every error is a *FieldError, which ends
// the connection (IsProtocolError). What it checks:
//
//   - the opcode is one of the ten or FRAGMENT and Flags has only the
//     seed's bits and FRAGMENTED, FlagCollapse only on VEC_WRITE,
//     FlagFragmented only on WRITE and non-collapsed VEC_WRITE, and a
//     FRAGMENT no flag but INTERRUPT;
//   - Length against the bytes: READ and VEC_READ, bytes to read (the
//     message is the header, plus regions for VEC_READ); WRITE and
//     non-collapsed VEC_WRITE, the data after the header, or with
//     FRAGMENTED the whole write, more than its first fragment carries;
//     collapsed VEC_WRITE, the range written, with min(Length, PageSize)
//     data bytes; FRAGMENT, its data (at least one byte); AUTH and
//     REGISTER, the whole message; CLOSE, CANCEL, CREDIT and INTERRUPT,
//     HeaderSize;
//   - Marker is 0xFF on READ, WRITE, VEC_READ, VEC_WRITE and FRAGMENT;
//   - Offset WriteToEndOfFile (an append) only on WRITE;
//   - the parameter blocks and region lists as their own decoders do.
//
// Semantic checks (is the Fid registered, is Length within the negotiated
// window, is the header size the negotiated one) are the engine's.
func DecodeRequest(b []byte) (Request, error) {
	var r Request
	h, err := DecodeHeader(b)
	if err != nil {
		return r, err
	}
	r.Header = h
	msg := h.Opcode.String()
	if !h.Opcode.Valid() {
		return r, fieldErr("REQUEST", "Opcode", "unknown opcode 0x%02x", uint8(h.Opcode))
	}
	if h.Flags&^knownFlags != 0 {
		return r, fieldErr(msg, "Flags", "unknown bits 0x%02x", h.Flags&^knownFlags)
	}
	if h.Flags&FlagCollapse != 0 && h.Opcode != OpVecWrite {
		return r, fieldErr(msg, "Flags", "COLLAPSE_IO on a %s request", msg)
	}
	frag := h.Flags&FlagFragmented != 0
	if frag && (h.Opcode != OpWrite && h.Opcode != OpVecWrite || h.Flags&FlagCollapse != 0) {
		return r, fieldErr(msg, "Flags", "FRAGMENTED on a %s request", msg)
	}
	body := b[HeaderSize:]
	if (h.Opcode.IsIO() || h.Opcode == OpFragment) && h.Marker != MarkerIO {
		return r, fieldErr(msg, "Marker", "0x%02x, want 0x%02x", h.Marker, MarkerIO)
	}
	if h.Offset == WriteToEndOfFile && h.Opcode.IsIO() && h.Opcode != OpWrite {
		return r, fieldErr(msg, "Offset", "FILE_WRITE_TO_END_OF_FILE (0x%x) on a %s: only WRITE appends", WriteToEndOfFile, msg)
	}
	switch h.Opcode {
	case OpRead:
		if len(body) != 0 {
			return r, fieldErr(msg, "Length", "%d unexpected bytes after the header", len(body))
		}
	case OpVecRead:
		if err := checkVecRead(&h, body); err != nil {
			return r, err
		}
		r.Regions = RegionList(body)
	case OpWrite, OpVecWrite:
		switch {
		case h.Flags&FlagCollapse != 0:
			if err := checkCollapsed(&h, len(body)); err != nil {
				return r, err
			}
		case frag:
			// The first fragment: some of the data, not all of it.
			if len(body) == 0 || uint64(len(body)) >= uint64(h.Length) {
				return r, fieldErr(msg, "Length", "fragmented write of %d bytes with %d in its first fragment", h.Length, len(body))
			}
		case uint64(len(body)) != uint64(h.Length):
			return r, fieldErr(msg, "Length", "%d, but %d data bytes follow the header", h.Length, len(body))
		}
		r.Data = body
	case OpFragment:
		if h.Flags&^FlagInterrupt != 0 {
			return r, fieldErr(msg, "Flags", "0x%02x on a FRAGMENT", h.Flags)
		}
		if len(body) == 0 || uint64(len(body)) != uint64(h.Length) {
			return r, fieldErr(msg, "Length", "%d, but %d data bytes follow the header", h.Length, len(body))
		}
		r.Data = body
	case OpAuth, OpRegister:
		if uint64(h.Length) != uint64(len(b)) {
			return r, fieldErr(msg, "Length", "%d, but the message is %d bytes", h.Length, len(b))
		}
		if h.Opcode == OpAuth {
			r.Auth, err = DecodeAuthParams(body)
		} else {
			r.Register, err = DecodeFidParams(body)
		}
		if err != nil {
			return r, err
		}
	default: // CLOSE, CANCEL, CREDIT, INTERRUPT: the header alone.
		if len(body) != 0 {
			return r, fieldErr(msg, "Length", "%d unexpected bytes after the header", len(body))
		}
		if h.Length != HeaderSize {
			return r, fieldErr(msg, "Length", "%d, want %d", h.Length, HeaderSize)
		}
	}
	return r, nil
}

// Size returns the encoded size of r.
func (r *Request) Size() int {
	n := HeaderSize
	switch r.Header.Opcode {
	case OpAuth:
		n += r.Auth.Size()
	case OpRegister:
		n += FidParamsSize
	case OpVecRead:
		n += len(r.Regions) - len(r.Regions)%RDMARegionSize
	case OpWrite, OpVecWrite, OpFragment:
		n += len(r.Data)
	}
	return n
}

// Append appends r encoded as its opcode says: the header, then the
// opcode's body (see Request). It is the inverse of DecodeRequest.
func (r *Request) Append(b []byte) []byte {
	b = r.Header.Append(b)
	switch r.Header.Opcode {
	case OpAuth:
		b = r.Auth.Append(b)
	case OpRegister:
		b = r.Register.Append(b)
	case OpVecRead:
		b = append(b, r.Regions[:len(r.Regions)-len(r.Regions)%RDMARegionSize]...)
	case OpWrite, OpVecWrite, OpFragment:
		b = append(b, r.Data...)
	}
	return b
}
