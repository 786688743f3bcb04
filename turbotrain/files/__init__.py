"""Reading and writing files that others can reach: untrusted.py (what a dataset, a checkpoint or
a config holds is read capped and checked), safe_create.py (every file turbotrain writes, never
through a planted name), folder_lock.py (one writer per folder). The lowest layer: it imports
nothing of turbotrain's but os_failure and printable."""
