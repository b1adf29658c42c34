#!/usr/bin/env bats
# layers.bats: common/ is layered (core < device < kernels < model < comm < run),
# chapters use common/ and earlier chapters only, no include goes round in a
# cycle, and every include names its header from the repository root with a
# comment saying what it brings (common/python/include_graph.py). The planted faults run on a scratch
# copy of the sources, so the check is shown to fail where it should.

load ../helpers

setup() {
    COPY="$BATS_TEST_TMPDIR/copy"
    mkdir -p "$COPY"
    (cd "$REPO" && cp -r common tests 0[1-6]_* "$COPY"/ 2>/dev/null) || true
    rm -rf "$COPY/common/bench_results"
}

graph() {
    python3 "$REPO/common/python/include_graph.py" "$@"
}

@test "every include of the course points down the layers and none goes round in a cycle" {
    run graph
    assert_success
    assert_output --partial "every one down the layers, no cycle"
}

@test "a header of a later layer included by an earlier one is refused, naming both" {
    sed -i 's|^#include "common/core/half.h".*|&\n#include "common/comm/comm.h" /* collectives */|' "$COPY/common/model/model.h"
    run graph --repo "$COPY"
    assert_failure
    assert_output --partial "common/model/model.h includes comm.h of common/comm: common/model may use only earlier layers"
}

@test "a chapter including a later chapter's header is refused" {
    sed -i 's|^#include "02_data_parallel/data_parallel.h".*|&\n#include "04_pipeline/schedule.h" /* schedules */|' \
        "$COPY/02_data_parallel/train.c"
    run graph --repo "$COPY"
    assert_failure
    assert_output --partial "02_data_parallel/train.c includes schedule.h of 04_pipeline"
}

@test "a cycle within one folder is found and printed module by module" {
    # optim.h below mixed.h: mixed.h includes optim.h, so optim including mixed closes a loop
    sed -i '0,/^#include "common\/core\/util.h"/s//#include "common\/model\/mixed.h" \/* mixed precision *\/\n&/' \
        "$COPY/common/model/optim.c"
    run graph --repo "$COPY"
    assert_failure
    assert_output --partial "include cycle: common/model/mixed -> common/model/optim -> common/model/mixed"
}

@test "an include by a bare name, or without its comment, is refused, naming the path to use" {
    sed -i 's|^#include "common/core/half.h".*|#include "half.h" /* bf16 and fp16 */|' "$COPY/common/model/model.h"
    sed -i 's|^\(#include "common/core/util.h"\).*|\1|' "$COPY/common/model/optim.c"
    run graph --repo "$COPY"
    assert_failure
    assert_output --partial 'common/model/model.h includes "half.h": name it from the repository root (common/core/half.h)'
    assert_output --partial 'common/model/optim.c includes "common/core/util.h" without a comment saying what it brings'
}

@test "the map of common/ names every file of its folders" {
    local missing=()
    for f in "$REPO"/common/{core,device,kernels,model,comm,run,scripts,python,tools}/*; do
        grep -q "\`$(basename "$f")\`" "$REPO/common/README.md" || missing+=("${f#$REPO/}")
    done
    [ ${#missing[@]} -eq 0 ] || { echo "not in common/README.md: ${missing[*]}"; false; }
}
