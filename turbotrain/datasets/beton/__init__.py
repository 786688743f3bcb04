"""The prepared format: a split's `.beton` files (layout.py, writer.py, reader.py, shards.py),
`dataset.json` (dataset_json.py), the split a pipeline reads (split.py), the sample codec and
`verify`."""
