"""Real-data layer: fetch the pinned data sets, read them, write ELWC TFRecords.

Modules (import the one you need; only `elwc` and the ELWC writers pull in
TensorFlow):

- `fetch`: download a data set's PyPI archive with pip, check its sha256, cache
  its data members (`fetch("mslr_5k")`, `fetch("movielens_100k")`).
- `letor`: read LETOR / LibSVM ranking text (MSLR-WEB) into per-query arrays,
  convert it to ELWC.
- `elwc`: build, write and read `ExampleListWithContext` TFRecord files.
- `movielens`: MovieLens-100k (RecBole atomic files) as per-user ranking lists
  with a per-user time split.

Source of the data sets and their pins: docs/data.md.
"""
