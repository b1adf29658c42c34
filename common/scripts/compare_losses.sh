#!/usr/bin/env bash
# compare_losses.sh: does a run give the reference run's losses? The course's
# central invariant (every chapter and layout computes 01's loss), as one
# command with a verdict, for scripts (common/scripts/gpu_check.sh).
#
#   common/scripts/compare_losses.sh REF_STEPS_CSV RUN_STEPS_CSV TOLERANCE [STEPS]
#
# Rows are matched by the `step` column, so a resumed run (steps 4-6 only)
# compares with the same steps of an uninterrupted one. For each step of the
# run: rel = |run - ref| / |ref| of the `loss` column, which must be at most
# TOLERANCE (the course uses 1e-4 for fp32 and 1e-2 for 16-bit runs against
# 01 in the same precision). Prints a line per bad step, then
#   "<n> steps, worst relative difference <x> at step <s> (tolerance <t>)". Exit 0 when every step is
# within the tolerance; 1 when one is not, a step of the run is missing from
# the reference, a loss is not a finite number, the run has no steps, or
# (with STEPS) the run has not exactly STEPS steps; 2 on bad arguments (a
# TOLERANCE that is not a non-negative decimal number, a STEPS that is not a
# whole number from 1), with one line naming the valid form.
set -euo pipefail

if [[ $# -lt 3 || $# -gt 4 ]]; then
    echo "usage: compare_losses.sh REF_STEPS_CSV RUN_STEPS_CSV TOLERANCE [STEPS]" >&2
    exit 2
fi
ref="$1" run="$2" tol="$3" want="${4:-}"
# awk compares a value that does not look like a number as a string, so a
# tolerance of "1O-4" (letter O) would pass any difference: check both here.
if ! [[ "$tol" =~ ^([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][-+]?[0-9]+)?$ ]]; then
    echo "compare_losses: TOLERANCE '$tol' is not a non-negative number (valid: a decimal number such as 1e-4 or 0.01)" >&2
    exit 2
fi
if [[ -n "$want" && ! "$want" =~ ^[1-9][0-9]{0,8}$ ]]; then
    echo "compare_losses: STEPS '$want' is not a count (valid: a whole number of steps from 1)" >&2
    exit 2
fi
for file in "$ref" "$run"; do
    [[ -r "$file" ]] || { echo "compare_losses: cannot read $file" >&2; exit 1; }
done

. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
csv_awk -v tol="$tol" -v want="$want" '
    function finite(x) { return x ~ /^-?[0-9]+(\.[0-9]*)?([eE][-+]?[0-9]+)?$/ }
    !has("step") || !has("loss") { print FILENAME ": no step and loss columns"; nohead = 1; exit 1 }
    { s = col("step"); l = col("loss") }
    NR == FNR { ref[s] = l; next }
    { n++
      if (!(s in ref)) { print "step " s ": not in the reference run"; bad = 1; next }
      if (!finite(l) || !finite(ref[s]) || ref[s] + 0 == 0) {
          print "step " s ": loss " l " against " ref[s]; bad = 1; next }
      r = (l - ref[s]) / ref[s]; if (r < 0) r = -r
      if (!k++ || r > worst) { worst = r; at = s }
      if (r > tol) { print "step " s ": loss " l " against " ref[s] " (relative " r ")"; bad = 1 } }
    END { if (nohead) exit 1
          if (n == 0) { print "the run has no steps"; exit 1 }
          if (k) printf "%d steps, worst relative difference %.3g at step %s (tolerance %s)\n", n, worst, at, tol
          else printf "%d steps, none comparable\n", n
          if (want != "" && n != want) { print "expected " want " steps"; bad = 1 }
          exit bad }' "$ref" "$run"
