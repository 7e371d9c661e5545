package enum

import "testing"

type color uint8

type signed int32

func TestName(t *testing.T) {
	names := []string{0: "red", 2: "blue"}
	for _, c := range []struct {
		got, want string
	}{
		{Name(names, color(0), "color"), "red"},
		{Name(names, color(2), "color"), "blue"},
		{Name(names, color(1), "color"), "color(1)"}, // a gap in the table
		{Name(names, color(3), "color"), "color(3)"},
		{Name(names, color(255), "color"), "color(255)"},
		{Name(names, signed(-1), "signed"), "signed(-1)"},
		{Name(nil, signed(0), "signed"), "signed(0)"},
	} {
		if c.got != c.want {
			t.Errorf("got %q, want %q", c.got, c.want)
		}
	}
}
