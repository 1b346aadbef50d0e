"""The base model and budget of the ablation studies: a small plain ViT on the real
Fashion-MNIST, trained for a short fixed budget (one final evaluation on all 10,000 test images).

    python -m train.studies.ablate --study=position_embedding --out=docs/ablations

4x4-pixel patches of the 28x28 images give a 7x7 grid (49 tokens, plus the class token), the
same grid as the quickstart's hybrid. The studies (train/studies/ablations.py) change the
position embeddings, the classifier and its learning rate, the stem (R+Ti/16 with 1x1 patches of
its stride-4 feature map) or the attention (Axial-Ti/16); every size below stays, so each arm
differs from this model in what its study names only. `train.studies.ablate` also sets the seed, and
`total_steps` from `--steps` with the warm-up kept at the same fraction of the run.
"""

from . import common


def get_config():
    config = common.get_config()
    config.model.variant = "Ti/16"  # a plain ViT: the sizes below replace all of Ti/16's
    config.image_size = 28
    config.model.patch_size = 4
    config.model.hidden_size = 64
    config.model.mlp_dim = 128
    config.model.num_heads = 4
    config.model.num_layers = 4
    config.dataset = "fashion_mnist_local"
    config.crop_min_area = 1.0  # 28px centred items: flips only, no crops
    # Not the whole split (60,000): a buffer that large made each run's process take about
    # 18 s longer to exit after its final evaluation, a third of a run here.
    config.shuffle_buffer = 10_000
    config.optimizer = "adamw"
    config.learning_rate = 3e-3
    config.weight_decay = 0.05
    config.batch_size = 128
    config.eval_batch_size = 1000
    config.total_steps = 250  # 32,000 images, 0.53 epochs: 52 s per run on 2 Xeon cores
    config.warmup_steps = 25
    config.steps_per_loop = 100
    config.eval_every_steps = 1_000_000  # only the final evaluation, at total_steps
    config.checkpoint_every_steps = 100  # a killed study resumes its unfinished run from here
    config.keep_checkpoints = 1  # runs are short: one checkpoint each is enough to resume
    config.export = False
    return config
