# Makefile for the course. `make` builds every chapter that exists; `make test`
# installs what is missing and runs the test suite; `make demo` runs the
# programs and draws plots. `make help` lists the targets.
#
# The CUDA backend is built when nvcc is found (CUDA=0 forces CPU-only, CUDA=1
# insists on it). Nothing here needs a GPU to compile.

SHELL := /bin/bash
comma := ,
BUILD := build
CC ?= gcc
OPT ?= -O3 -march=x86-64-v2
CFLAGS := $(OPT) -g -std=gnu11 -fopenmp -Wall -Wextra -Werror -Icommon -MMD -MP
# Prefer Debian's OpenMP build of OpenBLAS: it shares our OpenMP thread pool,
# where the default pthread build fights it for the cores.
OPENBLAS_OMP_DIR := $(wildcard /usr/lib/$(shell gcc -print-multiarch 2>/dev/null)/openblas-openmp)
LDLIBS := $(if $(OPENBLAS_OMP_DIR),-L$(OPENBLAS_OMP_DIR) -Wl$(comma)-rpath$(comma)$(OPENBLAS_OMP_DIR)) -lopenblas -lm -fopenmp

# ---- dependency discovery: one line per dependency, found or missing ----
NVCC := $(shell command -v nvcc 2>/dev/null || ls /usr/local/cuda/bin/nvcc 2>/dev/null)
CUDA_HOME := $(if $(NVCC),$(patsubst %/bin/nvcc,%,$(NVCC)))
CUDA_LIBDIR := $(firstword $(wildcard $(CUDA_HOME)/lib64 $(CUDA_HOME)/targets/x86_64-linux/lib))
HAVE_CUBLAS := $(if $(wildcard $(CUDA_LIBDIR)/libcublas.so),1)
NCCL_H := $(firstword $(wildcard $(CUDA_HOME)/include/nccl.h /usr/include/nccl.h /usr/local/include/nccl.h))
MPICC := $(shell command -v mpicc 2>/dev/null)
OPENBLAS := $(shell ldconfig -p 2>/dev/null | grep -m1 -o 'libopenblas.so[^ ]*')
CBLAS_H := $(firstword $(wildcard /usr/include/cblas.h /usr/include/*/cblas.h /usr/include/openblas/cblas.h))

ifeq ($(CUDA),0)
  USE_CUDA :=
else ifeq ($(CUDA),1)
  USE_CUDA := 1
  ifeq ($(NVCC),)
    $(error CUDA=1 but nvcc was not found; install the CUDA toolkit or build with CUDA=0)
  endif
else
  USE_CUDA := $(if $(and $(NVCC),$(HAVE_CUBLAS)),1)
endif

ifeq ($(MAKELEVEL),0)
ifeq ($(filter help clean deps,$(MAKECMDGOALS)),)
  $(info deps: openblas $(if $(OPENBLAS),found ($(if $(OPENBLAS_OMP_DIR),OpenMP build $(OPENBLAS_OMP_DIR),$(OPENBLAS))),MISSING (make deps installs libopenblas-openmp-dev)))
  $(info deps: cblas.h  $(if $(CBLAS_H),found ($(CBLAS_H)),MISSING))
  $(info deps: nvcc     $(if $(NVCC),found ($(NVCC)),missing: CPU backend only))
  $(info deps: cuBLAS   $(if $(HAVE_CUBLAS),found ($(CUDA_LIBDIR)),missing))
  $(info deps: NCCL     $(if $(NCCL_H),found ($(NCCL_H)),missing))
  $(info deps: MPI      $(if $(MPICC),found ($(MPICC)),missing (make deps installs openmpi)))
  $(info deps: backend  $(if $(USE_CUDA),CPU + CUDA,CPU only)$(if $(filter 0,$(CUDA)), (CUDA=0)))
endif
endif

NVCC_ARCHS ?= 80 90
NVCCFLAGS := -O3 -std=c++17 -Icommon -DUSE_CUDA --compiler-options -Wall,-Wextra,-Werror -Werror all-warnings \
             $(foreach a,$(NVCC_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
             -gencode arch=compute_$(lastword $(NVCC_ARCHS)),code=compute_$(lastword $(NVCC_ARCHS))

COMMON_C := $(wildcard common/*.c)
COMMON_CU := $(if $(USE_CUDA),$(wildcard common/*.cu))
# A student copy (make exercises) has stubs that leave parameters unused.
ifneq ($(wildcard .student),)
  CFLAGS += -Wno-unused-parameter -Wno-unused-variable -Wno-unused-but-set-variable -Wno-unused-function
endif
ifdef USE_CUDA
  CFLAGS += -DUSE_CUDA
  LDLIBS += -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR) -lcublas -lcudart -lstdc++
endif
COMMON_OBJ := $(COMMON_C:%.c=$(BUILD)/%.o) $(COMMON_CU:%.cu=$(BUILD)/%.cu.o)
LIBCOMMON := $(BUILD)/libcommon.a

# Chapters: NN_name/train from NN_name/*.c, for each chapter that has sources.
CHAPTER_DIRS := $(sort $(dir $(wildcard 0[1-6]_*/*.c)))
PROGRAMS := $(CHAPTER_DIRS:%/=%/train)
TEST_PROGRAMS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(wildcard tests/*.c))

# The build flavour (CUDA or not) is part of the objects: rebuild when it changes.
FLAVOUR := $(BUILD)/.flavour-$(if $(USE_CUDA),cuda,cpu)

.PHONY: all help deps test test-gpu demo bench grade exercises clean
all: $(PROGRAMS) $(TEST_PROGRAMS)

help:
	@echo "make            build every chapter program and the test programs"
	@echo "make test       install missing packages, build, run the whole test suite (Bats)"
	@echo "make test-gpu   only the CPU/CUDA parity tests; fails when no GPU is visible"
	@echo "make demo       install missing packages, build, run the chapters, draw plots in runs/plots"
	@echo "make bench      benchmarks (and PyTorch comparison when importable) into runs/bench"
	@echo "make grade      grade the exercises (tests/grade) and print a score table"
	@echo "make exercises DEST=dir [ONLY=01.2]   write a student copy with exercises stubbed out"
	@echo "make deps       install missing packages only"
	@echo "make clean      remove build outputs"
	@echo "options: CUDA=0 (CPU only), CUDA=1 (require CUDA), NVCC_ARCHS='80 90'"

$(FLAVOUR):
	@mkdir -p $(BUILD) && rm -f $(BUILD)/.flavour-* && touch $@

$(BUILD)/%.o: %.c $(FLAVOUR)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/%.cu.o: %.cu $(FLAVOUR)
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

$(LIBCOMMON): $(COMMON_OBJ)
	@rm -f $@
	ar rcs $@ $^

define PROGRAM_RULE
$(1)/train: $(patsubst %.c,$(BUILD)/%.o,$(wildcard $(1)/*.c)) $(LIBCOMMON)
	$$(CC) -o $$@ $$^ $$(LDLIBS)
endef
$(foreach d,$(CHAPTER_DIRS:%/=%),$(eval $(call PROGRAM_RULE,$(d))))

$(BUILD)/tests/%: $(BUILD)/tests/%.o $(LIBCOMMON)
	$(CC) -o $@ $^ $(LDLIBS)

deps:
	@common/install-deps.sh

test: deps
	@$(MAKE) --no-print-directory all
	@bats tests

test-gpu: deps
	@$(MAKE) --no-print-directory all
	@REQUIRE_GPU=1 bats tests/parity.bats

demo: deps
	@$(MAKE) --no-print-directory all
	@common/demo.sh

bench: deps
	@$(MAKE) --no-print-directory all
	@common/bench.sh

grade: deps
	@$(MAKE) --no-print-directory all
	@common/grade.sh

exercises:
	@test -n "$(DEST)" || { echo "usage: make exercises DEST=dir [ONLY=01.1,01.2]" >&2; exit 2; }
	@python3 common/exercises.py "$(DEST)" $(if $(ONLY),--only "$(ONLY)")

clean:
	rm -rf $(BUILD) $(PROGRAMS)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
