package defaults

import (
	"testing"
	"time"
)

func TestSet(t *testing.T) {
	for _, tc := range []struct{ v, want int }{{0, 7}, {-3, 7}, {5, 5}} {
		v := tc.v
		Set(&v, 7)
		if v != tc.want {
			t.Errorf("Set(%d, 7) = %d, want %d", tc.v, v, tc.want)
		}
	}
	var d time.Duration
	Set(&d, time.Second)
	if d != time.Second {
		t.Errorf("Set(0s, 1s) = %v", d)
	}
}
