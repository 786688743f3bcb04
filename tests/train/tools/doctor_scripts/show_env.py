"""Prints what the doctor's child sees of its environment (test_doctor_runs.py)."""
import json
import os
import sys

print("ENV " + json.dumps({"PYTHONPATH": os.environ.get("PYTHONPATH", ""),
                           "hooked": "turbotrain_doctor" in sys.modules}))
print("to stderr", file=sys.stderr)
