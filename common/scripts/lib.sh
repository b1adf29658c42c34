# lib.sh: the helpers the course's shell scripts share (sourced:
# `. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"`), written once: a CSV's column
# by name, and a median. (outputs.sh beside it holds the output-file rule.)

# column FILE NAME: the values of column NAME of the CSV FILE, one a line, the
# header skipped; nothing when FILE has no such column. Of a one-row CSV
# (run.csv) that is its value; `| tail -n 1` takes the last row's.
column() {
    awk -F, -v name="$2" 'NR == 1 { for (i = 1; i <= NF; i++) if ($i == name) c = i; next } c { print $c }' "$1"
}

# median: the median of the numbers on stdin, one a line (the mean of the
# middle two of an even count); nothing when there are none.
median() {
    sort -g | awk '{ v[NR] = $1 } END { if (NR) print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
