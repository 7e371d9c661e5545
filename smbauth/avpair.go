package smbauth

import (
	"time"
)

// AvID is the AvId of an AV_PAIR (MS-NLMP §2.2.2.1).
type AvID uint16

// AV pair identifiers of MS-NLMP §2.2.2.1.
const (
	AvEOL             AvID = 0x0000 // MsvAvEOL: ends the list
	AvNbComputerName  AvID = 0x0001 // MsvAvNbComputerName
	AvNbDomainName    AvID = 0x0002 // MsvAvNbDomainName
	AvDNSComputerName AvID = 0x0003 // MsvAvDnsComputerName
	AvDNSDomainName   AvID = 0x0004 // MsvAvDnsDomainName
	AvDNSTreeName     AvID = 0x0005 // MsvAvDnsTreeName
	AvFlags           AvID = 0x0006 // MsvAvFlags: 32-bit flags
	AvTimestamp       AvID = 0x0007 // MsvAvTimestamp: FILETIME
	AvSingleHost      AvID = 0x0008 // MsvAvSingleHost
	AvTargetName      AvID = 0x0009 // MsvAvTargetName: SPN
	AvChannelBindings AvID = 0x000A // MsvAvChannelBindings
)

// Bits of the MsvAvFlags value (MS-NLMP §2.2.2.1).
const (
	AvFlagConstrained     uint32 = 0x1 // the account authentication is constrained
	AvFlagMICPresent      uint32 = 0x2 // the client is providing a MIC
	AvFlagUntrustedTarget uint32 = 0x4 // the SPN came from an untrusted source
)

func (id AvID) String() string {
	switch id {
	case AvEOL:
		return "MsvAvEOL"
	case AvNbComputerName:
		return "MsvAvNbComputerName"
	case AvNbDomainName:
		return "MsvAvNbDomainName"
	case AvDNSComputerName:
		return "MsvAvDnsComputerName"
	case AvDNSDomainName:
		return "MsvAvDnsDomainName"
	case AvDNSTreeName:
		return "MsvAvDnsTreeName"
	case AvFlags:
		return "MsvAvFlags"
	case AvTimestamp:
		return "MsvAvTimestamp"
	case AvSingleHost:
		return "MsvAvSingleHost"
	case AvTargetName:
		return "MsvAvTargetName"
	case AvChannelBindings:
		return "MsvAvChannelBindings"
	}
	return "AvId(0x" + hexUint32(uint32(id))[4:] + ")"
}

// AVPair is one AV_PAIR (MS-NLMP §2.2.2.1). String values are UTF-16LE.
type AVPair struct {
	ID    AvID
	Value []byte
}

// AVPairs is a list of AV pairs without its terminating MsvAvEOL, which
// Marshal adds and ParseAVPairs strips.
type AVPairs []AVPair

// avPairHeaderSize is AvId (2) + AvLen (2).
const avPairHeaderSize = 4

// Marshal encodes the list followed by MsvAvEOL. An MsvAvEOL inside the list
// is skipped: the list ends exactly once.
func (p AVPairs) Marshal() []byte {
	var b []byte
	for _, a := range p {
		if a.ID == AvEOL {
			continue
		}
		b = le.AppendUint16(b, uint16(a.ID))
		b = le.AppendUint16(b, uint16(len(a.Value)))
		b = append(b, a.Value...)
	}
	return append(b, 0, 0, 0, 0)
}

// ParseAVPairs decodes an AV pair list up to its MsvAvEOL; bytes after the
// EOL are ignored, as the specification leaves them undefined. A list without
// EOL, or a pair running past the buffer, is malformed. An empty buffer is an
// empty list.
func ParseAVPairs(b []byte) (AVPairs, error) {
	if len(b) == 0 {
		return nil, nil
	}
	var out AVPairs
	for {
		if len(b) < avPairHeaderSize {
			return nil, malformed("AV pair list without MsvAvEOL")
		}
		id := AvID(le.Uint16(b))
		n := int(le.Uint16(b[2:]))
		b = b[avPairHeaderSize:]
		if id == AvEOL {
			return out, nil
		}
		if n > len(b) {
			return nil, malformed("AV pair %v length %d past the end (%d left)", id, n, len(b))
		}
		out = append(out, AVPair{ID: id, Value: clone(b[:n])})
		b = b[n:]
	}
}

// Get returns the value of the first pair with that id.
func (p AVPairs) Get(id AvID) ([]byte, bool) {
	for _, a := range p {
		if a.ID == id {
			return a.Value, true
		}
	}
	return nil, false
}

// StringValue returns the UTF-16LE string value of the first pair with that
// id, "" when absent or not valid UTF-16.
func (p AVPairs) StringValue(id AvID) string {
	v, ok := p.Get(id)
	if !ok {
		return ""
	}
	s, err := fromUTF16LE(v)
	if err != nil {
		return ""
	}
	return s
}

// Flags returns the MsvAvFlags value, 0 when absent or mis-sized.
func (p AVPairs) Flags() uint32 {
	v, ok := p.Get(AvFlags)
	if !ok || len(v) != 4 {
		return 0
	}
	return le.Uint32(v)
}

// Timestamp returns the MsvAvTimestamp FILETIME when present and 8 bytes long.
func (p AVPairs) Timestamp() (uint64, bool) {
	v, ok := p.Get(AvTimestamp)
	if !ok || len(v) != 8 {
		return 0, false
	}
	return le.Uint64(v), true
}

// filetimeEpochSeconds is 1601-01-01 to 1970-01-01 in seconds.
const filetimeEpochSeconds = 11644473600

// Filetime converts t to a FILETIME: 100 ns intervals since 1601-01-01 UTC,
// the encoding of MsvAvTimestamp and of the NTLMv2 TimeStamp. Seconds and
// nanoseconds are converted apart so that times outside time.UnixNano's
// 1678–2262 range (FILETIME 0 among them) still convert exactly.
func Filetime(t time.Time) uint64 {
	return uint64((t.Unix()+filetimeEpochSeconds)*1e7 + int64(t.Nanosecond()/100))
}

// FiletimeTime converts a FILETIME back to a UTC time.Time.
func FiletimeTime(ft uint64) time.Time {
	secs := int64(ft/1e7) - filetimeEpochSeconds
	return time.Unix(secs, int64(ft%1e7)*100).UTC()
}

func clone(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	return append([]byte(nil), b...)
}
