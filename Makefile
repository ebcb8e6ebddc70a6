# overlay-plugin build and test entry points. CI runs .ci/run, which runs
# `make test` as root.

GO      ?= go
# The release (semantic version, VERSION file) and the commit it is built
# from; `overlay-plugin version` prints both, the plugin's tag is the version.
VERSION ?= $(shell cat VERSION)
COMMIT  ?= $(shell git describe --always --dirty --abbrev=12 --exclude='*' 2>/dev/null || echo unknown)
BIN     := bin/overlay-plugin
# Static, reproducible-path binary: the managed plugin's rootfs has no libc.
LDFLAGS := -s -w -X main.version=$(VERSION) -X main.commit=$(COMMIT)
# runtime/secret: key computations leave no copy in registers, on the stack
# or on the heap (encryption/erase.go); the tests check it.
GOEXPERIMENT ?= runtimesecret
export GOEXPERIMENT

.PHONY: all build demo test test-go test-unit test-vm test-vm-docker vm-smoke test-vagrant bench bench-vm bench-scale bench-scale-d bench-scale-realtime plugin plugin-install plugin-push e2e-docker vet deadcode clean

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/overlay-plugin

# The main job (internal/demo): three hosts (network namespaces) on this
# machine, each running the real plugin with gossip, a network, a container
# per host reaching every other across hosts; everything is removed on exit
# (root). DEMO_ARGS=--keep pauses before cleaning up. The plugin is the
# `build` one, or OVERLAY_PLUGIN_BIN when set (then it is not built).
demo: $(if $(OVERLAY_PLUGIN_BIN),,build)
	CGO_ENABLED=0 $(GO) build -o bin/demo ./internal/demo/cmd
	OVERLAY_PLUGIN_BIN=$(or $(OVERLAY_PLUGIN_BIN),$(CURDIR)/$(BIN)) bin/demo $(DEMO_ARGS)

# The whole suite, every layer: the Go tests, the VM, the Docker swarm, the
# Docker swarm in the VM (scripts/test.sh; TEST_LAYERS="go vm docker
# vm-docker" selects). Root: without it
# the privileged layers skip with a printed reason and the run fails.
test:
	bash scripts/test.sh

# The Go layer: vet and deadcode, then every package under the race
# detector and the lock-order check (-tags lockrank: every Lock checked
# against the order in internal/lockrank, the test plugins built the same
# way), then the bench module's own tests (its measuring code's
# correctness checks; a module of its own, so ./... above does not reach
# it). Tests that need root (namespaces, netlink) skip with a printed
# reason when not root.
test-go: vet deadcode
	$(GO) test -race -tags lockrank -count=1 ./...
	cd bench && $(GO) test -race -count=1 ./...

# Fast tests only: no race detector, long and privileged tests skipped.
test-unit:
	$(GO) test -short ./...

# The IPsec data path on Debian's stock kernel under qemu: this machine's
# kernel lacks ESP. First the watchdog that boots a hung guest again
# (scripts/vm/hang-test.sh, three short boots). Then one VM boot runs the xfrm netlink package
# (encryption/netlinkxfrm) and the three-host encrypted scenario
# (test/encrypted) with the real plugin.
# Root only; the first run installs qemu and caches the kernel in
# /var/cache/overlay-plugin-vm (about a minute).
test-vm: build
	@mkdir -p build/vm
	CGO_ENABLED=0 $(GO) test -c -o build/vm/netlinkxfrm.test ./encryption/netlinkxfrm
	CGO_ENABLED=0 $(GO) test -c -o build/vm/encrypted.test ./test/encrypted
	scripts/vm/hang-test.sh
	OVERLAY_PLUGIN_BIN=$(CURDIR)/$(BIN) OVERLAY_TEST_REQUIRE="encrypted netlinkxfrm" OVERLAY_VM_PASSENV=OVERLAY_TEST_REQUIRE \
		scripts/vm/go-tests.sh \
		build/vm/netlinkxfrm.test build/vm/encrypted.test -- -test.v -test.count=1

# The Vagrantfile offline: a box built from Debian's packages, libvirtd in a
# netns, three VMs under qemu (TCG without KVM), node3 runs the e2e checks
# with ESP expected. Root; not part of `make test` (see scripts/vagrant/README.md
# for how long it takes).
test-vagrant:
	bash scripts/vagrant/run.sh

# Encrypted networks under a real Docker swarm on a kernel with ESP:
# scripts/e2e-docker.sh's checks inside the test VM (scripts/e2e-docker-vm.sh).
# Root; installs what the Docker layer and the VM need.
test-vm-docker:
	bash scripts/e2e-docker-vm.sh

vm-smoke:
	scripts/vm/run.sh scripts/vm/smoke.sh

# Scale, both benchmarks (see README, Scale); they assert nothing about
# speed. First the simulation in virtual time (test/scale), scenarios a b c
# e one at a time under the machine's timing lock, each into
# build/scale/<scenario>.{md,json} with build/scale/convergence.png; then
# the real-time benchmark against Docker's NetworkDB (bench-scale-realtime,
# at REALTIME_HOSTS, 25 by default here: about 3 minutes). Scenario d
# (1,000 hosts) is bench-scale-d.
SCALE_LOCK ?= /tmp/overlay-timing.lock
SCALE_TEST = flock $(SCALE_LOCK) $(GO) test ./test/scale -run '^TestScale$$' -count=1 -v -timeout 120m
bench-scale: REALTIME_HOSTS = 25
bench-scale:
	@st=0; for s in a b c e; do $(SCALE_TEST) -scale.scenario=$$s || st=1; done; \
		$(MAKE) bench-scale-realtime REALTIME_HOSTS=$(REALTIME_HOSTS) || st=1; exit $$st

# The collector trades CPU for memory before the RSS guard (20 GiB) trips.
bench-scale-d:
	GOMEMLIMIT=16GiB $(SCALE_TEST) -scale.scenario=d

# The real-time scale benchmark (bench/, a module of its own so that moby
# stays out of go.mod): this plugin's control plane and Docker's NetworkDB,
# the same rollout over real sockets on loopback (127.0.1.x, 127.0.2.x),
# interleaved REALTIME_REPS times, for each of REALTIME_HOSTS (comma list).
# Writes bench/results/scale-realtime/h<hosts>.{json,md,png}; about 9
# minutes and 7 GB per repetition at 100 hosts. It holds /tmp/overlay-timing.lock so
# that no other timing run shares the CPUs. See docs/benchmarks.md.
REALTIME_HOSTS ?= 100
REALTIME_REPS  ?= 1
REALTIME_SYSTEMS ?= plugin,plugin-secret,networkdb
bench-scale-realtime:
	@mkdir -p build
	cd bench && $(GO) build -o ../build/scale-realtime ./cmd/scale-realtime
	flock /tmp/overlay-timing.lock build/scale-realtime -hosts $(REALTIME_HOSTS) -reps $(REALTIME_REPS) -systems $(REALTIME_SYSTEMS) -out bench/results/scale-realtime

# make bench: every speed claim against its reference, in the same run,
# interleaved (docs/benchmarks.md). Four parts (BENCH_PARTS selects):
# kernel, the kernel path (bench/kernelpath): peers programmed per second,
# this driver against moby's overlay driver in-process, a raw netlink loop
# and ip/bridge -batch; Join latency, both drivers; each run a child
# process in namespaces of its own; bench/results/{peers,join}.*.
# vip (bench/vip): service VIPs at scale, the real servicelb in 100 client
# namespaces (prefixed vip) with 100 and 1,000 services of 3 tasks: Join
# to every VIP balanced, and one task change to every client, the
# increment against the full replace; bench/results/vip.*.
# swarm (scripts/bench-swarm.sh): the two-dockerd swarm of the e2e harness
# in namespaces prefixed obs<pid>; docker run -> reachable from the other
# node, cold and warm, and cross-host TCP throughput, the plugin against
# Docker's overlay (and the underlay); bench/results/{reach,throughput}.*.
# vm (bench/espvm): the encrypted network against the plain one in the test
# VM (scripts/vm: this machine's kernel may lack ESP) with the `build`
# plugin on two hosts, ratios only (the VM is emulated);
# bench/results/encrypted.*. The binary is static: the VM runs it too.
# Root; the whole run holds the timing lock. Every part runs even if one
# before it failed; the target fails if any does. bench-vm: the vm part.
BENCH_REPS  ?= 3
BENCH_PARTS ?= kernel vip swarm vm
bench: build
	@mkdir -p build
	cd bench && CGO_ENABLED=0 $(GO) build -o ../build/bench ./cmd/bench
	flock $(SCALE_LOCK) bash -c 'st=0; \
		if [[ " $(BENCH_PARTS) " == *" kernel "* ]]; then build/bench -figures peers,join -reps $(BENCH_REPS) -out bench/results || st=1; fi; \
		if [[ " $(BENCH_PARTS) " == *" vip "* ]]; then build/bench -figures vip -reps $(BENCH_REPS) -out bench/results || st=1; fi; \
		if [[ " $(BENCH_PARTS) " == *" swarm "* ]]; then BENCH_REPS=$(BENCH_REPS) bash scripts/bench-swarm.sh || st=1; fi; \
		if [[ " $(BENCH_PARTS) " == *" vm "* ]]; then build/bench -figures encrypted -reps $(BENCH_REPS) -plugin $(BIN) -out bench/results || st=1; fi; \
		exit $$st'

bench-vm:
	$(MAKE) bench BENCH_PARTS=vm

# The Docker managed plugin: build/plugin (config.json + rootfs).
# plugin-push publishes it as REGISTRY/overlay-plugin:VERSION (what an
# operator installs with `docker plugin install`, README); DOCKER selects
# the engine that creates and pushes it (default: docker).
# plugin-install, for development, creates and enables it in the local
# engine without a registry (PLUGIN_NAME, and PLUGIN_SETTINGS="K=V ..." for
# docker plugin set). The name has its tag: Docker registers the network
# driver under the plugin's full name, so it is what `docker network create
# -d` takes.
PLUGIN_NAME ?= overlay-plugin:latest
plugin: build
	bash plugin/build.sh build/plugin

plugin-install: plugin
	bash plugin/install.sh $(PLUGIN_NAME)

plugin-push: plugin
	@[ -n "$(REGISTRY)" ] || { echo "usage: make plugin-push REGISTRY=host[:port][/path]" >&2; exit 2; }
	bash plugin/push.sh $(REGISTRY)/overlay-plugin:$(VERSION)

# A real Docker engine and a two-node swarm, each dockerd in its own
# network namespace (root; installs docker.io from Debian if missing).
e2e-docker:
	bash scripts/e2e-docker.sh

# Every shell script of the tree through shellcheck (Debian's package;
# .ci/run installs it): missing, vet fails and says so.
SHELL_SCRIPTS = $(shell git ls-files '*.sh') .ci/run
vet:
	@command -v shellcheck >/dev/null || { echo "make vet: shellcheck is missing: apt-get install shellcheck" >&2; exit 1; }
	shellcheck -x -P SCRIPTDIR $(SHELL_SCRIPTS)
	$(GO) vet ./...
	$(GO) vet -tags lockrank ./...
	cd bench && $(GO) vet ./...

# Functions nothing calls, tests counted as callers (golang.org/x/tools'
# deadcode, from Go's module proxy), in both builds and the bench module:
# any is an error.
DEADCODE := $(GO) run golang.org/x/tools/cmd/deadcode@v0.52.0 -test
deadcode:
	@out=$$($(DEADCODE) ./... && $(DEADCODE) -tags lockrank ./... && cd bench && $(DEADCODE) ./...) || exit 1; \
	if [ -n "$$out" ]; then printf '%s\n' "$$out" "dead code: call it or remove it"; exit 1; fi; \
	echo "deadcode: none"

clean:
	rm -rf bin build
