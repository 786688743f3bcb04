"""The model registry (models.py: `--model` names, the input stem), our small nets and
the meta-device size check of a model whose shape comes from outside.
"""
