"""The padding of a transformers batch, read from its attention mask: what masskv's attention
(masskv.hf, CPU tensors; masskv.hf_cuda, CUDA tensors) appends of a prefill chunk."""

from __future__ import annotations

__all__ = ["real_counts"]


def real_counts(mask, B: int, T: int, S: int) -> list[int] | None:
    """How many of the last T of the S key columns of each batch row are tokens rather than
    padding, read from transformers' attention mask (4D [B, 1, T', S'] boolean or additive, or
    2D [B, S']); None when every column is a token. Only left padding is served: a row's
    tokens must be its last columns (ValueError otherwise). Reads the mask on the host."""
    if mask is None:
        return None
    import torch

    if mask.dim() == 4:
        m = mask[:, 0, -1, -S:]  # the last query row sees every key column but the padding
        visible = m if m.dtype == torch.bool else m == 0
    elif mask.dim() == 2:
        visible = mask[:, -S:] != 0
    else:
        raise ValueError(f"masskv attention: an attention mask of {mask.dim()} dimensions")
    visible = visible.expand(B, S).cpu()
    if bool(visible.all()):
        return None
    n = visible.sum(1)
    if not torch.equal(visible, torch.arange(S)[None, :] >= S - n[:, None]):
        raise ValueError("masskv attention: a padded batch must be padded on the left (a row's "
                         "tokens are its last columns; tokenizer.padding_side='left'), and "
                         "no column masked inside a row")
    return n.clamp(max=T).tolist()
