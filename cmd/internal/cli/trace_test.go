package cli

import (
	"testing"
	"time"
)

func TestParseTraceSpec(t *testing.T) {
	for _, tc := range []struct {
		spec        string
		file        string
		delay, span time.Duration
		bad         bool
	}{
		{spec: "/tmp/t", file: "/tmp/t", span: 5 * time.Second},
		{spec: "/tmp/t,2s", file: "/tmp/t", delay: 2 * time.Second, span: 5 * time.Second},
		{spec: "/tmp/t,2s,300ms", file: "/tmp/t", delay: 2 * time.Second, span: 300 * time.Millisecond},
		{spec: ",1s", bad: true},
		{spec: "/tmp/t,x", bad: true},
		{spec: "/tmp/t,1s,0s", bad: true},
		{spec: "/tmp/t,-1s", bad: true},
		{spec: "/tmp/t,1s,1s,1s", bad: true},
	} {
		file, delay, span, err := parseTraceSpec(tc.spec)
		if tc.bad {
			if err == nil {
				t.Errorf("%q: accepted (%q %v %v)", tc.spec, file, delay, span)
			}
			continue
		}
		if err != nil || file != tc.file || delay != tc.delay || span != tc.span {
			t.Errorf("%q: %q %v %v %v, want %q %v %v", tc.spec, file, delay, span, err, tc.file, tc.delay, tc.span)
		}
	}
}
