"""What a SOURCE path holds: detect.py's table of kinds, one module per kind's reader, and the
Source they read into (source.py)."""
