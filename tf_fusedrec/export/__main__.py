"""python -m tf_fusedrec.export --config C --model-dir DIR --out EXPORT: exports the newest checkpoint in DIR (written by
any number of workers) for serving.

The model of the config is built in this one process, the checkpoint is restored onto it (the elastic restore onto one
worker reads every shard), and fr.export.export_model writes the export; the first batch of the config's data tells
the dense inputs and each feature's layout.
"""

import argparse
import json
import os
import sys


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog="python -m tf_fusedrec.export",
                                description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--config", required=True, help="the configs/*.yaml the model was trained with")
    p.add_argument("--model-dir", required=True, help="the training's --model-dir (its newest checkpoint is exported)")
    p.add_argument("--out", required=True, help="the export directory to write")
    p.add_argument("--embedding", default="auto", help="the training's --embedding (auto: read from the checkpoint)")
    p.add_argument("--parts", type=int, default=4, help="files per table group (ranges of the routing hash space)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --out")
    return p.parse_args(argv)


def embedding_kind(manifest):
    """fused or per_feature, from the table names a checkpoint holds ({layer}/{group} or {layer}-{feature})."""
    return "fused" if all("/" in t for t in manifest["tables"]) else "per_feature"


def run(args):
    from tf_fusedrec import _frameworks  # noqa: PLC0415

    tf = _frameworks.import_tensorflow()
    import tf_fusedrec as fr  # noqa: PLC0415
    from tf_fusedrec import config as cfg  # noqa: PLC0415
    from tf_fusedrec.distributed import comm as comm_lib  # noqa: PLC0415
    from tf_fusedrec.train import checkpoint as ckpt  # noqa: PLC0415
    from tf_fusedrec.train import experiment  # noqa: PLC0415

    config = cfg.load_config(args.config)
    steps = ckpt.published_steps(args.model_dir)
    if not steps:
        raise ValueError(f"--model-dir {args.model_dir}: no published checkpoint (ckpt-*/{ckpt.MANIFEST}) to export")
    with open(os.path.join(ckpt.step_dir(args.model_dir, steps[-1]), ckpt.MANIFEST)) as f:
        manifest = json.load(f)
    kind = embedding_kind(manifest) if args.embedding == "auto" else args.embedding
    comm = comm_lib.get_comm("single")
    replication = fr.HotReplication() if manifest.get("replicated") else None
    embedding = experiment.make_embedding(kind, config.embedding_features(), config, comm=comm,
                                          replication=replication)
    model = experiment.make_model(config, embedding)
    optimizer = fr.train.make_optimizer(model, default=config.train.dense_optimizer)
    step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    example = next(iter(experiment.make_dataset(config, config.train.batch_size, 0, 1).take(1)))[0]
    model(example, training=False)  # builds the dense weights before the restore
    restored = ckpt.Checkpointer(args.model_dir, model, optimizer, step, comm, config_name=config.name).restore()
    source = {"config": config.name, "model_dir": os.path.abspath(args.model_dir), "step": restored["step"],
              "workers": restored["workers"], "embedding": kind}
    exported = fr.export.export_model(model, args.out, example=example, parts=args.parts, overwrite=args.overwrite,
                                      source=source)
    rows = sum(g["rows"] for g in exported["groups"])
    print(f"exported step {restored['step']} (trained on {restored['workers']} worker(s)) of {args.model_dir} to "
          f"{args.out}: {len(exported['groups'])} group(s), {rows} rows, {len(exported['features'])} features",
          file=sys.stderr)
    return exported


def main(argv=None):
    try:
        run(parse_args(argv))
    except (ValueError, FileNotFoundError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
