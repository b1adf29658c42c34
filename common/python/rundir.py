"""rundir.py: a run directory as the chapter programs write it (--out DIR), read the one way every
tool does: plot.py and its figures, demo_tables.py, overlap.py, pipeline_bubble.py, 06_offload/capacity.py.

A run directory holds steps.csv, memory.csv and run.csv (every chapter), busy.csv (chapter 03 on)
and timeline.csv (chapter 03's --cp ring and --ep, 04-06); ROADMAP.md gives their columns. Each file is read
through tool.read_csv, so that one missing, empty, cut short or of another kind ends the tool with
ONE line naming the file and what the tool reads there (valid), exit status 2 under tool.run_tool.

Directories named LABEL.rN (N = 1, 2, ...) are repeats of one configuration (label_of, load_runs).
The one timing rule of the course: medians over steps leave out the first (warm-up) step
(after_warmup; median_of for a column of the rows left).
"""
import glob
import os
import re
from collections import OrderedDict

from tool import median, read_csv

RUN_DIRECTORY = "a run directory written by a chapter program"
FILES = ("steps", "memory", "run", "busy", "timeline")
OPTIONAL = ("busy", "timeline")  # files a run may lack: read() answers None for them


def read(run_dir, name, valid=RUN_DIRECTORY, required=None):
    """The rows of run_dir/NAME.csv (NAME one of FILES); None for an OPTIONAL file the run does not
    have, unless required (a tool that reads nothing else). Anything else that is not such a CSV,
    or is missing, is refused in one line ending "(valid: VALID)"."""
    if name not in FILES:
        raise KeyError(name)
    path = os.path.join(run_dir, name + ".csv")
    if required is None:
        required = name not in OPTIONAL
    if not required and not os.path.exists(path):
        return None
    return read_csv(path, valid)


def run_row(run_dir, valid=RUN_DIRECTORY):
    """run.csv's one row."""
    return read(run_dir, "run", valid)[0]


def after_warmup(rows):
    """steps.csv's rows less the first (warm-up) step, unless it is the only one."""
    return rows[1:] if len(rows) > 1 else rows


def median_of(rows, column):
    """The median of a numeric column over rows, leaving out rows where it is empty or absent
    (a column a chapter adds); None when no row has it."""
    values = [float(r[column]) for r in rows if r.get(column) not in (None, "")]
    return median(values) if values else None


def grid_place(run_row, rank):
    """(stage, tp rank, replica) of a world rank from run.csv's row: grid.h's order, tp fastest,
    then pp, then dp."""
    tp, pp = int(run_row.get("tp") or 1), int(run_row.get("pp") or 1)
    return rank // tp % pp, rank % tp, rank // (tp * pp)


def label_of(run_dir):
    """(label, repeat index) from a directory name such as 'small.r2'."""
    name = os.path.basename(os.path.normpath(run_dir))
    m = re.fullmatch(r"(.+)\.r(\d+)", name)
    return (m.group(1), int(m.group(2))) if m else (name, 1)


def repeats(runs_dir, label):
    """The run directories of every repeat of LABEL under runs_dir (LABEL.r1, LABEL.r2, ...), in order."""
    return sorted(glob.glob(os.path.join(runs_dir, label + ".r*")), key=lambda d: label_of(d)[1])


class Run(dict):
    """A run directory: run["dir"], run["repeat"], and the rows of its CSVs (FILES) as run["steps"],
    run["memory"], ... read when first asked for, so that a tool needs only the files it uses."""

    def __init__(self, run_dir, repeat, valid=RUN_DIRECTORY):
        super().__init__(dir=run_dir, repeat=repeat)
        self.valid = valid

    def __missing__(self, name):
        self[name] = read(self["dir"], name, self.valid)
        return self[name]


def load_runs(dirs, valid=RUN_DIRECTORY):
    """OrderedDict label -> list of runs (Run), repeats in order; valid: what the tool reads, named
    when a file is missing or not one a chapter program writes."""
    groups = OrderedDict()
    for d in dirs:
        label, repeat = label_of(d)
        groups.setdefault(label, []).append(Run(d, repeat, valid))
    for runs in groups.values():
        runs.sort(key=lambda r: r["repeat"])
    return groups
