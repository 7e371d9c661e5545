# lwiofs — see README.md. Every target installs what it needs on a fresh
# Debian machine (scripts/deps.sh).
GO        ?= go
export PATH := $(PATH):/usr/local/go/bin
BIN       := bin
FUZZTIME  ?= 10s
PKGS      := ./...

# Install layout (make install PREFIX=… DESTDIR=…; see dist/install.sh).
PREFIX     ?= /usr/local
BINDIR     ?= $(PREFIX)/bin
SBINDIR    ?= $(PREFIX)/sbin
MANDIR     ?= $(PREFIX)/share/man
DATADIR    ?= $(PREFIX)/share/lwiofs
UNITDIR    ?= $(PREFIX)/lib/systemd/system
SYSCONFDIR ?= /etc
DESTDIR    ?=
export PREFIX BINDIR SBINDIR MANDIR DATADIR UNITDIR SYSCONFDIR DESTDIR BIN

# -version prints the VCS revision the go command stamps into the build:
# ask for it whenever git can answer (GOFLAGS may say -buildvcs=false).
BUILDVCS  := $(shell git rev-parse --git-dir >/dev/null 2>&1 && echo true || echo false)
MANPAGES  := $(patsubst docs/man/%.md,$(BIN)/man/%,$(wildcard docs/man/*.md))

.PHONY: all build deps test test-short test-verbs test-install vet fuzz bench run clean \
	man install uninstall deb

all: build

deps:
	@scripts/deps.sh

build: deps
	$(GO) build -buildvcs=$(BUILDVCS) -o $(BIN)/ ./cmd/...

# The man pages, from docs/man/*.md by go-md2man (a go.mod tool).
man: $(MANPAGES)

$(BIN)/man/%: docs/man/%.md go.mod
	@mkdir -p $(@D)
	$(GO) tool go-md2man -in $< -out $@

# The programs, man pages, systemd unit and example configuration.
install: build man
	dist/install.sh install

uninstall:
	dist/install.sh uninstall

# A Debian package of the same, built with dpkg-deb from a staged install.
deb: build man
	@scripts/deps.sh deb
	dist/mkdeb.sh

# As root: make install, mounts through mount -t fuse.lwio and an fstab
# line, make uninstall leaving nothing; then the same with the .deb.
test-install:
	@scripts/deps.sh install
	dist/test-install.sh

# The full default suite: unit tests, conformance, engines and the FUSE
# end-to-end tests, under the race detector.
test: deps
	$(GO) test -race -count=1 -timeout 30m $(PKGS)

test-short:
	$(GO) test -short -count=1 $(PKGS)

# vet also builds for arm64: some unix types (Stat_t's) differ from amd64's.
vet:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	$(GO) vet $(PKGS)
	GOARCH=arm64 $(GO) build $(PKGS)

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

# fio, cp and metadata jobs through the mount against the export itself, a
# no-op FUSE passthrough and sshfs, on a tmpfs export (then, in full mode, on
# disk), in one interleaved run, beside the pieces of a 4 KiB read measured
# alone (docs/bench.md); BENCH_QUICK=1 for the short form.
bench: build
	bench/run.sh

# Real verbs in a qemu guest with Soft-RoCE: the transport conformance suite,
# then the mount over verbs end to end (docs/verbs.md).
test-verbs:
	@scripts/deps.sh vm
	test/vm/test-verbs.sh

clean:
	rm -rf $(BIN)
