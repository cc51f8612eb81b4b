"""Family ``bad files``: malformed dataset files (the tiny dataset's CSVs, an ``.npz``)."""

from __future__ import annotations

from ..records import Row, table

EDGE = "data/tiny/raw/edge.csv.gz"
FEAT = "data/tiny/raw/node-feat.csv.gz"
LABEL = "data/tiny/raw/node-label.csv.gz"
VALID = "data/tiny/split/random/valid.csv.gz"
NPZ = "data/amazon_photo/raw/amazon_electronics_photo.npz"

INFO = "fullgraph data info {tiny}"
NPZ_INFO = "fullgraph data info --dataset amazon-photo --root data"

BAD_FILES = table(
    "bad files",
    Row("truncated edge.csv.gz", INFO, setup=(("truncate", EDGE, 300), ("drop processed",))),
    Row(
        "edge.csv.gz not gzip",
        INFO,
        setup=(("write", EDGE, b"0,1\n1,2\n"), ("drop processed",)),
    ),
    Row("edge.csv.gz with letters", INFO, setup=(("gz insert", EDGE, 5, "a,b"),)),
    Row("edge.csv.gz with an id out of range", INFO, setup=(("gz append", EDGE, "0,999999"),)),
    Row("edge.csv.gz with a negative id", INFO, setup=(("gz append", EDGE, "-1,3"),)),
    Row("edge.csv.gz with three columns", INFO, setup=(("gz insert", EDGE, 3, "1,2,3"),)),
    Row("edge.csv.gz empty", INFO, setup=(("write gz", EDGE, b""), ("drop processed",))),
    Row("node-feat with NaN", INFO, setup=(("gz nan first row", FEAT),)),
    Row("node-label out of range", INFO, setup=(("gz replace first", LABEL, "9999"),)),
    Row("node-label one row short", INFO, setup=(("gz drop last", LABEL),)),
    Row("split file names an unknown node", INFO, setup=(("gz append", VALID, "123456789"),)),
    Row("npz: valid (control)", NPZ_INFO, expect="ok"),
    Row("npz: CSR index out of range", NPZ_INFO, setup=(("npz set", "adj_indices", 0, 10**6),)),
    Row("npz: CSR indptr not monotone", NPZ_INFO, setup=(("npz reverse", "adj_indptr"),)),
    Row("npz: indptr too short", NPZ_INFO, setup=(("npz drop tail", "adj_indptr", 5),)),
    Row("npz: labels too short", NPZ_INFO, setup=(("npz drop tail", "labels", 3),)),
    Row("npz: negative label", NPZ_INFO, setup=(("npz set", "labels", 0, -7),)),
    Row("npz: NaN feature", NPZ_INFO, setup=(("npz set", "attr_data", 0, float("nan")),)),
    Row("npz: a text file", NPZ_INFO, setup=(("write", NPZ, b"hello, not an npz\n"),)),
    Row(
        "npz: a zip that is not a zip",
        NPZ_INFO,
        setup=(
            ("remove", NPZ),
            ("write", "data/amazon_photo/raw/amazon-photo.zip", b"PK\x03\x04garbage"),
        ),
    ),
)
