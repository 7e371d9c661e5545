# lwiofs — see README.md. Every target installs what it needs on a fresh
# Debian machine (scripts/deps.sh).
GO        ?= go
export PATH := $(PATH):/usr/local/go/bin
BIN       := bin
FUZZTIME  ?= 10s
PKGS      := ./...

.PHONY: all build deps test test-short test-verbs vet fuzz bench run clean

all: build

deps:
	@scripts/deps.sh

build: deps
	$(GO) build -o $(BIN)/ ./cmd/...

# The full default suite: unit tests, conformance, engines and the FUSE
# end-to-end tests, under the race detector.
test: deps
	$(GO) test -race -count=1 -timeout 30m $(PKGS)

test-short:
	$(GO) test -short -count=1 $(PKGS)

vet:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)

# Each fuzz target for FUZZTIME (go test allows one -fuzz target per run).
fuzz:
	@set -e; for pkg in $$($(GO) list $(PKGS)); do \
	  for t in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
	    echo "== $$pkg $$t"; $(GO) test -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) $$pkg; \
	  done; \
	done

# The main job: a server and a mount of a demo share over the software RDMA
# provider on 127.0.0.1, in the foreground until Ctrl-C.
run: build
	scripts/run.sh

# fio and metadata jobs through the mount against the alternatives, in one
# interleaved run; BENCH_QUICK=1 for the short form.
bench: build
	bench/run.sh

# Real verbs in a qemu guest with Soft-RoCE: the transport conformance suite,
# then the mount over verbs end to end (docs/verbs.md).
test-verbs:
	@scripts/deps.sh vm
	test/vm/test-verbs.sh

clean:
	rm -rf $(BIN)
