"""Starting points through the driver, measured on the offline Fashion-MNIST, two seeds each:

- `--study=transfer`: pre-train a small ViT on classes 0-4, write it in timm's layout
  (`keras_vit.save_pretrained`), and fine-tune it with `--config.pretrained=<that directory>` on
  classes 5-9 with 1,000 labels, against the same recipe from scratch, on both engines (test
  top-1 on the 5,000 test images of classes 5-9);
- `--study=distillation`: the README's quickstart model as the teacher of a smaller ViT trained
  on 6,000 labels, without distillation, with soft and with hard distillation, and with hard
  distillation through DeiT's distillation token (test top-1 on the 10,000 test images).

    python benchmarks/starting_points.py --study=transfer --out=/tmp/starting_points
    python benchmarks/starting_points.py --study=distillation --out=/tmp/starting_points

The transfer's data are folder datasets made from the offline Fashion-MNIST under --out/data;
every run is `python -m train.main` in a process of its own, its log in its workdir. Rerun the
same command to resume: finished runs are read back. Prints one table.
"""

import argparse
import io
import json
import os
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

# A plain ViT (timm's layout holds it; keras_vit's ResNet stem it does not): 7x7 patches of 4.
MODEL = {"variant": "Ti/16", "hidden_size": 64, "mlp_dim": 128, "num_heads": 4,
         "num_layers": 4, "patch_size": 4}
RUN = {"image_size": 28, "batch_size": 128, "eval_batch_size": 500, "crop_min_area": 1.0,
       "flip": False, "steps_per_loop": 100, "export": False}
PRETRAIN = {"total_steps": 1500, "warmup_steps": 100, "eval_every_steps": 1500,
            "checkpoint_every_steps": 1500, "optimizer": "adamw", "learning_rate": 0.003,
            "weight_decay": 0.05, "export": True}
FINETUNE = {"total_steps": 400, "warmup_steps": 40, "eval_every_steps": 400,
            "checkpoint_every_steps": 400, "learning_rate": 0.01}
LABELS = 1000  # of classes 5-9, 200 each


def write_folders(root):
    """root/pretrain/{train,test}/<class 0-4>/ and root/finetune/{train (1,000),test}/<5-9>/."""
    from PIL import Image

    from train.data import fashion_mnist

    if os.path.exists(os.path.join(root, "done")):
        return
    for split in fashion_mnist.SPLITS:
        images, labels = fashion_mnist.read_split(split)
        for task, classes in (("pretrain", range(5)), ("finetune", range(5, 10))):
            kept = np.flatnonzero(np.isin(labels, list(classes)))
            if task == "finetune" and split == "train":
                rng = np.random.default_rng(0)
                kept = np.concatenate([rng.choice(np.flatnonzero(labels == c), LABELS // 5,
                                                  replace=False) for c in classes])
            for index in kept:
                folder = os.path.join(root, task, split, f"class{labels[index]}")
                os.makedirs(folder, exist_ok=True)
                buffer = io.BytesIO()
                Image.fromarray(images[index]).save(buffer, "PNG")
                with open(os.path.join(folder, f"{index}.png"), "wb") as handle:
                    handle.write(buffer.getvalue())
    open(os.path.join(root, "done"), "w").close()


def train(workdir, config, dataset, backend, fields):
    """One `train.main` run (resumed, or read back if done) on `dataset` (a folder; None: the
    config's); its final test accuracy."""
    metrics = os.path.join(workdir, "metrics.jsonl")
    total = fields["total_steps"]

    def final():
        if not os.path.exists(metrics):
            return None
        with open(metrics) as handle:
            records = [json.loads(line) for line in handle if line.strip()]
        done = [r for r in records if r.get("step") == total and "eval_accuracy" in r]
        return done[-1]["eval_accuracy"] if done else None

    if final() is None:
        flags = [f"--config.{name}={value}" for name, value in fields.items()]
        if dataset:
            flags.append(f"--config.dataset=folder:{dataset}")
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, "train.log"), "a") as log:
            subprocess.run([sys.executable, "-m", "train.main", f"--config={config}",
                            f"--workdir={workdir}", *flags], cwd=REPO,
                           env=dict(os.environ, KERAS_BACKEND=backend), stdout=log,
                           stderr=subprocess.STDOUT, check=True)
    return final()


# The distillation study's student: a plain ViT a quarter of the teacher's width.
STUDENT = {"variant": "Ti/16", "hidden_size": 32, "mlp_dim": 64, "num_heads": 2,
           "num_layers": 4, "patch_size": 4}
STUDENT_RUN = {"image_size": 32, "train_split": "train[:6000]", "total_steps": 1000,
               "warmup_steps": 100, "eval_every_steps": 1000, "checkpoint_every_steps": 1000,
               "export": False}
DISTILL_ARMS = {"no distillation": {},
                "soft (T = 3, w = 0.5)": {"distill": "soft", "distill_temperature": 3.0},
                "hard (w = 0.5)": {"distill": "hard"},
                # DeiT's best: the teacher's choice learned by a token and head of its own.
                "token (hard, w = 0.5)": {"distill": "hard", "model.distillation_token": True}}


def distillation_study(args):
    """The quickstart model teaches a smaller ViT on 6,000 labels."""
    teacher = os.path.join(args.out, "runs", "teacher")
    accuracy = train(teacher, "configs/quickstart.py", None, "tensorflow",
                     {"export": True, "total_steps": 2000})
    print(f"teacher (the quickstart): {accuracy:.2%} test top-1", flush=True)
    student = {f"model.{name}": value for name, value in STUDENT.items()}
    rows = []
    for arm, fields in DISTILL_ARMS.items():
        if fields:
            fields = {**fields, "distill_teacher": teacher}
        results = [train(os.path.join(args.out, "runs", "student", arm.split()[0],
                                      f"seed{seed}"), "configs/quickstart.py", None,
                         "tensorflow", {**STUDENT_RUN, **student, **fields, "seed": seed})
                   for seed in range(args.seeds)]
        rows.append(("tensorflow", arm, results))
        print(f"{arm}: {results}", flush=True)
    return rows, "student on 6,000 labels"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--study", required=True, choices=("transfer", "distillation"))
    parser.add_argument("--out", required=True, help="folder of the data, runs and table")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--backends", default="tensorflow,jax", help="transfer: the engines")
    args = parser.parse_args()
    started = time.time()
    rows, what = (transfer_study if args.study == "transfer" else distillation_study)(args)
    print(f"\n| engine | {what} | test top-1 (seeds "
          f"{', '.join(map(str, range(args.seeds)))}) | mean |\n|---|---|---|---|")
    for backend, arm, results in rows:
        print(f"| {backend} | {arm} | {', '.join(f'{r:.2%}' for r in results)} | "
              f"{np.mean(results):.2%} |")
    print(f"\n({time.time() - started:.0f} s)")


def transfer_study(args):
    """Pre-train on classes 0-4, fine-tune on 1,000 labels of 5-9, against scratch."""
    data = os.path.join(args.out, "data")
    write_folders(data)
    model = {f"model.{name}": value for name, value in MODEL.items()}
    pretrained = os.path.join(args.out, "pretrained_timm")
    source = os.path.join(args.out, "runs", "pretrain")
    accuracy = train(source, "configs/quickstart.py", os.path.join(data, "pretrain"),
                     "tensorflow", {**RUN, **PRETRAIN, **model})
    print(f"pre-trained on classes 0-4: {accuracy:.2%} test top-1", flush=True)
    if not os.path.exists(os.path.join(pretrained, "model.safetensors")):
        import keras

        import keras_vit

        encoder = keras.saving.load_model(os.path.join(source, "export", "model.keras"))
        keras_vit.save_pretrained(encoder, pretrained, format="timm")
    rows = []
    finetune = "configs/finetune.py:dataset=fashion_mnist_local"
    for backend in args.backends.split(","):
        for arm, fields in (("from the timm checkpoint", {"pretrained": pretrained}),
                            ("from scratch", {"pretrained": "", **model})):
            results = [train(os.path.join(args.out, "runs", backend, arm.replace(" ", "_"),
                                          f"seed{seed}"), finetune,
                             os.path.join(data, "finetune"), backend,
                             {**RUN, **FINETUNE, **fields, "seed": seed})
                       for seed in range(args.seeds)]
            rows.append((backend, arm, results))
            print(f"{backend}, {arm}: {results}", flush=True)
    return rows, "fine-tuned on 1,000 labels of classes 5-9"


if __name__ == "__main__":
    main()
