"""A group of chunks' (centre, context) pairs from its tokens' sentences and dynamic windows: skip-gram's
masks (`Chunk.masks`) and CBOW's two bands (`Chunk.band`, `Chunk.band_t`), for `word2vec_chunks.epoch_chunks`.
A leaf module."""

from __future__ import annotations

import functools

import numpy as np


@functools.lru_cache(maxsize=None)
def _cbow_windows(W: int) -> tuple[np.ndarray, np.ndarray]:
    """((W+1)^2, 2W+1) float32 tables, row l * (W+1) + r: the window reaching l words left and r right,
    as 0/1 over the offsets -W..W (not 0), and as the weights of its mean (1 / (l + r) each)."""
    reach = np.arange(W + 1)
    d = np.arange(-W, W + 1)
    left, right = np.repeat(reach, W + 1), np.tile(reach, W + 1)
    shapes = ((d >= -left[:, None]) & (d <= right[:, None]) & (d != 0)).astype(np.float32)
    return shapes, shapes / np.maximum(left + right, 1)[:, None].astype(np.float32)


def skipgram_masks(
    seg: np.ndarray, e: np.ndarray, owned: np.ndarray, W: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Skip-gram's pairs of B chunks of C tokens (`Chunk.masks`), and the pairs each token is in as
    context and as centre: masks (B, C, W, 2), n_context (B, C), n_centre (B, C), float32."""
    B, C = seg.shape
    masks = np.zeros((B, C, W, 2), dtype=np.float32)  # 0/1 in the workers' dtype: no conversion per chunk
    n_context = np.zeros((B, C), dtype=np.float32)
    n_centre = np.zeros((B, C), dtype=np.float32)
    for o in range(1, W + 1):
        same = seg[:, o:] == seg[:, :-o]
        right = same & (e[:, :-o] >= o) & owned[:, :-o]  # centre i, context i+o
        left = same & (e[:, o:] >= o) & owned[:, o:]  # centre i+o, context i
        masks[:, :-o, o - 1, 0] = right
        masks[:, :-o, o - 1, 1] = left
        n_context[:, o:] += right
        n_context[:, :-o] += left
        n_centre[:, :-o] += right
        n_centre[:, o:] += left
    return masks, n_context, n_centre


def cbow_bands(
    seg: np.ndarray, e: np.ndarray, owned: np.ndarray, W: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """CBOW's windows of B chunks of C tokens as the two bands (`Chunk.band`, `Chunk.band_t`), and the
    centres holding each token and the contexts of each centre: band, band_t, n_context, n_centre."""
    B, C = seg.shape
    # CBOW: a centre's window is a run of its sentence, reach_l words left and reach_r right
    # (0 for a centre the chunk does not own); the bands are looked up by (reach_l, reach_r)
    at = np.arange(C)
    starts = np.ones((B, C), dtype=bool)
    starts[:, 1:] = seg[:, 1:] != seg[:, :-1]
    ends = np.ones((B, C), dtype=bool)
    ends[:, :-1] = starts[:, 1:]
    left = at - np.maximum.accumulate(np.where(starts, at, 0), axis=1)  # same-sentence words to the left
    right = np.minimum.accumulate(np.where(ends, at, C)[:, ::-1], axis=1)[:, ::-1] - at
    reach_l = np.where(owned, np.minimum(left, e), 0)
    reach_r = np.where(owned, np.minimum(right, e), 0)
    code = reach_l * (W + 1) + reach_r  # (B, C) in 0 .. (W+1)^2 - 1
    shapes, weights = _cbow_windows(W)
    n_centre = (reach_l + reach_r).astype(np.float32)
    band = np.take(weights, code[:, W : C - W, None], axis=0)  # (B, C - 2W, 1, 2W+1) the owned centres' means
    # [j, k]: whether centre j + k - W (row j + k of `around`) holds context j (its column 2W - k)
    around = np.empty((B, C + 2 * W, 2 * W + 1), dtype=np.float32)
    around[:, :W] = around[:, C + W :] = 0  # no centres past the chunk
    np.take(shapes, code, axis=0, out=around[:, W : C + W], mode="clip")  # (codes are in range)
    sb, sr, sc = around.strides
    band_t = np.ascontiguousarray(
        np.lib.stride_tricks.as_strided(around[:, :, None, 2 * W :], (B, C, 1, 2 * W + 1), (sb, sr, 0, sr - sc))
    )
    n_context = band_t[:, :, 0] @ np.ones(2 * W + 1, dtype=np.float32)  # (B, C) centres holding each token
    return band, band_t, n_context, n_centre
