"""A prepared dataset in object storage (split.py): the store client (object_store.py) and
its read limits, the shard cache with its journal and locks; urls.py is text only."""
