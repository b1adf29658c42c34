# lib.sh: the helpers the course's shell scripts share (sourced:
# `. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"`), written once: a CSV's columns
# by name, and a median. (outputs.sh beside it holds the output-file rule.)
#
# One rule for a column's name: the header's FIRST field of that name (a name
# written twice reads as its first column, in every script alike).

# csv_awk [-v VAR=VALUE]... PROGRAM FILE...: awk PROGRAM over CSV files, each
# file's header read first and skipped: in PROGRAM, col("NAME") is this row's
# field of column NAME, "" where the file has no such column, and has("NAME")
# whether it has one. Every shell script reads a CSV's columns through it.
csv_awk() {
    local vars=()
    while [ "$1" = -v ]; do vars+=(-v "$2") && shift 2; done
    awk -F, ${vars[@]+"${vars[@]}"} '
        function col(name) { return (name in c) ? $c[name] : "" }
        function has(name) { return name in c }
        FNR == 1 { delete c; for (i = 1; i <= NF; i++) if (!($i in c)) c[$i] = i; next }
        '"$1" "${@:2}"
}

# column FILE NAME: the values of column NAME of the CSV FILE, one a line, the
# header skipped; nothing when FILE has no such column. Of a one-row CSV
# (run.csv) that is its value; `| head -n 1` takes the first row's.
column() {
    csv_awk -v name="$2" 'has(name) { print col(name) }' "$1"
}

# median: the median of the numbers on stdin, one a line (the mean of the
# middle two of an even count); nothing when there are none.
median() {
    sort -g | awk '{ v[NR] = $1 } END { if (NR) print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
