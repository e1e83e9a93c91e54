"""Reads a run's TensorBoard events files with TensorBoard's own reader; one JSON object per scalar.

Usage: read_tb.py RUN_DIR   → lines {"tag": ..., "step": N, "value": V, "wall_time": T}, tag by tag in step order.
The folder is read as TensorBoard reads it: every events file in name order, one accumulator, so that a resumed
run's SessionLog START drops what an earlier start logged after the checkpoint.
Exit 3 when the tensorboard package is missing (scripts/setup.sh installs it), 4 when there is no events file.
"""
import glob
import json
import os
import sys

try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
except ImportError as e:
    print(f"read_tb.py: cannot import tensorboard with {sys.executable} ({e}); run scripts/setup.sh", file=sys.stderr)
    sys.exit(3)

run_dir = sys.argv[1]
if not glob.glob(os.path.join(run_dir, "events.out.tfevents.*")):
    print(f"read_tb.py: no events.out.tfevents.* in {run_dir}", file=sys.stderr)
    sys.exit(4)
acc = EventAccumulator(run_dir, size_guidance={"scalars": 0})  # 0: keep every scalar, no sampling
acc.Reload()
for tag in sorted(acc.Tags()["scalars"]):
    for ev in acc.Scalars(tag):
        print(json.dumps({"tag": tag, "step": ev.step, "value": ev.value, "wall_time": ev.wall_time}))
