#!/usr/bin/env bats
# deps.bats: common/scripts/install-deps.sh checks the tools, not Debian's package
# names. A fake dpkg says nothing is installed and a fake apt-get records its
# calls (it accepts `update` and fails `install`, as apt does offline), so
# nothing here installs anything. This machine has every tool; a tool is
# "removed" by running the script with a PATH that lacks it.

load ../helpers

setup() {
    fakes="$BATS_TEST_TMPDIR/fakes"
    mkdir -p "$fakes"
    apt_log="$BATS_TEST_TMPDIR/apt-get.log"
    printf '#!/bin/sh\nexit 1\n' >"$fakes/dpkg-query"
    printf '#!/bin/sh\nexit 1\n' >"$fakes/dpkg"
    printf '#!/bin/sh\necho "$*" >>"%s"\n[ "$1" = update ]\n' "$apt_log" >"$fakes/apt-get"
    printf '#!/bin/sh\nexec "$@"\n' >"$fakes/sudo" # never the real sudo, which would find the real apt-get
    chmod +x "$fakes"/*
}

# path_without TOOL...: a PATH of links to every program on $PATH except TOOL...
path_without() {
    local bin="$BATS_TEST_TMPDIR/bin" dir tool
    mkdir -p "$bin"
    for dir in ${PATH//:/ }; do
        if [ -d "$dir" ]; then ln -s "$dir"/* "$bin"/ 2>/dev/null || true; fi # the first of a name wins, as on PATH
    done
    for tool in "$@"; do rm -f "$bin/$tool"; done
    echo "$bin"
}

@test "install-deps succeeds without apt-get when the tools are present but dpkg knows no package" {
    run env PATH="$fakes:$PATH" "$REPO/common/scripts/install-deps.sh"
    assert_success
    assert_output --partial "everything the course needs is present"
    [ ! -e "$apt_log" ]
}

@test "install-deps installs only OpenMPI's packages when mpicc is missing" {
    run env PATH="$fakes:$(path_without mpicc apt-get dpkg dpkg-query sudo)" "$REPO/common/scripts/install-deps.sh"
    assert_failure # the fake apt-get cannot install
    assert_output --partial "missing: mpicc"
    assert_output --partial "apt-get install openmpi-bin libopenmpi-dev failed"
    [ "$(cat "$apt_log")" = "update -qq
install -y -qq --no-install-recommends openmpi-bin libopenmpi-dev" ]
}

@test "install-deps lists what is missing and stops on a system without apt-get" {
    run env PATH="$(path_without mpicc mpirun apt-get)" "$REPO/common/scripts/install-deps.sh"
    assert_failure 1
    assert_output --partial "missing: mpicc"
    assert_output --partial "missing: mpirun"
    assert_output --partial "not a Debian/Ubuntu system"
    [ ! -e "$apt_log" ]
}
