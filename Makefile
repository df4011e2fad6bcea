# Front door: `make run` builds and runs the tiled matrix multiplication demo
# (tasks over the host and every device); `make test` builds and runs every
# test. Both check for (and, as root on Debian, install) what they need first.

BUILD       ?= build
BUILD_TYPE  ?= RelWithDebInfo
JOBS        ?= $(shell nproc 2>/dev/null || echo 2)
CMAKE_FLAGS ?=
PREFIX      ?= /usr/local

.PHONY: all deps build run test asan tsan sanitize debug-check fuzz analyze ci-extra install clean

all: build

deps:
	@sh scripts/deps.sh

$(BUILD)/CMakeCache.txt: | deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DCMAKE_INSTALL_PREFIX=$(PREFIX) $(CMAKE_FLAGS)

build: deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

run: build
	$(BUILD)/unimem demo gemm

test: build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

# The whole suite under AddressSanitizer + UndefinedBehaviorSanitizer, and
# under ThreadSanitizer.
asan: deps
	cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DUM_SANITIZE=address
	cmake --build build-asan -j $(JOBS)
	cd build-asan && ASAN_OPTIONS=detect_leaks=1 ctest --output-on-failure -j $(JOBS)

tsan: deps
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DUM_SANITIZE=thread
	cmake --build build-tsan -j $(JOBS)
	cd build-tsan && TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -j $(JOBS)

sanitize: asan tsan

# The debug allocator (-DUNIMEM_DEBUG=ON) under ASan: its own test and the
# suites whose figures do not depend on exact block sizes (its guard bytes
# make every block 16 bytes larger).
debug-check: deps
	cmake -S . -B build-debug-asan -DCMAKE_BUILD_TYPE=Debug -DUM_SANITIZE=address -DUNIMEM_DEBUG=ON
	cmake --build build-debug-asan -j $(JOBS) --target test_debug test_pool test_buffer test_fuzz_findings
	cd build-debug-asan && ctest --output-on-failure -j $(JOBS) -R '^(test_debug|test_pool|test_buffer|test_fuzz_findings)$$'

# 30 seconds of each libFuzzer harness from its committed seeds (clang);
# a machine without clang's fuzzer runtime skips, saying so.
fuzz:
	sh scripts/fuzz.sh 30; rc=$$?; [ $$rc -eq 77 ] && echo "fuzz: skipped" && exit 0; exit $$rc

# Clang's static analyzer over every target (scan-build, Debian's
# clang-tools package); fails on any report, which it keeps in
# build-analyze/report.
analyze: deps
	@command -v scan-build >/dev/null || { echo "analyze: scan-build not found (Debian: apt-get install clang-tools)"; exit 1; }
	scan-build -o build-analyze/report cmake -S . -B build-analyze/tree -DCMAKE_BUILD_TYPE=Debug -DCMAKE_C_COMPILER=clang
	scan-build -o build-analyze/report --status-bugs cmake --build build-analyze/tree -j $(JOBS)

# What .ci/run adds to `make test`: the suite under ASan+UBSan and under
# TSan (but test_sim_link, whose bounds are wall-clock times that TSan's
# slowdown breaks), the debug allocator's checks, and the fuzzers.
ci-extra: asan debug-check fuzz
	cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DUM_SANITIZE=thread
	cmake --build build-tsan -j $(JOBS)
	cd build-tsan && TSAN_OPTIONS=halt_on_error=1 ctest --output-on-failure -j $(JOBS) -E '^test_sim_link$$'

install: build
	cmake --install $(BUILD)

clean:
	rm -rf $(BUILD) build-asan build-tsan build-debug-asan build-fuzz build-analyze
