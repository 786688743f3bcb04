"""What a run measures and writes down: checkpoint.pt, the step clock and the timing
ledger, the timeline, the progress line, metrics.jsonl and summary.json, and the
bottleneck verdict read from that ledger (doctor.py).
"""
