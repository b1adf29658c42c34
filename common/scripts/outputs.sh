# outputs.sh: the output-file rule of the course's shell scripts (sourced:
# `. "$(dirname "${BASH_SOURCE[0]}")/outputs.sh"`), the same rule that
# common/core/util.h's output_file_check states for the C programs. A script
# writes a file it is told to write (a flag, a BENCH_OUT-style directory) only
# when it is a new name, or an existing regular file it recognises BY CONTENT
# as its own earlier output: its first line, the exact CSV header the script
# writes (or a pattern of it). A directory, a device or FIFO, the training
# text, a checkpoint, any other file is refused with one line on stderr and
# exit status 2, before the script runs anything:
#   "FLAG PATH: is a directory (valid: a file name)"
#   "FLAG PATH: not a regular file (valid: a new name or an earlier EARLIER)"
#   "FLAG PATH: exists and is not WHAT (valid: a new name or an earlier EARLIER)"
#   "FLAG PATH: the directory DIR does not exist"

# output_refuse MESSAGE: the one line, and exit 2 (of the script: these run in its shell).
output_refuse() {
    echo "$1" >&2
    exit 2
}

# output_first_line PATH: PATH's first line, read from at most its first 4 KiB, NUL bytes dropped.
output_first_line() { head -c 4096 "$1" | tr -d '\0' | head -n 1; }

# output_file_check FLAG PATH WHAT EARLIER FIRST_LINE: may the script write PATH? FIRST_LINE is a
# bash pattern its own output's first line matches (quote it for an exact header). Returns 0, or
# ends the script with the rule's refusal.
output_file_check() {
    local flag="$1" path="$2" what="$3" earlier="$4" first="$5" dir
    [ -n "$path" ] || output_refuse "$flag: an empty name (valid: a file name)"
    if [ -d "$path" ]; then
        output_refuse "$flag $path: is a directory (valid: a file name)"
    elif [ -e "$path" ] || [ -L "$path" ]; then # a link to nothing would create a file elsewhere
        [ -f "$path" ] && [ -e "$path" ] ||
            output_refuse "$flag $path: not a regular file (valid: a new name or an earlier $earlier)"
        # shellcheck disable=SC2053 # FIRST_LINE is a pattern on purpose
        [[ "$(output_first_line "$path")" == $first ]] ||
            output_refuse "$flag $path: exists and is not $what (valid: a new name or an earlier $earlier)"
    else
        dir="$(dirname -- "$path")"
        [ -d "$dir" ] || output_refuse "$flag $path: the directory $dir does not exist"
    fi
}

# output_dir_check FLAG DIR SCRIPT OWN_FILE FIRST_LINE: may SCRIPT write into (and replace the
# contents of) DIR? A new name, an empty directory, or a directory holding OWN_FILE whose first
# line matches FIRST_LINE: the script's own earlier output. Anything else ends the script:
#   "FLAG DIR: exists and is not SCRIPT's output (no OWN_FILE of its own; valid: ...)"
output_dir_check() {
    local flag="$1" dir="$2" script="$3" own="$4" first="$5"
    local valid="valid: a new name, an empty directory or an earlier output of $script"
    [ -n "$dir" ] || output_refuse "$flag: an empty name (valid: a directory name)"
    if [ -e "$dir" ] || [ -L "$dir" ]; then
        [ -d "$dir" ] || output_refuse "$flag $dir: exists and is not a directory ($valid)"
        [ -z "$(ls -A -- "$dir")" ] && return 0
        [ -f "$dir/$own" ] && [[ "$(output_first_line "$dir/$own")" == $first ]] ||
            output_refuse "$flag $dir: exists and is not $script's output (no $own of its own; $valid)"
    fi
}

# output_dir_usable FLAG DIR: DIR is a new name (the script creates it) or a directory; the script
# then checks each file it writes there with output_file_check (output_files_check).
output_dir_usable() {
    local flag="$1" dir="$2"
    [ -n "$dir" ] || output_refuse "$flag: an empty name (valid: a directory name)"
    if [ -e "$dir" ] || [ -L "$dir" ]; then
        [ -d "$dir" ] || output_refuse "$flag $dir: exists and is not a directory (valid: a new name or a directory)"
    fi
}

# output_files_check FLAG DIR SCRIPT NAME HEADER [NAME HEADER...]: the CSVs SCRIPT writes into DIR
# (a new name or a directory), each a new name or SCRIPT's earlier NAME, known by its exact HEADER.
output_files_check() {
    local flag="$1" dir="$2" script="$3"
    shift 3
    output_dir_usable "$flag" "$dir"
    [ -d "$dir" ] || return 0
    while [ $# -ge 2 ]; do
        output_file_check "$flag" "$dir/$1" "$script's $1 (header ${2%%,*},...)" "$1 of $script" "$2"
        shift 2
    done
}
