# tensorport: the front door.  `make` builds, `make test` builds and runs every
# test, `make run` starts the server.  Everything lands in build/.
BUILD      ?= build
SAN_BUILD  ?= build-san
JOBS       ?= $(shell nproc)
CMAKE_ARGS ?=

.PHONY: all build test test-sanitize test-tsan run install deps bench clean fuzz test-container image

all: build

# Installs missing Debian packages (idempotent; a quick dpkg query when all
# are present).
deps:
	@./deploy/install-deps.sh

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) $(CMAKE_ARGS)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The suites again under AddressSanitizer + UndefinedBehaviorSanitizer (the
# PyTorch differential test runs in the plain build only: it loads torch).
test-sanitize: deps
	cmake -S . -B $(SAN_BUILD) -DTPORT_SANITIZE=address,undefined -DCMAKE_BUILD_TYPE=Debug $(CMAKE_ARGS)
	cmake --build $(SAN_BUILD) -j $(JOBS)
	cd $(SAN_BUILD) && ctest --output-on-failure -j $(JOBS) -LE diff

# Criterion cannot run under ThreadSanitizer (Snaipe/Criterion#274): the
# threaded parts are checked through the plain stress program instead.
# nng too is built instrumented (deploy/nng/build-nng.sh --sanitize thread,
# once): TSan cannot see the atomics nng hands messages between threads with.
test-tsan: deps
	./deploy/nng/build-nng.sh --sanitize thread
	cmake -S . -B build-tsan -DTPORT_SANITIZE=thread -DCMAKE_BUILD_TYPE=Debug $(CMAKE_ARGS)
	cmake --build build-tsan -j $(JOBS)
	cd build-tsan && TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -j $(JOBS) -L stress

# libFuzzer (clang, ASan + UBSan) on the three harnesses of tests/fuzz, each
# for FUZZ_SECONDS on a scratch copy of its seed corpus; fails on any
# finding and prints the path of its input (under build-fuzz/fuzz/).
FUZZ_SECONDS ?= 60
fuzz: deps
	CC=clang cmake -S . -B build-fuzz -DTPORT_FUZZ=ON -DTPORT_CUDA=OFF -DTPORT_TESTS=OFF \
	  -DTPORT_WERROR=OFF $(CMAKE_ARGS)
	cmake --build build-fuzz -j $(JOBS) --target fuzz_frame fuzz_npy fuzz_server
	./tests/fuzz/run_fuzzers.sh build-fuzz $(FUZZ_SECONDS)

# Builds deploy/Containerfile with Podman and runs the image: health check,
# put/get with the host's tport, /metrics, SIGTERM, kube play of the
# DaemonSet's pod spec, yamllint, systemd-analyze (deploy/test-container.sh;
# root; installs podman and what else it needs).
test-container:
	BUILD=$(BUILD) ./deploy/test-container.sh

# tportd's container image, from nothing (deploy/build-image.sh: Podman and
# mmdebstrap installed where missing, the Debian 12 base image made without a
# registry, then deploy/Containerfile).  make image IMAGE=... CUDA=13-0
IMAGE ?= localhost/tensorport/tportd:latest
image:
	CUDA=$(CUDA) ./deploy/build-image.sh $(IMAGE)

bench: build
	./bench/run kernels

# Starts the server on its defaults: tcp://127.0.0.1:7450, the cpu device
# plus every CUDA GPU present.  Flags: make run ARGS="--devices cpu,sim:2".
run: build
	exec $(BUILD)/bin/tportd $(ARGS)

install: build
	cmake --install $(BUILD) $(if $(PREFIX),--prefix $(PREFIX),)

clean:
	rm -rf $(BUILD) $(SAN_BUILD) build-tsan
