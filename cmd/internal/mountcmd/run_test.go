package mountcmd

import (
	"bytes"
	"strings"
	"testing"
)

func TestRunErrors(t *testing.T) {
	t.Setenv("LWIO_PASSWORD", "")
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{}, 2, "usage"},
		{[]string{"//h/s", "/mnt", "-o", "password=secret"}, 2, "credentials=FILE or LWIO_PASSWORD"},
		{[]string{"//h/s", "/mnt", "-o", "username=u"}, 2, "no password"},
		{[]string{"h/s", "/mnt"}, 2, "//HOST[:PORT]/SHARE"},
	} {
		var out, errb bytes.Buffer
		code := run("lwio-mount", tc.args, &out, &errb)
		msg := errb.String()
		if code != tc.code || !strings.Contains(msg, tc.want) || strings.Count(msg, "\n") != 1 ||
			!strings.HasPrefix(msg, "lwio-mount: ") || strings.Contains(msg, "secret") {
			t.Errorf("run(%q) = %d, stderr %q; want %d and one line saying %q", tc.args, code, msg, tc.code, tc.want)
		}
	}
}

func TestRunProviders(t *testing.T) {
	var out, errb bytes.Buffer
	if code := run("lwio-mount", []string{"-providers"}, &out, &errb); code != 0 {
		t.Fatalf("-providers exit %d: %s", code, errb.String())
	}
	for _, w := range []string{"RDMA devices:", "verbs:", "softrdma"} {
		if !strings.Contains(out.String(), w) {
			t.Errorf("-providers output lacks %q:\n%s", w, out.String())
		}
	}
}
