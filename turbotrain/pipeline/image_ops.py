"""Batched image operations on uint8 (n, 3, H, W) tensors, one parameter per image.

The ops of RandAugment, TrivialAugment, colour jitter and random erasing (after_decode.py),
written once for any device: each takes a uint8 batch and a per-image parameter tensor and
returns a new uint8 batch, so chained ops see uint8 images as PIL's do. Each image is computed
from its own pixels and parameters only, with element-wise arithmetic (no matmul, no
convolution, no reduction across images), so an image comes out the same whatever batch it is
in. Pixel rules follow PIL's ImageOps / ImageEnhance, which timm's ops call: a blend truncates
towards 0 after clipping to [0, 255]; greyscale is (299 R + 587 G + 114 B) / 1000 rounded.

`affine` replaces PIL's Image.transform(AFFINE): the caller gives, per image, the matrix from
output to input pixel coordinates; pixels are sampled bilinearly (timm picks bilinear or
bicubic at random; torchvision's TrivialAugmentWide nearest) and the area outside the image is
`fill` (timm's is the dataset mean).
"""
from __future__ import annotations

import torch
from torch.nn import functional as F

_WHITE = 255.0


def _per_image(values, x: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    """`values` (n,) as a (n, 1, 1, 1) tensor on x's device, to broadcast over an image."""
    return torch.as_tensor(values, dtype=dtype, device=x.device).view(-1, 1, 1, 1)


def _to_uint8(x: torch.Tensor) -> torch.Tensor:
    """Clip to [0, 255] and truncate (PIL's CLIP8 of an int conversion)."""
    return x.clamp_(0.0, _WHITE).to(torch.uint8)


def grey(x: torch.Tensor) -> torch.Tensor:
    """(n, 1, H, W) float greyscale of a uint8 batch: PIL's convert("L"), rounded."""
    r, g, b = x.float().unbind(1)
    return torch.floor((r * 299 + g * 587 + b * 114) / 1000 + 0.5).unsqueeze(1)


def blend(x: torch.Tensor, degenerate: torch.Tensor, factor) -> torch.Tensor:
    """PIL's Image.blend(degenerate, x, factor): degenerate + factor * (x - degenerate)."""
    f = _per_image(factor, x)
    return _to_uint8(degenerate + f * (x.float() - degenerate))


def brightness(x: torch.Tensor, factor) -> torch.Tensor:
    return _to_uint8(x.float() * _per_image(factor, x))


def color(x: torch.Tensor, factor) -> torch.Tensor:
    """Saturation: blended with the image's greyscale."""
    return blend(x, grey(x), factor)


def contrast(x: torch.Tensor, factor) -> torch.Tensor:
    """Blended with the image's mean grey level (PIL: a constant image at int(mean + 0.5))."""
    mean = torch.floor(grey(x).mean(dim=(1, 2, 3), keepdim=True) + 0.5)
    return blend(x, mean, factor)


def sharpness(x: torch.Tensor, factor) -> torch.Tensor:
    """Blended with PIL's SMOOTH filter ([[1,1,1],[1,5,1],[1,1,1]] / 13, rounded); the border
    pixels keep their values (as PIL's and torchvision's), by nine shifted additions."""
    height, width = x.shape[-2:]
    if height < 3 or width < 3:
        return x.clone()
    v = x.float()
    total = 4 * v[..., 1:-1, 1:-1]
    for dy in range(3):
        for dx in range(3):
            total = total + v[..., dy:height - 2 + dy, dx:width - 2 + dx]
    smooth = v.clone()
    smooth[..., 1:-1, 1:-1] = torch.floor(total / 13 + 0.5)
    return blend(x, smooth, factor)


def invert(x: torch.Tensor) -> torch.Tensor:
    return 255 - x


def posterize(x: torch.Tensor, bits) -> torch.Tensor:
    """Keep the `bits` (0..8) most significant bits of every channel."""
    keep = torch.as_tensor(bits, device=x.device).to(torch.int32).clamp(0, 8)
    mask = ((0xFF << (8 - keep)) & 0xFF).to(torch.uint8).view(-1, 1, 1, 1)
    return x & mask


def solarize(x: torch.Tensor, threshold) -> torch.Tensor:
    """Invert the pixels >= threshold (256: none)."""
    t = _per_image(threshold, x)
    return torch.where(x.float() >= t, 255 - x, x)


def solarize_add(x: torch.Tensor, add, threshold: int = 128) -> torch.Tensor:
    """Add `add` to the pixels below threshold, saturating at 255 (timm's SolarizeAdd)."""
    raised = _to_uint8(x.float() + _per_image(add, x))
    return torch.where(x < threshold, raised, x)


def auto_contrast(x: torch.Tensor) -> torch.Tensor:
    """Each channel stretched so its darkest pixel is 0 and its brightest 255 (unchanged when
    it is flat)."""
    v = x.float()
    lo = v.amin(dim=(2, 3), keepdim=True)
    hi = v.amax(dim=(2, 3), keepdim=True)
    scale = _WHITE / (hi - lo).clamp(min=1.0)
    stretched = _to_uint8((v - lo) * scale)
    return torch.where(hi > lo, stretched, x)


def equalize(x: torch.Tensor) -> torch.Tensor:
    """PIL's ImageOps.equalize per channel: the cumulative histogram as a lookup table, with
    the last used level's count left out; a channel with one level stays as it is. Integer
    arithmetic throughout."""
    n, channels, height, width = x.shape
    flat = x.reshape(n * channels, height * width).long()
    hist = torch.zeros(n * channels, 256, dtype=torch.long, device=x.device)
    hist.scatter_add_(1, flat, torch.ones_like(flat))
    last = flat.amax(dim=1, keepdim=True)
    step = (height * width - hist.gather(1, last)) // 255
    below = torch.cumsum(hist, dim=1) - hist  # pixels below each level
    lut = ((step // 2 + below) // step.clamp(min=1)).clamp_(max=255)
    lut = torch.where(step > 0, lut, torch.arange(256, device=x.device).expand_as(lut))
    return lut.gather(1, flat).to(torch.uint8).view(n, channels, height, width)


def affine(x: torch.Tensor, matrices: torch.Tensor, fill: torch.Tensor) -> torch.Tensor:
    """Each image resampled through its (2, 3) matrix, which maps an output pixel's centre
    (x + 0.5, y + 0.5) to input coordinates (PIL's AFFINE data); `fill` (3,) outside."""
    n, _, height, width = x.shape
    m = matrices.to(device=x.device, dtype=torch.float32).view(n, 6, 1, 1)
    ys = (torch.arange(height, device=x.device, dtype=torch.float32) + 0.5).view(1, height, 1)
    xs = (torch.arange(width, device=x.device, dtype=torch.float32) + 0.5).view(1, 1, width)
    u = m[:, 0] * xs + m[:, 1] * ys + m[:, 2]
    v = m[:, 3] * xs + m[:, 4] * ys + m[:, 5]
    # grid_sample's align_corners=False puts -1 and +1 at the image's outer edges.
    grid = torch.stack((u * (2.0 / width) - 1.0, v * (2.0 / height) - 1.0), dim=-1)
    shift = fill.to(device=x.device, dtype=torch.float32).view(1, 3, 1, 1)
    # Sampled around the fill with zero padding: outside pixels become exactly `fill`.
    moved = F.grid_sample(x.float() - shift, grid, mode="bilinear", padding_mode="zeros",
                          align_corners=False)
    return _to_uint8(torch.floor(moved + shift + 0.5))


def erase(x: torch.Tensor, boxes: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """Pixels inside any of an image's boxes replaced by `values` ((n, 3, H, W) or
    broadcastable, already uint8). boxes: int (n, K, 4) rows of (top, left, height, width); a
    box of height 0 erases nothing."""
    n, _, height, width = x.shape
    b = boxes.to(device=x.device, dtype=torch.int64)
    ys = torch.arange(height, device=x.device).view(1, 1, height, 1)
    xs = torch.arange(width, device=x.device).view(1, 1, 1, width)
    top, left = b[..., 0, None, None], b[..., 1, None, None]
    inside = ((ys >= top) & (ys < top + b[..., 2, None, None])
              & (xs >= left) & (xs < left + b[..., 3, None, None]))
    mask = inside.any(dim=1, keepdim=True)  # (n, 1, H, W)
    return torch.where(mask, values, x)
