package verbs

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/lwiofs/lwiofs/transport"
	"github.com/lwiofs/lwiofs/transport/conformance"
	"github.com/sirupsen/logrus"
)

// inVM is set by test/vm/run.sh: there a device was promised, so a missing
// one fails the test instead of skipping it.
var inVM = os.Getenv("LWIOFS_VM") == "1"

// rnrTimeout is how long a SEND without a receive waits with the default
// Options: (RNRRetry 6 + 1 tries) x MinRNRTimer 28 (163.84 ms).
const rnrTimeout = 7 * 164 * time.Millisecond

// verbsAddr returns the address to listen on ("ip:0") when verbs can run
// here, or why not.
func verbsAddr() (string, error) {
	if err := New(Options{}).Available(); err != nil {
		return "", err
	}
	addr := os.Getenv("LWIOFS_VERBS_ADDR")
	if addr == "" {
		d := transport.Discover(transport.DiscoverConfig{Verbs: New(Options{}), VerbsPort: 1})
		if d.VerbsErr != nil {
			return "", d.VerbsErr
		}
		a, _ := d.Providers[0].Instances[0].Addr()
		addr, _, _ = net.SplitHostPort(a)
	}
	return net.JoinHostPort(addr, "0"), nil
}

// usable returns the address to listen on when verbs can run here, or skips
// (printing why) — except in the VM rig, where it fails.
func usable(tb testing.TB) string {
	tb.Helper()
	addr, err := verbsAddr()
	if err == nil {
		return addr
	}
	if inVM {
		tb.Fatalf("verbs unavailable inside the VM rig: %v", err)
	}
	tb.Skipf("SKIP verbs tests (not a pass): %v", err)
	return ""
}

// TestAvailable checks that Available agrees with the host: an error on a
// host without RDMA devices, saying why; nil where the rig made a device.
func TestAvailable(t *testing.T) {
	err := New(Options{}).Available()
	t.Logf("Available: %v", err)
	if inVM && err != nil {
		t.Fatalf("inside the VM rig verbs must be available: %v", err)
	}
	if !Built {
		if err == nil {
			t.Fatal("stub build reports verbs available")
		}
		return
	}
	if _, serr := os.Stat("/sys/class/infiniband"); serr != nil {
		if err == nil {
			t.Fatal("no /sys/class/infiniband, yet Available reports nil")
		}
		if msg := err.Error(); !strings.Contains(msg, "no RDMA devices") && !strings.Contains(msg, "not loadable") {
			t.Errorf("Available error %q does not say plainly why", msg)
		}
	}
}

// TestConformance runs the transport conformance suite against the verbs
// provider (two providers, so client and server have their own protection
// domains, as two hosts would).
func TestConformance(t *testing.T) {
	addr := usable(t)
	timeout := 10 * time.Second
	if inVM {
		timeout = 30 * time.Second // TCG: ~1 ms round trips, tens of MB/s
	}
	if brokenRKey {
		// The deliberately broken build is expected to fail; let the cases
		// that wait for a write that never lands give up sooner.
		timeout = 5 * time.Second
	}
	if s := os.Getenv("LWIOFS_VERBS_TIMEOUT"); s != "" {
		if d, err := time.ParseDuration(s); err == nil {
			timeout = d
		}
	}
	conformance.Run(t, conformance.Env{
		Client:     New(Options{Logger: testLogger(t)}),
		Server:     New(Options{Logger: testLogger(t)}),
		Addr:       addr,
		RNRTimeout: rnrTimeout,
		Timeout:    timeout,
		Skip:       skipFor(t),
	})
}

// skipFor lists the conformance cases where the device differs from the
// interface's promise, with why (docs/verbs.md repeats them). Verbs on a
// hardware NIC is expected to pass every case.
func skipFor(t *testing.T) map[string]string {
	m := map[string]string{}
	if softRoCE(t) {
		m["LengthError"] = "Soft-RoCE (rdma_rxe, Linux 6.1) completes a receive too short for the incoming SEND " +
			"with IBV_WC_LOC_QP_OP_ERR instead of the IB spec's IBV_WC_LOC_LEN_ERR (hardware NICs follow the spec); " +
			"TestLengthErrorSoftRoCE checks the rest of the case"
	}
	return m
}

// softRoCE reports whether every RDMA device here is Soft-RoCE (rdma_rxe
// devices have a "parent" attribute naming their netdev; hardware has not).
func softRoCE(t *testing.T) bool {
	devs, _ := transport.RDMADevices()
	for _, d := range devs {
		if _, err := os.Stat(filepath.Join(transport.RDMAClassDir, d.Name, "parent")); err != nil {
			return false
		}
	}
	t.Logf("RDMA devices %v are Soft-RoCE (rdma_rxe)", devs)
	return len(devs) > 0
}

// testLogger logs through t when LWIOFS_VERBS_DEBUG=1, else is quiet.
func testLogger(t *testing.T) logrus.FieldLogger {
	if os.Getenv("LWIOFS_VERBS_DEBUG") != "1" {
		return nil
	}
	l := logrus.New()
	l.SetLevel(logrus.DebugLevel)
	l.Out = os.Stderr
	return l
}
