package fs

import "testing"

// TestOptionSettings: WriteBehind and ReadAhead take their default at 0,
// turn off when negative, and ReadAhead stops at MaxWrite.
func TestOptionSettings(t *testing.T) {
	for _, tc := range []struct {
		o      Options
		wb, ra int
	}{
		{Options{}, DefaultWriteBehind, MaxReadAhead},
		{Options{WriteBehind: -1, ReadAhead: -1}, 0, 0},
		{Options{WriteBehind: 3, ReadAhead: 128 << 10}, 3, 128 << 10},
		{Options{WriteBehind: 64, ReadAhead: 4 * MaxWrite}, 64, MaxWrite},
	} {
		if wb, ra := tc.o.writeBehind(), tc.o.readAhead(); wb != tc.wb || ra != tc.ra {
			t.Errorf("WriteBehind %d, ReadAhead %d: writeBehind() %d, readAhead() %d; want %d, %d",
				tc.o.WriteBehind, tc.o.ReadAhead, wb, ra, tc.wb, tc.ra)
		}
	}
}
