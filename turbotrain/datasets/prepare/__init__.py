"""`prepare-dataset SOURCE OUT` (convert.py): the output folder, the shard plan and results,
`--part` manifests and `merge`, and how many workers fit in memory."""
