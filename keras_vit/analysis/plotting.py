"""PNG figures of the `keras_vit.analysis` results and of ablation studies
(`train.studies.ablate`), titled and labelled to be read without code.

Each function takes the arrays an analysis function returns and a path (local or gs://), and
writes the figure atomically (a crash mid-write leaves any previous file). Needs matplotlib:
`pip install 'keras_vit[analysis]'`.
"""

import io
import math

import numpy as np

from keras_vit import analysis, fileio

DPI = 100


def _figure(width, height):
    try:
        from matplotlib.figure import Figure
    except ImportError as error:
        raise ImportError("keras_vit.analysis.plotting draws with matplotlib: "
                          "pip install 'keras_vit[analysis]' (or matplotlib).") from error
    return Figure(figsize=(width, height), dpi=DPI, layout="constrained")


def _save(figure, path):
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=DPI)
    return fileio.write_atomically(path, buffer.getvalue())


def _tile_grid(count):
    columns = math.ceil(math.sqrt(count))
    return math.ceil(count / columns), columns


def plot_rollout(images, rollout, path, captions=None):
    """Each image (top row) above its attention-rollout overlay (bottom row).

    `images` uint8 `[N, height, width, 3 or 1]`, `rollout` `[N, rows, columns]`, optional
    `captions` (e.g. the predicted class) under each column.
    """
    images = np.asarray(images)
    overlays = analysis.overlay(images, rollout)
    count = len(overlays)
    figure = _figure(1.6 * count + 0.6, 3.9)
    axes = figure.subplots(2, count, squeeze=False)
    for index in range(count):
        top, bottom = axes[0, index], axes[1, index]
        image = images[index]
        top.imshow(image[..., 0] if image.ndim == 3 and image.shape[-1] == 1 else image,
                   cmap="gray", interpolation="nearest", vmin=0, vmax=255)
        bottom.imshow(overlays[index], interpolation="nearest")
        if captions is not None:
            bottom.set_xlabel(str(captions[index]), fontsize=9)
        for axis in (top, bottom):
            axis.set_xticks([])
            axis.set_yticks([])
    axes[0, 0].set_ylabel("input")
    axes[1, 0].set_ylabel("attention")
    figure.suptitle("Attention rollout: the patches the model's output draws on (bright = more)")
    return _save(figure, path)


def plot_attention_distance(distance, path, image_size=None):
    """The paper's figure 7 (right): each head's mean attention distance against depth.

    `distance` `[layers, heads]` in pixels; `image_size` (height, width) sets the y-axis to
    the image's diagonal, the largest distance possible.
    """
    distance = np.asarray(distance)
    layers, heads = distance.shape
    figure = _figure(6.0, 4.2)
    axis = figure.subplots()
    from matplotlib import colormaps

    colours = [colormaps["viridis"](head / max(heads - 1, 1)) for head in range(heads)]
    depth = np.arange(1, layers + 1)
    for head in range(heads):
        axis.scatter(depth, distance[:, head], s=22, color=colours[head], label=f"head {head}")
    axis.plot(depth, distance.mean(axis=1), color="black", linewidth=1, label="mean of heads")
    axis.set_xlabel("network depth (encoder block)")
    axis.set_ylabel("mean attention distance (pixels)")
    axis.set_xticks(depth)
    if image_size is not None:
        axis.set_ylim(0, math.hypot(*image_size))
    else:
        axis.set_ylim(bottom=0)
    axis.set_title("Mean attention distance per head (paper fig. 7, right)")
    if heads <= 16:
        axis.legend(fontsize=7, ncol=2, loc="lower right")
    axis.grid(alpha=0.3)
    return _save(figure, path)


def plot_position_similarity(similarity, path):
    """The paper's figure 7 (centre): for each patch position (tile at its row and column),
    the cosine similarity of its position embedding with every other position."""
    similarity = np.asarray(similarity)
    rows, columns = similarity.shape[1:]
    size = min(0.75 * max(rows, columns), 9.0)
    figure = _figure(size * columns / max(rows, columns) + 1.2, size * rows / max(rows, columns)
                     + 0.8)
    axes = figure.subplots(rows, columns, squeeze=False)
    image = None
    for index in range(rows * columns):
        axis = axes[index // columns, index % columns]
        image = axis.imshow(similarity[index], vmin=-1, vmax=1, cmap="viridis",
                            interpolation="nearest")
        axis.set_xticks([])
        axis.set_yticks([])
    for row in range(rows):
        axes[row, 0].set_ylabel(str(row + 1), rotation=0, labelpad=8, fontsize=8)
    for column in range(columns):
        axes[rows - 1, column].set_xlabel(str(column + 1), fontsize=8)
    figure.supxlabel("input patch column")
    figure.supylabel("input patch row")
    figure.colorbar(image, ax=axes, shrink=0.6, label="cosine similarity")
    figure.suptitle("Position embedding similarity (paper fig. 7, centre)")
    return _save(figure, path)


def plot_embedding_filters(components, path, title=None):
    """The paper's figure 7 (left): principal components of the pixel filters as RGB tiles,
    each scaled to its own range; `components` `[n, kh, kw, channels]`."""
    components = np.asarray(components, np.float64)
    count, height, width = components.shape[:3]
    rows, columns = _tile_grid(count)
    figure = _figure(1.0 * columns + 0.4, 1.0 * rows + 0.7)
    axes = figure.subplots(rows, columns, squeeze=False)
    for index, axis in enumerate(axes.ravel()):
        axis.set_axis_off()
        if index >= count:
            continue
        tile = components[index]
        tile = (tile - tile.min()) / max(tile.max() - tile.min(), 1e-12)
        axis.imshow(tile if tile.shape[-1] == 3 else tile[..., 0], cmap="gray",
                    interpolation="nearest")
        axis.set_title(str(index + 1), fontsize=7)
    figure.suptitle(title or f"RGB embedding filters: first {count} principal components "
                    f"({height}x{width})")
    return _save(figure, path)


def plot_few_shot(accuracies, path, title=None):
    """Few-shot linear accuracy against the number of training examples per class;
    `accuracies` is `{k: accuracy}` from `analysis.few_shot_accuracy`."""
    shots = sorted(accuracies)
    values = [100.0 * accuracies[k] for k in shots]
    figure = _figure(5.0, 3.6)
    axis = figure.subplots()
    axis.plot(shots, values, marker="o")
    for k, value in zip(shots, values):
        axis.annotate(f"{value:.1f}%", (k, value), textcoords="offset points", xytext=(0, 6),
                      ha="center", fontsize=8)
    axis.set_xscale("log")
    axis.set_xticks(shots)
    axis.set_xticklabels([str(k) for k in shots])
    axis.set_xlabel("training examples per class (k)")
    axis.set_ylabel("test accuracy (%)")
    axis.set_ylim(0, 105)
    axis.set_title(title or "Few-shot linear accuracy\nof the frozen representation")
    axis.grid(alpha=0.3)
    return _save(figure, path)


def plot_ablation(labels, accuracies, path, title=None):
    """Test accuracy of each arm of an ablation study: the mean over seeds with a bar of one
    standard deviation either way, and every seed's value as a dot.

    `labels` names the arms (the x axis); `accuracies` holds one sequence of per-seed
    accuracies in [0, 1] for each arm.
    """
    values = [100.0 * np.asarray(seeds, np.float64) for seeds in accuracies]
    means = [float(seeds.mean()) for seeds in values]
    stds = [float(seeds.std(ddof=1)) if len(seeds) > 1 else 0.0 for seeds in values]
    figure = _figure(max(4.5, 1.1 * len(labels) + 1.5), 4.2)
    axis = figure.subplots()
    positions = np.arange(len(labels))
    for position, seeds in zip(positions, values):
        axis.scatter(np.full(len(seeds), position), seeds, s=14, color="0.6", zorder=2,
                     label="one seed" if position == 0 else None)
    axis.errorbar(positions, means, yerr=stds, fmt="o", color="C0", capsize=5, zorder=3,
                  label="mean ± std over seeds")
    for position, mean in zip(positions, means):
        axis.annotate(f"{mean:.2f}", (position, mean), textcoords="offset points",
                      xytext=(8, -3), fontsize=8)
    axis.set_xticks(positions)
    axis.set_xticklabels(labels, fontsize=8)
    axis.set_xlim(-0.6, len(labels) - 0.4)
    axis.set_ylabel("test top-1 accuracy (%)")
    axis.set_title(title or "Ablation")
    axis.legend(fontsize=8, loc="best")  # where it covers the fewest arms' points
    axis.grid(axis="y", alpha=0.3)
    return _save(figure, path)
