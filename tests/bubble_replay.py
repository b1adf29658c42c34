"""bubble_replay.py: pipeline_bubble.replay_bubble, the bubble of a schedule replayed at given
times, against independent references (tests/chapters/pipeline_schedule.bats runs it):

  python3 tests/bubble_replay.py TEST_SCHEDULE   (build/tests/test_schedule, for its --print-chunks)

1. The schedules' own action lists (test_schedule --print-chunks, the lists 04 runs), every
   computation taking its kind's time: the replayed bubble is the closed form, written again
   here from the papers: (P-1)/(M+P-1) for GPipe and 1F1B, (P-1)/(VM+P-1) for interleaved
   (a chunk's F and B take 1/V of a stage's), and ZB-H1's (P-1)(F+B-W)/(M(F+B+W)+(P-1)(F+B-W)).
2. GPipe with stages of unequal times: the forwards flow through the stages like identical jobs
   through a flow shop, the last finishing at sum(f) + (M-1) max(f), and the backwards flow back
   the same way, so the span is sum(f) + (M-1) max(f) + sum(b) + (M-1) max(b).
3. A list that waits on itself (B before its F on the last stage) is refused, not replayed.
Prints one line per failure and exits 1 on any.
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common", "python"))
from pipeline_bubble import replay_bubble, zb_h1_formula  # noqa: E402

failures = []


def check(what, got, want, tol=1e-12):
    if abs(got - want) > tol:
        failures.append(f"FAIL {what}: replayed {got:.6f}, expected {want:.6f}")


def lists(schedule, P, V, M, times):
    """The schedule's computations per stage, from test_schedule --print-chunks, with the kind's time
    (the chunk written in the list is dropped: replay_bubble finds it from the order)."""
    text = subprocess.run([sys.argv[1], "--print-chunks", schedule, str(P), str(V), str(M)], check=True,
                          capture_output=True, text=True).stdout
    stages = []
    for line in text.splitlines():
        if not line.startswith("stage "):
            continue
        actions = []
        for word in line.split(":", 1)[1].split():
            if word[0] in "FBW":
                micro = int(word[1:].split("c")[0])
                actions.append((word[0], micro, times[word[0]]))
        stages.append(actions)
    assert len(stages) == P, text
    return stages


for P in (2, 3, 4):
    for M in (P, 2 * P, 3 * P):
        tf, tb, tw = 1.0, 2.0, 0.0
        for schedule in ("gpipe", "1f1b"):
            check(f"{schedule} P={P} M={M}", replay_bubble(lists(schedule, P, 1, M, {"F": tf, "B": tb}), P),
                  (P - 1) / (M + P - 1))
        V = 2
        check(f"interleaved P={P} V={V} M={M}",
              replay_bubble(lists("interleaved", P, V, M, {"F": tf / V, "B": tb / V}), P, V),
              (P - 1) / (V * M + P - 1))
        # W longer than B (as a loaded machine can measure): no W fills the last stage's first wait
        for tf, tb, tw in ((1.0, 1.0, 1.0), (1.0, 1.2, 0.6), (1.0, 1.0, 2.0), (1.0, 0.5, 3.0), (0.5, 0.5, 2.0)):
            check(f"zb-h1 P={P} M={M} F={tf} B={tb} W={tw}",
                  replay_bubble(lists("zb-h1", P, 1, M, {"F": tf, "B": tb, "W": tw}), P),
                  zb_h1_formula(P, M, tf, tb, tw))

f, b, M = [1.0, 1.5, 0.8], [2.0, 2.5, 1.9], 5
stages = [[("F", m, f[s]) for m in range(M)] + [("B", m, b[s]) for m in range(M)] for s in range(3)]
span = sum(f) + (M - 1) * max(f) + sum(b) + (M - 1) * max(b)
check("gpipe, unequal stages", replay_bubble(stages, 3), 1 - M * (sum(f) + sum(b)) / (3 * span))

try:
    replay_bubble([[("F", 0, 1.0), ("B", 0, 1.0)], [("B", 0, 1.0), ("F", 0, 1.0)]], 2)
    failures.append("FAIL a list that waits on itself was replayed")
except ValueError:
    pass

print("\n".join(failures) if failures else "bubble_replay: every replay equals its reference")
sys.exit(1 if failures else 0)
