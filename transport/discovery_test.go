package transport

import (
	"context"
	"errors"
	"os"
	"reflect"
	"strings"
	"testing"
)

func inst(t *testing.T, addr string) Instance {
	t.Helper()
	in, err := InstanceFor(addr)
	if err != nil {
		t.Fatal(err)
	}
	return in
}

func TestCommon(t *testing.T) {
	v1 := inst(t, "10.0.0.1:4790")
	v2 := inst(t, "[fd00::1]:4790")
	s1 := inst(t, "10.0.0.1:4791")
	r1 := inst(t, "10.0.0.2:4790")
	tests := []struct {
		name          string
		local, remote []ProviderInfo
		want          []ProviderInfo
	}{
		{"both", []ProviderInfo{{Name: "verbs", Instances: []Instance{v1, v2}}, {Name: "softrdma", Instances: []Instance{s1}}},
			[]ProviderInfo{{Name: "softrdma", Instances: nil}, {Name: "verbs", Instances: []Instance{r1}}},
			[]ProviderInfo{{Name: "verbs", Instances: []Instance{v1, v2}}, {Name: "softrdma", Instances: []Instance{s1}}}},
		{"local order wins", []ProviderInfo{{Name: "softrdma", Instances: []Instance{s1}}, {Name: "verbs", Instances: []Instance{v1}}},
			[]ProviderInfo{{Name: "verbs", Instances: []Instance{r1}}, {Name: "softrdma", Instances: []Instance{r1}}},
			[]ProviderInfo{{Name: "softrdma", Instances: []Instance{s1}}, {Name: "verbs", Instances: []Instance{v1}}}},
		{"only soft shared", []ProviderInfo{{Name: "verbs", Instances: []Instance{v1}}, {Name: "softrdma", Instances: []Instance{s1}}},
			[]ProviderInfo{{Name: "softrdma", Instances: []Instance{r1}}},
			[]ProviderInfo{{Name: "softrdma", Instances: []Instance{s1}}}},
		{"nothing shared", []ProviderInfo{{Name: "verbs", Instances: []Instance{v1}}},
			[]ProviderInfo{{Name: "softrdma", Instances: []Instance{r1}}}, nil},
		{"empty remote", []ProviderInfo{{Name: "verbs", Instances: []Instance{v1}}}, nil, nil},
		{"empty local", nil, []ProviderInfo{{Name: "verbs", Instances: []Instance{r1}}}, nil},
		{"duplicate local names: first wins", []ProviderInfo{{Name: "verbs", Instances: []Instance{v1}}, {Name: "verbs", Instances: []Instance{v2}}},
			[]ProviderInfo{{Name: "verbs", Instances: nil}},
			[]ProviderInfo{{Name: "verbs", Instances: []Instance{v1}}}},
		{"local without instances dropped", []ProviderInfo{{Name: "verbs", Instances: nil}, {Name: "softrdma", Instances: []Instance{s1}}},
			[]ProviderInfo{{Name: "verbs", Instances: []Instance{r1}}, {Name: "softrdma", Instances: []Instance{r1}}},
			[]ProviderInfo{{Name: "softrdma", Instances: []Instance{s1}}}},
		{"names are exact", []ProviderInfo{{Name: "Verbs", Instances: []Instance{v1}}},
			[]ProviderInfo{{Name: "verbs", Instances: []Instance{r1}}}, nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got := Common(tc.local, tc.remote)
			if !reflect.DeepEqual(got, tc.want) {
				t.Errorf("Common(%v, %v) = %v, want %v", tc.local, tc.remote, got, tc.want)
			}
		})
	}
}

func TestCommonDoesNotAlias(t *testing.T) {
	local := []ProviderInfo{{Name: "verbs", Instances: []Instance{inst(t, "10.0.0.1:1")}}}
	got := Common(local, local)
	got[0].Instances[0] = Instance{}
	if local[0].Instances[0].HostAddress == nil {
		t.Fatal("Common's result shares its Instances slice with local")
	}
}

// fakeProvider stands for the verbs provider in discovery tests.
type fakeProvider struct {
	name string
	err  error
}

func (f fakeProvider) Name() string     { return f.name }
func (f fakeProvider) Available() error { return f.err }
func (f fakeProvider) Listen(string, Config) (Listener, error) {
	return nil, errors.New("fake")
}
func (f fakeProvider) Dial(context.Context, string, Config) (Conn, error) {
	return nil, errors.New("fake")
}

// TestDiscoverHere checks discovery against this host: with no RDMA device
// (no /sys/class/infiniband) verbs must be left out with a reason that says
// so, and the software provider must still be offered.
func TestDiscoverHere(t *testing.T) {
	soft := ProviderInfo{Name: "softrdma", Instances: []Instance{inst(t, "127.0.0.1:4791")}}
	var sb strings.Builder
	d := Describe(&sb, DiscoverConfig{Verbs: fakeProvider{name: "verbs"}, VerbsPort: 4790, Others: []ProviderInfo{soft}})
	t.Logf("Describe:\n%s", sb.String())
	if len(d.Providers) == 0 || d.Providers[len(d.Providers)-1].Name != "softrdma" {
		t.Fatalf("software provider not last in %v", d.Providers)
	}
	if !strings.Contains(sb.String(), "RDMA devices: ") || !strings.Contains(sb.String(), "softrdma[127.0.0.1:4791]") {
		t.Errorf("Describe output lacks the device line or the soft provider:\n%s", sb.String())
	}
	if want := os.Getenv("LWIOFS_VERBS_ADDR"); want != "" {
		// The Soft-RoCE rig (test/vm) made rxe0 on dum0 with this address:
		// discovery must find it through rdmamap and offer it first.
		if d.VerbsErr != nil || len(d.Providers) != 2 || d.Providers[0].Name != "verbs" {
			t.Fatalf("rig device not discovered: err %v, providers %v", d.VerbsErr, d.Providers)
		}
		if got := d.Providers[0].String(); !strings.Contains(got, want+":4790") {
			t.Errorf("verbs instances %s lack %s:4790", got, want)
		}
		return
	}
	if len(d.Devices) > 0 {
		t.Logf("this host has RDMA devices; checking the verbs entry")
		if d.VerbsErr == nil && d.Providers[0].Name != "verbs" {
			t.Errorf("verbs usable but not first: %v", d.Providers)
		}
		return
	}
	if d.VerbsErr == nil {
		t.Fatalf("no RDMA devices, yet verbs listed: %v", d.Providers)
	}
	if len(d.Providers) != 1 {
		t.Errorf("providers = %v, want only the software one", d.Providers)
	}
	want := "no RDMA devices"
	if _, err := os.Stat(RDMAClassDir); err != nil {
		want = RDMAClassDir + " does not exist"
	}
	if !strings.Contains(d.VerbsErr.Error(), want) || !strings.Contains(sb.String(), "verbs: not usable: ") {
		t.Errorf("verbs reason %q does not say %q; output:\n%s", d.VerbsErr, want, sb.String())
	}
}

func TestDiscoverVerbsUnavailable(t *testing.T) {
	why := errors.New("verbs provider not built in (CGO_ENABLED=0)")
	d := Discover(DiscoverConfig{Verbs: fakeProvider{"verbs", why}, VerbsPort: 4790})
	if len(d.Providers) != 0 {
		t.Errorf("providers = %v, want none", d.Providers)
	}
	if !errors.Is(d.VerbsErr, why) {
		t.Errorf("VerbsErr = %v, want the provider's own reason %q", d.VerbsErr, why)
	}
	d = Discover(DiscoverConfig{})
	if d.VerbsErr == nil || len(d.Providers) != 0 {
		t.Errorf("Discover with no providers = %+v", d)
	}
}
