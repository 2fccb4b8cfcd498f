"""Writes the Criteo TSV files as TFRecord, Parquet or CSV files with their schema, for the file sources.

    python -m tf_fusedrec.data.convert criteo train.txt --to parquet --out /data/criteo_parquet --files 8
    # -> /data/criteo_parquet/part-00000-of-00008.parquet ... and schema.yaml, the config's `data:` section

The records keep their order (file k holds the k-th run of them), and the values are those the built-in reader
(data/criteo.py) makes: the label (float32), the dense features already as ``log(1 + max(x, 0))`` (float32 columns
I1..I13, a missing value 0), the categorical values as the hex strings of the TSV (string columns C1..C26, null or
absent where missing; the schema gives them type string, shape list: hashed like the built-in reader, an empty row
where missing). The file sources then give the same batches as ``data.source: criteo`` on the same records.
TFRecord records are ``tf.train.Example``s (a missing value: no feature); CSV files have a header line.
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

FORMATS = {"tfrecord": "tfrecord", "parquet": "parquet", "csv": "csv"}  # format -> file extension


def criteo_schema(num_dense=13, num_sparse=26):
    """The ``data.schema`` mapping of converted Criteo files."""
    return {"label": "label", "dense": [f"I{i}" for i in range(1, num_dense + 1)],
            "features": {f"C{i}": {"type": "string", "shape": "list"} for i in range(1, num_sparse + 1)}}


def criteo_table(paths, num_dense=13, num_sparse=26):
    """A pyarrow Table of Criteo TSV files (paths: files or globs, in order): label, I1.., C1.. as the module says.

    Raises:
      ValueError naming the file and line of a line with another number of fields or a label other than 0/1.
    """
    import pyarrow as pa  # noqa: PLC0415
    import pyarrow.csv as pacsv  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    from tf_fusedrec.data.files import expand_paths  # noqa: PLC0415

    names = ["label"] + [f"I{i}" for i in range(1, num_dense + 1)] + [f"C{i}" for i in range(1, num_sparse + 1)]
    tables = []
    for path in expand_paths(paths, "criteo input"):
        invalid = []

        def handler(row, invalid=invalid):
            invalid.append(row)
            return "error"

        try:
            raw = pacsv.read_csv(path, read_options=pacsv.ReadOptions(column_names=names, use_threads=False),
                                 parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False,
                                                                  invalid_row_handler=handler),
                                 convert_options=pacsv.ConvertOptions(column_types={n: pa.string() for n in names},
                                                                      strings_can_be_null=False))
        except pa.ArrowInvalid as e:
            where = f" line {invalid[0].number}" if invalid and invalid[0].number else ""
            raise ValueError(f"Criteo file {path}{where}: expected {len(names)} tab-separated fields ({e})") from None
        columns = {}
        label = raw.column("label").to_numpy(zero_copy_only=False)
        wrong = np.flatnonzero((label != "0") & (label != "1"))
        if len(wrong):
            raise ValueError(f"Criteo file {path} line {wrong[0] + 1}: the label must be 0 or 1, got "
                             f"{label[wrong[0]]!r}")
        columns["label"] = pa.array(label.astype(np.float32))
        for i in range(1, num_dense + 1):  # what data/criteo.py computes, with the same ops
            d = tf.constant(raw.column(f"I{i}").to_numpy(zero_copy_only=False).astype(object))
            d = tf.strings.to_number(tf.where(tf.equal(d, ""), "0", d), tf.float64)
            columns[f"I{i}"] = pa.array(tf.cast(tf.math.log1p(tf.maximum(d, 0.0)), tf.float32).numpy())
        for i in range(1, num_sparse + 1):
            columns[f"C{i}"] = _null_empty(pa, raw.column(f"C{i}").combine_chunks())
        tables.append(pa.table(columns))
    return pa.concat_tables(tables)


def _null_empty(pa, column):
    import pyarrow.compute as pc  # noqa: PLC0415

    return pc.if_else(pc.equal(column, ""), pa.scalar(None, pa.string()), column)


def _tfrecord_bytes(table, schema):
    """The serialized tf.train.Example of each row (a null: no feature)."""
    import tensorflow as tf  # noqa: PLC0415

    features = schema["features"]
    data = table.to_pydict()
    out = []
    for row in range(table.num_rows):
        feature = {}
        for name, value in ((n, data[n][row]) for n in table.column_names):
            if value is None:
                continue
            if name in features:
                values = value if isinstance(value, list) else [value]
                if features[name].get("type") == "string":
                    feature[name] = tf.train.Feature(bytes_list=tf.train.BytesList(
                        value=[v.encode() if isinstance(v, str) else v for v in values]))
                else:
                    feature[name] = tf.train.Feature(int64_list=tf.train.Int64List(value=values))
            else:
                feature[name] = tf.train.Feature(float_list=tf.train.FloatList(value=[value]))
        out.append(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    return out


def write(table, schema, out_dir, to, files=1, row_group_size=65536):
    """Writes `table` as `files` files of format `to` (tfrecord | parquet | csv) under `out_dir`, record order kept;
    returns their paths."""
    import pyarrow.csv as pacsv  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415
    import tensorflow as tf  # noqa: PLC0415

    if to not in FORMATS:
        raise ValueError(f"--to must be one of {sorted(FORMATS)}, got {to!r}")
    if files < 1:
        raise ValueError(f"--files must be >= 1, got {files}")
    os.makedirs(out_dir, exist_ok=True)
    bounds = np.linspace(0, table.num_rows, files + 1).astype(np.int64)
    paths = []
    for k in range(files):
        part = table.slice(int(bounds[k]), int(bounds[k + 1] - bounds[k]))
        path = os.path.join(out_dir, f"part-{k:05d}-of-{files:05d}.{FORMATS[to]}")
        if to == "parquet":
            pq.write_table(part, path, row_group_size=row_group_size)
        elif to == "csv":
            pacsv.write_csv(part, path)
        else:
            with tf.io.TFRecordWriter(path) as writer:
                for record in _tfrecord_bytes(part, schema):
                    writer.write(record)
        paths.append(path)
    return paths


def build_parser():
    p = argparse.ArgumentParser(prog="python -m tf_fusedrec.data.convert", description=__doc__.split("\n\n")[0])
    p.add_argument("dataset", choices=["criteo"], help="the built-in format of the input")
    p.add_argument("inputs", nargs="+", help="the input files (or globs), in order")
    p.add_argument("--to", required=True, choices=sorted(FORMATS))
    p.add_argument("--out", required=True, help="the output directory")
    p.add_argument("--files", type=int, default=1, help="how many files to write (default 1)")
    p.add_argument("--num-dense", type=int, default=13)
    p.add_argument("--num-sparse", type=int, default=26)
    return p


def main(argv=None):
    args = build_parser().parse_args(argv)
    import yaml  # noqa: PLC0415

    try:
        table = criteo_table(args.inputs, args.num_dense, args.num_sparse)
        schema = criteo_schema(args.num_dense, args.num_sparse)
        paths = write(table, schema, args.out, args.to, args.files)
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    pattern = os.path.join(os.path.abspath(args.out), f"part-*.{FORMATS[args.to]}")
    with open(os.path.join(args.out, "schema.yaml"), "w") as f:
        yaml.safe_dump({"data": {"source": args.to, "path": pattern, "schema": schema}}, f, sort_keys=False)
    print(f"wrote {table.num_rows} records to {len(paths)} {args.to} file(s) under {args.out}; their data section: "
          f"{os.path.join(args.out, 'schema.yaml')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
