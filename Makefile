# Makefile for the course. `make` builds every chapter that exists; `make test`
# installs what is missing and runs the test suite; `make demo` runs the
# programs and draws plots. `make help` lists the targets.
#
# The CUDA backend is built when nvcc is found (CUDA=0 forces CPU-only, CUDA=1
# insists on it). Nothing here needs a GPU to compile. SANITIZE=1 builds with
# AddressSanitizer and UBSan, CPU only.

SHELL := /bin/bash
comma := ,
BUILD := build
CC ?= gcc
OPT ?= -O3 -march=x86-64-v2
# -fno-trapping-math lets gcc vectorise float->int conversions (the GELU's exp), -fno-math-errno
# loops that call sqrtf (AdamW); neither changes a result.
# common/ is layered (common/README.md): core < device < kernels < model < comm < run. The
# repository root is the one include path: a file names a header by its path from the root
# ("common/run/harness.h", "03_model_parallel/tensor_parallel.h"), so every include says where
# it comes from; tests/library/layers.bats keeps each include pointing down the layers.
COMMON_LAYERS := core device kernels model comm run
COMMON_INCLUDES := -I.
CFLAGS := $(OPT) -g -std=gnu11 -fopenmp -fno-trapping-math -fno-math-errno -Wall -Wextra -Werror $(COMMON_INCLUDES) -MMD -MP
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
# SANITIZE=1: ASan + UBSan in every C program and test program. CPU only: the
# CUDA driver maps memory where ASan keeps its shadow gap, and nvcc's host code
# would go unsanitized anyway.
SANITIZE_FLAGS := $(if $(filter 1,$(SANITIZE)),-fsanitize=address$(comma)undefined -fno-omit-frame-pointer \
                  -fno-sanitize-recover=undefined)
ifneq ($(SANITIZE_FLAGS),)
  USE_CUDA :=
endif

ifeq ($(MAKELEVEL),0)
ifeq ($(filter help clean deps,$(MAKECMDGOALS)),)
  $(info deps: openblas $(if $(OPENBLAS),found ($(if $(OPENBLAS_OMP_DIR),OpenMP build $(OPENBLAS_OMP_DIR),$(OPENBLAS))),MISSING (make deps installs libopenblas-openmp-dev)))
  $(info deps: cblas.h  $(if $(CBLAS_H),found ($(CBLAS_H)),MISSING))
  $(info deps: nvcc     $(if $(NVCC),found ($(NVCC)),missing: CPU backend only))
  $(info deps: cuBLAS   $(if $(HAVE_CUBLAS),found ($(CUDA_LIBDIR)),missing))
  $(info deps: NCCL     $(if $(NCCL_H),found ($(NCCL_H)),missing))
  $(info deps: MPI      $(if $(MPICC),found ($(MPICC)),missing: chapters 02-06 are not built (make deps installs openmpi)))
  $(info deps: backend  $(if $(USE_CUDA),CPU + CUDA,CPU only)$(if $(filter 0,$(CUDA)), (CUDA=0))$(if $(SANITIZE_FLAGS), (SANITIZE=1)))
endif
endif

NVCC_ARCHS ?= 80 90
NVCCFLAGS := -O3 -std=c++17 $(COMMON_INCLUDES) -DUSE_CUDA --compiler-options -Wall,-Wextra,-Werror -Werror all-warnings \
             $(foreach a,$(NVCC_ARCHS),-gencode arch=compute_$(a),code=sm_$(a)) \
             -gencode arch=compute_$(lastword $(NVCC_ARCHS)),code=compute_$(lastword $(NVCC_ARCHS))

# Communication (common/comm/, and the run layer's *_ranks.c and checkpoint_sharded.c) needs MPI; without it chapters 02-06 are not built.
MPI_SOURCES := $(wildcard common/comm/*.c common/run/*_ranks.c) common/run/checkpoint_sharded.c
MPI_CFLAGS := $(if $(MPICC),$(shell $(MPICC) --showme:compile 2>/dev/null))
MPI_LIBS := $(if $(MPICC),$(shell $(MPICC) --showme:link 2>/dev/null))
LAYER_C := $(foreach l,$(COMMON_LAYERS),$(wildcard common/$(l)/*.c))
COMMON_C := $(if $(MPICC),$(LAYER_C),$(filter-out $(MPI_SOURCES),$(LAYER_C)))
COMMON_CU := $(if $(USE_CUDA),$(foreach l,$(COMMON_LAYERS),$(wildcard common/$(l)/*.cu)))
# A student copy (make exercises) has stubs that leave parameters unused
# (nvcc: in host code through gcc, and 177/550, a kernel not launched yet).
ifneq ($(wildcard .student),)
  CFLAGS += -Wno-unused-parameter -Wno-unused-variable -Wno-unused-but-set-variable -Wno-unused-function
  NVCCFLAGS += --compiler-options -Wno-unused-parameter,-Wno-unused-variable,-Wno-unused-but-set-variable \
               --compiler-options -Wno-unused-function -diag-suppress 177,550
endif
CFLAGS += $(SANITIZE_FLAGS)
LDLIBS += $(SANITIZE_FLAGS)
ifdef USE_CUDA
  CFLAGS += -DUSE_CUDA
  LDLIBS += -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR) -lcublas -lcudart -lstdc++
  ifneq ($(NCCL_H),)
    MPI_CFLAGS += -DUSE_NCCL -I$(CUDA_HOME)/include -I$(dir $(NCCL_H))
    NCCL_LIBDIR := $(firstword $(wildcard $(CUDA_HOME)/lib/libnccl.so $(CUDA_LIBDIR)/libnccl.so /usr/lib/*/libnccl.so))
    MPI_LIBS += $(if $(NCCL_LIBDIR),-L$(dir $(NCCL_LIBDIR)) -Wl$(comma)-rpath$(comma)$(dir $(NCCL_LIBDIR))) -lnccl
  endif
endif
$(MPI_SOURCES:%.c=$(BUILD)/%.o): CFLAGS += $(MPI_CFLAGS)
COMMON_OBJ := $(COMMON_C:%.c=$(BUILD)/%.o) $(COMMON_CU:%.cu=$(BUILD)/%.cu.o)
LIBCOMMON := $(BUILD)/libcommon.a

# Chapters: NN_name/train from NN_name/*.c, except NN_name/*bench.c, each of
# which is a program of its own. Chapter 01 runs without MPI; 02 on need it.
CHAPTER_DIRS := $(sort $(dir $(wildcard 0[1-6]_*/train.c)))
ifeq ($(MPICC),)
  CHAPTER_DIRS := $(filter 01_%,$(CHAPTER_DIRS))
endif
BENCH_SOURCES := $(filter $(CHAPTER_DIRS:%=%%bench.c),$(wildcard 0[1-6]_*/*bench.c))
# Chapter 06's CPU AdamW benchmark needs neither MPI nor the chapter's trainer.
BENCH_SOURCES := $(sort $(BENCH_SOURCES) $(wildcard 06_offload/adambench.c))
# Tools: common/NAME from common/tools/NAME.c (no MPI): common/ckpt inspects and exports checkpoints,
# common/plan predicts a run's memory, common/tokenize is GPT-2's tokenizer; common/tools/NAME_*.c are the modules of tool NAME.
TOOL_MODULES := $(wildcard common/tools/plan_*.c common/tools/ckpt_*.c)
TOOLS := $(patsubst common/tools/%.c,common/%,$(filter-out $(TOOL_MODULES),$(wildcard common/tools/*.c)))
PROGRAMS := $(CHAPTER_DIRS:%/=%/train) $(BENCH_SOURCES:%.c=%) $(TOOLS)
# Test programs that need MPI: the collectives, and chapter 03's parallel layers.
MPI_TESTS := tests/test_comm% tests/test_tensor_parallel% tests/test_grid%
TEST_SOURCES := $(if $(MPICC),$(wildcard tests/*.c),$(filter-out $(MPI_TESTS),$(wildcard tests/*.c)))
TEST_PROGRAMS := $(patsubst tests/%.c,$(BUILD)/tests/%,$(TEST_SOURCES))

# The build flavour (CUDA or not, sanitized or not) is part of the objects: rebuild when it changes.
FLAVOUR := $(BUILD)/.flavour-$(if $(USE_CUDA),cuda,cpu)$(if $(SANITIZE_FLAGS),-san)

.PHONY: all help deps test test-gpu gpu-check tokenizer-check interop demo bench grade exercises clean
all: $(PROGRAMS) $(TEST_PROGRAMS)

help:
	@echo "make            build every chapter program and the test programs"
	@echo "make test       install missing packages, build, run the whole test suite (Bats)"
	@echo "make test-gpu   only the CPU/CUDA parity tests; fails when no GPU is visible"
	@echo "make gpu-check  every check only a GPU can do, with a dated report in common/bench_results"
	@echo "                (GPU_CHECK_ONLY=part1 or part2 for one half; common/scripts/gpu_check.sh --list shows them)"
	@echo "make demo       install missing packages, build, run the chapters, draw plots in runs/plots"
	@echo "make tokenizer-check   common/tokenize against tiktoken's gpt2 on 1.2 MB of varied text (fetches"
	@echo "                GPT-2's vocabulary, verified, and tiktoken into build/venv-tiktoken)"
	@echo "make interop    common/ckpt's Hugging Face export and import against transformers' GPT2LMHeadModel"
	@echo "                (installs torch and transformers from PyPI into build/venv-interop)"
	@echo "make bench      benchmarks (and PyTorch comparison when importable) into runs/bench"
	@echo "make grade [ONLY=01.2]   grade the exercises (tests/grade), or only those named, and print a score table"
	@echo "make exercises DEST=dir [ONLY=01.2]   write a student copy with exercises stubbed out"
	@echo "make deps       install missing packages only"
	@echo "make clean      remove build outputs"
	@echo "options: CUDA=0 (CPU only), CUDA=1 (require CUDA), NVCC_ARCHS='80 90'"
	@echo "         SANITIZE=1 (AddressSanitizer + UBSan, CPU only: ASan and the CUDA runtime do not mix),"
	@echo "         e.g. make SANITIZE=1 test before a release"

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

program_libs = $(if $(filter 01_%,$(1)),$(LDLIBS),$(MPI_LIBS) $(LDLIBS))
# A chapter links its own .c files and the earlier chapters' files named in
# NN_name_USES, e.g. 05_zero_USES := ... 04_pipeline/pipeline.c 04_pipeline/schedule.c
# (the pipeline interpreter), so a module is written once.
03_model_parallel_USES := 02_data_parallel/data_parallel.c 02_data_parallel/buckets.c 02_data_parallel/bucketed.c \
                          02_data_parallel/ring.c
04_pipeline_USES := $(03_model_parallel_USES) 03_model_parallel/model_parallel.c 03_model_parallel/tensor_parallel.c \
                    03_model_parallel/sequence_parallel.c \
                    03_model_parallel/context_parallel.c 03_model_parallel/ulysses.c 03_model_parallel/alltoall.c \
                    03_model_parallel/expert_parallel.c
05_zero_USES := $(04_pipeline_USES) 04_pipeline/pipeline.c 04_pipeline/pipeline_flags.c 04_pipeline/schedule.c
06_offload_USES := $(05_zero_USES) 05_zero/zero.c 05_zero/zero_stage.c 05_zero/tied_ends.c
define PROGRAM_RULE
$(1)/train: $(patsubst %.c,$(BUILD)/%.o,$(filter-out %bench.c,$(wildcard $(1)/*.c)) $($(1)_USES)) $(LIBCOMMON)
	$$(CC) -o $$@ $$^ $$(call program_libs,$(1))
endef
$(foreach d,$(CHAPTER_DIRS:%/=%),$(eval $(call PROGRAM_RULE,$(d))))
$(BENCH_SOURCES:%.c=%): %: $(BUILD)/%.o $(LIBCOMMON)
	$(CC) -o $@ $(filter %.o,$^) $(LIBCOMMON) $(call program_libs,$@)
$(TOOLS): common/%: $(BUILD)/common/tools/%.o $(LIBCOMMON)
	$(CC) -o $@ $(filter %.o,$^) $(LIBCOMMON) $(LDLIBS)
common/plan: $(patsubst %.c,$(BUILD)/%.o,$(wildcard common/tools/plan_*.c))
common/ckpt: $(patsubst %.c,$(BUILD)/%.o,$(wildcard common/tools/ckpt_*.c))
$(patsubst %.c,$(BUILD)/%.o,$(wildcard 0[2-6]_*/*.c)): CFLAGS += $(MPI_CFLAGS)
$(BUILD)/tests/test_comm.o $(BUILD)/tests/test_tensor_parallel.o $(BUILD)/tests/test_grid.o: CFLAGS += $(MPI_CFLAGS)
$(BUILD)/tests/test_tensor_parallel: $(BUILD)/03_model_parallel/tensor_parallel.o $(BUILD)/03_model_parallel/sequence_parallel.o
# Chapter 02's own collectives (the ring all-reduce, the bucketed worker) serve its benchmark and test_comm.
02_data_parallel/commbench $(BUILD)/tests/test_comm: $(BUILD)/02_data_parallel/ring.o $(BUILD)/02_data_parallel/bucketed.o
# and chapter 03's pairwise all-to-all (alltoall.h)
$(BUILD)/tests/test_comm: $(BUILD)/03_model_parallel/alltoall.o
$(BUILD)/tests/test_schedule: $(BUILD)/04_pipeline/schedule.o
# common/plan's time from dry runs' dry-work.csv, on files (tests/tools/plan_work.bats)
$(BUILD)/tests/test_plan_work: $(BUILD)/common/tools/plan_work.o $(BUILD)/common/tools/plan_machine.o
# Chapter 06's CPU AdamW: its vector paths equal the kernel table's AdamW bit for bit only
# if no multiply and add are fused into an FMA (cpu_adam.c says why).
$(BUILD)/06_offload/cpu_adam.o: CFLAGS += -ffp-contract=off
06_offload/adambench $(BUILD)/tests/test_cpu_adam: $(BUILD)/06_offload/cpu_adam.o

# A static pattern rule, so that the test objects are named targets: as an implicit
# rule's intermediates, make deleted them after the first build, and the next make (the
# first `make grade` or `make test`) compiled them again.
$(TEST_PROGRAMS): $(BUILD)/tests/%: $(BUILD)/tests/%.o $(LIBCOMMON)
	$(CC) -o $@ $(filter %.o,$^) $(LIBCOMMON) $(if $(filter test_comm% test_tensor_parallel test_grid,$*),$(MPI_LIBS)) $(LDLIBS)

deps:
	@common/scripts/install-deps.sh

# The suite, by what each folder holds up (README.md, "Tests and benchmarks"); tests/grade
# holds the exercises' graders, which `make grade` runs.
TEST_GROUPS := tests/library tests/chapters tests/robustness tests/tools
test: deps
	@$(MAKE) --no-print-directory all
	@bats $(TEST_GROUPS)

test-gpu: deps
	@$(MAKE) --no-print-directory all
	@REQUIRE_GPU=1 bats tests/library/parity.bats

# Everything only a GPU can check (common/scripts/gpu_check.sh says what and why), without
# install-deps.sh: it runs offline on a lent GPU machine. Refuses at once, before
# building, when no GPU is visible.
gpu-check:
	@common/scripts/gpu_check.sh --probe
	@$(MAKE) --no-print-directory all
	@common/scripts/gpu_check.sh

# common/tokenize token for token against tiktoken: GPT-2's vocabulary fetched and verified
# (get-gpt2-vocab.sh), tiktoken installed into a virtual environment that tests/tools/tokenizer.bats
# uses too when it is there.
TIKTOKEN_VENV := $(BUILD)/venv-tiktoken
tokenizer-check:
	@$(MAKE) --no-print-directory common/tokenize
	@common/scripts/get-gpt2-vocab.sh
	@test -x $(TIKTOKEN_VENV)/bin/python || python3 -m venv $(TIKTOKEN_VENV)
	@$(TIKTOKEN_VENV)/bin/python -c 'import tiktoken' 2>/dev/null || $(TIKTOKEN_VENV)/bin/pip install --quiet tiktoken
	@$(TIKTOKEN_VENV)/bin/python tests/tiktoken_check.py vocab/gpt2

# common/ckpt export --format hf and import-hf against transformers itself (tests/tools/interop.bats:
# the same logits both ways, an imported save_pretrained model trains in 01 and 04): torch and
# transformers installed into a virtual environment, which tests/tools/interop.bats uses too when it is there.
INTEROP_VENV := $(BUILD)/venv-interop
interop:
	@$(MAKE) --no-print-directory all
	@test -x $(INTEROP_VENV)/bin/python || python3 -m venv $(INTEROP_VENV)
	@$(INTEROP_VENV)/bin/python -c 'import torch, transformers' 2>/dev/null || \
		$(INTEROP_VENV)/bin/pip install --quiet torch transformers
	@bats tests/tools/interop.bats

demo: deps
	@$(MAKE) --no-print-directory all
	@common/scripts/demo.sh

bench: deps
	@$(MAKE) --no-print-directory all
	@common/scripts/bench.sh

grade: deps
	@$(MAKE) --no-print-directory all
	@common/scripts/grade.sh $(if $(filter undefined,$(origin ONLY)),,--only '$(ONLY)')

exercises:
	@test -n "$(DEST)" || { echo "usage: make exercises DEST=dir [ONLY=01.1,01.2]" >&2; exit 2; }
	@python3 common/python/exercises.py "$(DEST)" $(if $(ONLY),--only "$(ONLY)")

clean:
	rm -rf $(BUILD) $(PROGRAMS)

-include $(shell find $(BUILD) -name '*.d' 2>/dev/null)
