"""tool.py: the house rules of the course's Python tools (plot.py, chapter_diffs.py, concepts.py,
kernel_breakdown.py, 06_offload/capacity.py), written once.

- Bad input ends a tool with ONE line on stderr naming the problem and the valid form, and exit status 2:
  a tool raises Refusal, and run_tool(PREFIX, main) prints it. A file that cannot be opened, read or
  written (OSError) is reported the same way. Any other exception is a bug in the tool and keeps its
  traceback.
- read_csv reads a CSV the course's programs write, and refuses in one line what is not one: a missing
  file, a binary one, an empty one, a header without rows, a row cut short, (asked for by a row) a
  column the file does not have, and (taken as a number) a field that is not one. Every CSV the
  tools, 06_offload's scripts and the benchmarks' summaries read goes through it.
- median: the one median of the tools and scripts (the mean of the middle two of an even count).
- The output-file rule, the same as the C programs' and the scripts', with the same messages: a tool
  writes a file only at a new name or over its own earlier output, which it recognises by content
  (check_output_file); never over a directory, a device or any other file. A tool whose --out is a
  directory of its files makes it with make_output_dir (a new name or a directory) and checks each
  file it writes there with check_output_file.
"""
import csv
import io
import os
import stat
import struct
import sys
import tempfile


class Refusal(Exception):
    """A request the tool refuses: its message is the one line printed; status is the exit status."""

    def __init__(self, message, status=2):
        super().__init__(message)
        self.status = status


def run_tool(prefix, main):
    """Runs main() and exits with its return value (None: 0). A Refusal, or an OSError (a file that
    cannot be opened, read or written), ends the program with one line, PREFIX then the message,
    and exit status 2 (a Refusal's own status where it gives one)."""
    try:
        status = main()
    except Refusal as e:
        print(f"{prefix}{e}", file=sys.stderr)
        sys.exit(e.status)
    except OSError as e:
        where = f"{e.filename}: " if e.filename else ""
        print(f"{prefix}{where}{e.strerror or e}", file=sys.stderr)
        sys.exit(2)
    sys.exit(status or 0)


class Field(str):
    """A CSV field: its text, and where it stands. float() and int() of one that is not a number
    are refused (Refusal) with the file, line and column, where a plain str would raise ValueError."""

    def __new__(cls, text, path, line, column, valid):
        field = super().__new__(cls, text)
        field.where = (path, line, column, valid)
        return field

    def _number(self, kind):
        try:
            return kind(str(self))
        except ValueError:
            path, line, column, valid = self.where
            raise Refusal(f"{path} line {line}: {column} = '{self}' is not a number (valid: {valid})") from None

    def __float__(self):
        return self._number(float)

    def __int__(self):
        return self._number(int)


class CsvRow(dict):
    """A row of read_csv: a dict of column -> text, which refuses (Refusal) a column the file lacks
    instead of raising KeyError. row.get(name) still answers None for an optional column."""

    path, valid = "", ""

    def __missing__(self, column):
        raise Refusal(f"{self.path}: has no column '{column}' (valid: {self.valid})")


def read_csv(path, valid, text=None):
    """The rows (CsvRow) of the CSV at path, which must have a header and at least one row, every
    row with the header's number of fields. Anything else is refused in one line that ends with
    "(valid: VALID)", VALID saying what the file should be (e.g. "a steps.csv written by a chapter
    program"). text, when given, is the CSV's text, read from path by the caller (e.g. the CSV
    lines of a tool's log), and path only names it."""
    try:
        if text is not None:
            data = text.encode("utf-8")
        else:
            with open(path, "rb") as f:
                data = f.read()
    except FileNotFoundError:
        raise Refusal(f"{path}: no such file (valid: {valid})") from None
    except IsADirectoryError:
        raise Refusal(f"{path}: is a directory (valid: {valid})") from None
    try:
        text = data.decode("utf-8")
        if "\0" in text:
            raise UnicodeError
        lines = list(csv.reader(io.StringIO(text, newline="")))
    except (UnicodeError, csv.Error):
        raise Refusal(f"{path}: is not a text CSV (valid: {valid})") from None
    if not lines:
        raise Refusal(f"{path}: is empty (valid: {valid})")
    header, rows = lines[0], []
    for number, fields in enumerate(lines[1:], start=2):
        if not fields:  # a blank line, which csv.DictReader skips too
            continue
        if len(fields) != len(header):
            raise Refusal(f"{path} line {number}: {len(fields)} fields where the header has {len(header)}, "
                          f"a file cut short or not this kind of CSV (valid: {valid})")
        row = CsvRow((name, Field(text, path, number, name, valid)) for name, text in zip(header, fields))
        row.path, row.valid = path, valid
        rows.append(row)
    if not rows:
        raise Refusal(f"{path}: has a header and no rows (valid: {valid})")
    return rows


def median(values):
    """The median of the numbers in values (an iterable, not empty): the middle one, or the mean of
    the middle two."""
    v = sorted(values)
    n = len(v)
    if not n:
        raise ValueError("the median of no values")
    return v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2


def check_output_dir(path, flag):
    """--out DIR, a directory of the tool's files: a new name (the caller creates it) or an
    existing directory; anything else is refused."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        raise Refusal(f"{flag} {path}: exists and is not a directory (valid: a new name or a directory)")


def make_output_dir(path, flag):
    """Create --out DIR (check_output_dir's rule), and prove this user can write there by creating and
    removing a directory of a fresh name in it; refuses in one line where it cannot."""
    check_output_dir(path, flag)
    try:
        os.makedirs(path, exist_ok=True)
        os.rmdir(tempfile.mkdtemp(prefix=".write-probe-", dir=path))
    except OSError as e:
        raise Refusal(f"{flag} {path}: cannot write there ({e.strerror or e}) "
                      "(valid: a directory this user can write)") from None


def _article(kind):
    return "an" if kind[:1].lower() in "aeiou" else "a"


def check_output_file(path, flag, kind, is_own):
    """May the tool write its file at path? Yes for a new name, and for an existing regular file
    that is_own(path) recognises by content as the tool's earlier output (KIND, e.g. "plot.py
    PNG"). Refuses a directory, a device, a pipe and any other file:
        "<flag> <path>: is a directory (valid: a file name)"
        "<flag> <path>: exists and is not a <kind> (valid: a new name or an earlier <kind>)"
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        raise Refusal(f"{flag} {path}: is a directory (valid: a file name)")
    if not stat.S_ISREG(st.st_mode) or not is_own(path):
        raise Refusal(f"{flag} {path}: exists and is not {_article(kind)} {kind} "
                      f"(valid: a new name or an earlier {kind})")


def file_starts_with(path, prefix):
    """Whether the file's first bytes are prefix (bytes): a tool's own CSV by its exact header."""
    with open(path, "rb") as f:
        return f.read(len(prefix)) == prefix


def is_matplotlib_png(path):
    """A PNG that matplotlib wrote: the PNG signature, then before the image data a tEXt chunk
    'Software' whose text begins 'Matplotlib' (savefig writes it into every PNG)."""
    with open(path, "rb") as f:
        if f.read(8) != b"\x89PNG\r\n\x1a\n":
            return False
        while True:
            head = f.read(8)
            if len(head) < 8:
                return False
            length, kind = struct.unpack(">I4s", head)
            if kind in (b"IDAT", b"IEND") or length > 1 << 20:
                return False
            data = f.read(length)
            if kind == b"tEXt" and data.startswith(b"Software\0Matplotlib"):
                return True
            f.seek(4, os.SEEK_CUR)  # the chunk's CRC
