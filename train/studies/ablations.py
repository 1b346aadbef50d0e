"""The ablation studies of `python -m train.studies.ablate` as data, and the report of each.

A study is a few arms; an arm is the config fields in which it differs from the base config
(configs/ablation.py), by their dotted names (`model.classifier`). Two studies do more than
train every arm at every seed: `classifier` first picks each arm's learning rate by a small
sweep scored on held-out training images, and `hybrid` gives the cheaper model more steps so
that both arms train with the same FLOPs.

The report is drawn from the summary that train.studies.ablate keeps in `<out>/<study>.json` (see
`report`), so it can be redrawn without training; summaries written before the model's fields
moved into `config.model` name them flat (`classifier`), and are drawn the same (`arm_field`).
"""

import dataclasses
import statistics

from keras_vit.architecture.spec import LEARNED_POSITION_EMBEDDINGS

from ..data import augmentation


@dataclasses.dataclass(frozen=True)
class Arm:
    """One arm: `name` is its folder under `<out>/runs/<study>/` and its key in the summary,
    `label` names it in the table and the plot, `fields` are its config values by dotted name
    (`{"model.classifier": "gap"}`)."""

    name: str
    label: str
    fields: dict


@dataclasses.dataclass(frozen=True)
class Study:
    title: str
    question: str  # one sentence: what the study measures, and the paper's place for it
    arms: tuple
    sweep_learning_rate: bool = False  # pick each arm's learning rate on held-out data first
    match_flops: bool = False  # steps x forward FLOPs per image equal across arms
    config: str = "ablation"  # the base config without --config (a shipped name[:arg])
    needs_pretrained: bool = False  # refuse to run without --config.pretrained


# The paper's Table 8: rows are the kinds, columns the placements.
POSITION_KINDS = {
    "none": "No Pos. Emb.",
    "learned": "1-D Pos. Emb.",
    "learned_2d": "2-D Pos. Emb.",
    "relative": "Rel. Pos. Emb.",
}
PLACEMENTS = {
    "stem": "Default/Stem",
    "every_layer": "Every Layer",
    "every_layer_shared": "Every Layer-Shared",
}

# The classifier study's sweep: the base learning rate times these, each arm trained on the
# first (100 - HELD_OUT_PERCENT)% of the train split and scored on the rest.
LEARNING_RATE_FACTORS = (1 / 3, 1, 3)
HELD_OUT_PERCENT = 10


def _position_arm(kind, placement):
    return Arm(f"{kind}-{placement}", f"{kind}\n{placement}",
               {"model.position_embedding": kind,
                "model.position_embedding_placement": placement})


STUDIES = {
    "position_embedding": Study(
        title="Position embeddings",
        question="Which kind of position embedding, added where, in the layout of the paper's "
                 "Table 8 (appendix D.4). Only learned embeddings can be added again before "
                 "every block: N/A marks the combinations that do not exist.",
        # Only embeddings added to the tokens can be added again before every block.
        arms=tuple(_position_arm(kind, placement) for kind in POSITION_KINDS
                   for placement in PLACEMENTS
                   if placement == "stem" or kind in LEARNED_POSITION_EMBEDDINGS)),
    "classifier": Study(
        title="Class token against global average pooling",
        question="The class token against global average pooling of the patch tokens (GAP), "
                 "each at its own best learning rate: the paper's figure 9 (appendix D.3) "
                 "found that GAP works as well, but needs a different learning rate.",
        arms=(Arm("token", "class token", {"model.classifier": "token"}),
              Arm("gap", "GAP", {"model.classifier": "gap"})),
        sweep_learning_rate=True),
    "hybrid": Study(
        title="ViT against the hybrid R+ViT at equal training compute",
        question="Patches cut from the pixels against patches of a ResNet stem's feature map "
                 "(the paper's hybrids, section 4.4 and figure 5), at matched training FLOPs: "
                 "the cheaper model trains for more steps.",
        arms=(Arm("vit", "ViT", {}),
              # The ResNet stem's stride is 4: 1x1 patches of its map give the ViT's 7x7 grid.
              Arm("r_vit", "R+ViT", {"model.variant": "R+Ti/16", "model.patch_size": 1})),
        match_flops=True),
    "axial": Study(
        title="ViT against Axial-ViT",
        question="Full self-attention against axial attention (a row block, then a column "
                 "block, each with its MLP; the paper's appendix D.6), at the same width and "
                 "depth, both pooling with GAP (Axial-ViT has no class token).",
        arms=(Arm("vit", "ViT", {"model.classifier": "gap"}),
              Arm("axial_vit", "Axial-ViT", {"model.variant": "Axial-Ti/16",
                                              "model.classifier": "gap"}))),
    "augreg": Study(
        title="AugReg's augmentation levels on a small training set",
        question="RandAugment and Mixup at the named levels of \"How to train your ViT?\" "
                 "(Steiner et al., 2021), whose claim is that with little data augmentation "
                 "beats none, on a tenth of the training images (configs/augreg.py).",
        arms=tuple(Arm(level, level, {"augment": level})
                   for level in ("none", "light1", "medium2", "strong1")),
        config="augreg"),
    "layer_decay": Study(
        title="Layer-wise learning-rate decay in fine-tuning",
        question="Fine-tuning a pre-trained encoder (--config.pretrained, e.g. the masked patch "
                 "prediction run's export/encoder.npz) on the first 6,000 training images: "
                 "every weight at the learning rate, against block i of D at rate x "
                 "0.75^(D - i) and the embeddings at rate x 0.75^(D + 1) (config.layer_decay).",
        arms=(Arm("uniform", "no decay (1.0)", {"layer_decay": 1.0}),
              Arm("decay_0.75", "decay 0.75", {"layer_decay": 0.75})),
        config="mpp_finetune:labels=6000", needs_pretrained=True),
}


def sweep_learning_rates(base):
    """The classifier study's learning rates around `base`, to two significant digits."""
    return [float(f"{base * factor:.2g}") for factor in LEARNING_RATE_FACTORS]


def pick_learning_rate(sweep):
    """The rate of the best held-out accuracy among `sweep`'s `{"learning_rate", "accuracy"}`
    entries; of equal accuracies, the lowest rate."""
    best = max(sweep, key=lambda entry: (entry["accuracy"], -entry["learning_rate"]))
    return best["learning_rate"]


def matched_steps(steps, forward_flops):
    """{arm: steps} that give every arm the training compute of the costliest at `steps`:
    steps x forward FLOPs per image equal (to rounding); `forward_flops` is {arm: FLOPs}."""
    costliest = max(forward_flops.values())
    return {name: round(steps * costliest / flops) for name, flops in forward_flops.items()}


# ----------------------------------------------------------------------------------------------
# The report, from the summary train.studies.ablate writes.

def accuracy_cell(accuracies):
    """Per-seed accuracies in [0, 1] as "mean ± std" in percent (sample std over seeds); one
    seed has no spread, so its cell is the value alone; none is "–"."""
    if not accuracies:
        return "–"
    values = [100.0 * value for value in accuracies]
    mean = statistics.fmean(values)
    if len(values) == 1:
        return f"{mean:.2f}"
    return f"{mean:.2f} ± {statistics.stdev(values):.2f}"


def arm_field(arm, name):
    """The value of the model field `name` among a summary arm's `fields`: `model.<name>`, or
    `<name>` in summaries written before the model's fields moved into config.model."""
    fields = arm["fields"]
    return fields[f"model.{name}"] if f"model.{name}" in fields else fields[name]


def _accuracies(arm):
    return [run["accuracy"] for run in arm.get("runs", [])]


def _flops_text(flops):
    for unit, scale in (("PFLOPs", 1e15), ("TFLOPs", 1e12), ("GFLOPs", 1e9), ("MFLOPs", 1e6)):
        if flops >= scale:
            return f"{flops / scale:.2f} {unit}"
    return f"{flops:,} FLOPs"


def _rows(header, rows):
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(map(str, row)) + " |" for row in rows])


def position_table(arms):
    """Table 8's layout: a row per kind, a column per placement, N/A where no arm can be."""
    rows = []
    for kind, kind_label in POSITION_KINDS.items():
        row = [f"{kind_label} (`{kind}`)"]
        for placement in PLACEMENTS:
            if placement != "stem" and kind not in LEARNED_POSITION_EMBEDDINGS:
                row.append("N/A")
            else:
                row.append(accuracy_cell(_accuracies(arms.get(f"{kind}-{placement}", {}))))
        rows.append(row)
    header = ["Pos. Emb."] + [f"{label} (`{name}`)" for name, label in PLACEMENTS.items()]
    return _rows(header, rows)


def classifier_table(arms):
    rates = sorted({entry["learning_rate"] for arm in arms.values()
                    for entry in arm.get("sweep", [])})
    header = (["Classifier"] + [f"held-out, lr {rate:g}" for rate in rates]
              + ["picked lr", "test top-1 (%)"])
    rows = []
    for arm in arms.values():
        sweep = {entry["learning_rate"]: entry["accuracy"] for entry in arm.get("sweep", [])}
        picked = arm.get("learning_rate")
        cells = []
        for rate in rates:
            cell = "–" if rate not in sweep else f"{100 * sweep[rate]:.2f}"
            cells.append(f"**{cell}**" if rate == picked and rate in sweep else cell)
        rows.append([f"{arm['label']} (`{arm_field(arm, 'classifier')}`)", *cells,
                     "–" if picked is None else f"{picked:g}", accuracy_cell(_accuracies(arm))])
    return _rows(header, rows)


def model_table(arms, compute=False):
    """A row per arm: its model, size, cost and accuracy; `compute` adds steps and the training
    compute (images x forward FLOPs) that the hybrid study matches."""
    header = ["Model", "config.model", "parameters", "forward FLOPs / image"]
    if compute:
        header += ["steps", "images x forward FLOPs"]
    header.append("test top-1 (%)")
    rows = []
    for arm in arms.values():
        row = [arm["label"], f"`{arm['model']}`", f"{arm['params']:,}",
               _flops_text(arm["forward_flops"])]
        if compute:
            images = arm["steps"] * arm["batch_size"]
            row += [f"{arm['steps']:,}", _flops_text(images * arm["forward_flops"])]
        rows.append(row + [accuracy_cell(_accuracies(arm))])
    return _rows(header, rows)


def augreg_table(arms):
    """A row per AugReg level: its RandAugment and Mixup, the final losses (means over seeds)
    and the accuracy."""
    rows = []
    for arm in arms.values():
        layers, magnitude, alpha = augmentation.PRESETS[arm["fields"]["augment"]]
        rows.append([f"`{arm['fields']['augment']}`",
                     f"{layers} x {magnitude:g}" if layers else "–",
                     f"{alpha:g}" if alpha else "–", _mean_cell(arm, "train_loss"),
                     _mean_cell(arm, "eval_loss"), accuracy_cell(_accuracies(arm))])
    return _rows(["AugReg level", "RandAugment (layers x magnitude)", "Mixup alpha",
                  "final training loss", "test loss", "test top-1 (%)"], rows)


def _mean_cell(arm, name):
    values = [run[name] for run in arm.get("runs", []) if run.get(name) is not None]
    return f"{statistics.fmean(values):.3f}" if values else "–"


def fields_table(arms):
    """A row per arm: the config fields it sets, and the accuracy."""
    names = sorted({name for arm in arms.values() for name in arm["fields"]})
    rows = [[arm["label"], *(f"`{arm['fields'].get(name, '–')}`" for name in names),
             accuracy_cell(_accuracies(arm))] for arm in arms.values()]
    return _rows(["Arm", *(f"config.{name}" for name in names), "test top-1 (%)"], rows)


def table(summary):
    arms = summary["arms"]
    study = summary["study"]
    if study == "position_embedding":
        return position_table(arms)
    if study == "classifier":
        return classifier_table(arms)
    if study == "augreg":
        return augreg_table(arms)
    if study == "layer_decay":
        return fields_table(arms)
    return model_table(arms, compute=STUDIES[study].match_flops)


def _notes(summary):
    arms = summary["arms"]
    if summary["study"] == "classifier":
        train, held_out = summary["sweep_splits"]
        picks = "; ".join(f"{arm['label']}: lr {arm['learning_rate']:g}"
                          for arm in arms.values() if arm.get("learning_rate") is not None)
        return (f"Learning rates: each classifier was trained at every rate of the sweep "
                f"(seed {summary['seeds'][0]}) on `{train}` and scored on the held-out "
                f"`{held_out}` (the columns \"held-out\"); the best (bold) was then trained on "
                f"all of `{summary['train_split']}` at every seed and tested. Picked: {picks}.")
    if summary["study"] == "augreg":
        return ("Losses: the training loss is the last log line's, the mean over its steps' "
                "batches as trained (augmented, and with Mixup against mixed targets), so it "
                "is higher by construction where the augmentation is stronger; the test loss "
                "is on the plain test images.")
    if summary["study"] == "hybrid":
        return ("Matched compute: both arms see the same number of images x forward FLOPs "
                "per image (training costs about three forward passes for either): the "
                "costlier model trains for the budget's steps, the cheaper one for "
                "proportionally more. FLOPs are `keras_vit.analysis.flops.forward_flops` (a "
                "multiply-add is 2 FLOPs).")
    return ""


def report(summary):
    """The markdown report of a study: what it measures, the budget, the table, the command."""
    budget = summary["budget"]
    seeds = summary["seeds"]
    epochs = budget["steps"] * budget["batch_size"] / summary["train_examples"]
    more = " for the costlier model (see the table)" if STUDIES[summary["study"]].match_flops \
        else ""
    lines = [
        f"# Ablation: {STUDIES[summary['study']].title}",
        "",
        STUDIES[summary["study"]].question,
        "",
        f"- Budget of every run: {budget['steps']:,} steps{more} of batch "
        f"{budget['batch_size']} ({epochs:.2f} epochs of the {summary['train_examples']:,} "
        f"images of `{summary['train_split']}`), {budget['image_size']}x"
        f"{budget['image_size']} pixels.",
        f"- Base model: {budget['model']}.",
        f"- Training: {budget['optimizer']}.",
        f"- Data: `{summary['dataset']}`; every cell is the test top-1 accuracy (%) on all "
        f"{summary['eval_examples']:,} images of `{summary['eval_split']}`.",
        f"- Seeds: {len(seeds)} ({', '.join(map(str, seeds))}); cells are the mean ± the "
        "standard deviation over seeds.",
        "",
        table(summary),
        "",
        f"![{STUDIES[summary['study']].title}]({summary['study']}.png)",
        "",
    ]
    notes = _notes(summary)
    if notes:
        lines += [notes, ""]
    lines += [
        "Made by:",
        "",
        "```bash",
        summary["command"],
        "```",
        "",
        f"The runs (`config.json`, `metrics.jsonl`, `train.log`) are in "
        f"`runs/{summary['study']}/`, the numbers in `{summary['study']}.json`.",
        "",
    ]
    return "\n".join(lines)
